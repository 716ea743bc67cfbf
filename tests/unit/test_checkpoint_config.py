"""The snapshot settings of a job: parsed from the job config and from ``cann-train train``'s flags, with
bad values named by field."""

from __future__ import annotations

import argparse

import pytest

from workers.training.cli import build_job_config, register
from workers.training.config import ConfigError, JobConfig
from workers.training.examples import DIR, example


def config(**extra) -> JobConfig:
    return JobConfig.from_dict({"model": example("tiny-dense.json"), **extra})


def test_snapshots_are_off_by_default():
    cfg = config()
    assert (cfg.snapshot_every, cfg.resume, cfg.snapshot_dir) == (0, False, None)
    assert (cfg.snapshot_full_every, cfg.snapshot_keep, cfg.snapshot_delta) == (4, 3, "xor")


def test_snapshot_settings_round_trip_through_the_job_file(tmp_path):
    cfg = config(
        snapshot_every=3,
        snapshot_dir=str(tmp_path),
        snapshot_full_every=2,
        snapshot_keep=4,
        resume=True,
        snapshot_delta="log",
    )
    cfg.save(tmp_path / "job.json")
    again = JobConfig.load(tmp_path / "job.json")
    assert again.snapshot_delta == "log"
    assert (again.snapshot_every, again.snapshot_dir, again.snapshot_full_every, again.snapshot_keep) == (
        3,
        str(tmp_path),
        2,
        4,
    )
    assert again.resume is True


@pytest.mark.parametrize(
    "extra, field, message",
    [
        ({"snapshot_every": 5}, "snapshot_dir", "is required with snapshot_every, resume or resume_from"),
        ({"resume": True}, "snapshot_dir", "is required"),
        ({"snapshot_every": -1, "snapshot_dir": "x"}, "snapshot_every", ">= 0"),
        ({"snapshot_full_every": 0}, "snapshot_full_every", ">= 1"),
        ({"snapshot_keep": 0}, "snapshot_keep", ">= 1"),
        ({"resume": "yes", "snapshot_dir": "x"}, "resume", "true or false"),
        ({"snapshot_dir": 3}, "snapshot_dir", "must be a path"),
        ({"snapshot_delta": "zstd"}, "snapshot_delta", "must be one of xor, log, got 'zstd'"),
        # a log holds one gradient per step since the previous snapshot: more than a full one beyond 3
        (
            {"snapshot_delta": "log", "snapshot_every": 4, "snapshot_dir": "x"},
            "snapshot_every",
            "must be at most 3 with snapshot_delta log, got 4",
        ),
    ],
)
def test_bad_snapshot_settings_name_the_field(extra, field, message):
    with pytest.raises(ConfigError, match=message) as err:
        config(**extra)
    assert err.value.field == field


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(
        ["train", "--model", str(DIR / "tiny-dense.json"), "--strategy", str(DIR / "dp2.json"), *argv]
    )


def test_train_flags_set_the_snapshot_fields(tmp_path):
    cfg = build_job_config(
        parse(
            [
                "--snapshot-every",
                "7",
                "--snapshot-dir",
                str(tmp_path),
                "--snapshot-full-every",
                "3",
                "--snapshot-keep",
                "2",
                "--resume",
            ]
        )
    )
    assert (cfg.snapshot_every, cfg.snapshot_dir, cfg.snapshot_full_every, cfg.snapshot_keep, cfg.resume) == (
        7,
        str(tmp_path),
        3,
        2,
        True,
    )
    assert build_job_config(parse([])).snapshot_every == 0
    assert build_job_config(parse(["--snapshot-delta", "log"])).snapshot_delta == "log"


def test_resume_flag_without_a_directory_is_invalid_input():
    with pytest.raises(ConfigError, match="snapshot_dir"):
        build_job_config(parse(["--resume"]))
