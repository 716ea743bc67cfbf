"""`cann-train strategy`: output contract, exit codes and messages."""

import json

from workers.cli import main
from workers.planner.examples import CONTRACTS  # noqa: E402 - vendored copies of shared/contracts


def args(model="model.json", cluster="cluster.json", training="training.json", *extra):
    return [
        "strategy",
        "--model",
        str(CONTRACTS / model),
        "--cluster",
        str(CONTRACTS / cluster),
        "--training",
        str(CONTRACTS / training),
        *extra,
    ]


def write(tmp_path, name, data):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(p)


def test_json_output_has_the_documented_shape(capsys, tmp_path):
    fixed = write(tmp_path, "s.json", {"tp": 8, "pp": 8, "recompute": "full"})
    assert (
        main(
            args(
                "model.json",
                "cluster.json",
                "training.json",
                "--strategy",
                fixed,
                "--top",
                "3",
                "--json",
                "--auto-search",
                "--topology-aware",
                "--moe-balancing",
            )
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"best", "top", "pareto", "search"}
    assert len(out["top"]) == 3 and out["best"] == out["top"][0]
    assert out["best"]["strategy"]["tp"] == 8 and out["best"]["strategy"]["recompute"] == "full"
    assert {"evaluated", "feasible", "rejected", "seconds"} <= set(out["search"])


def test_human_output_is_a_table_with_the_breakdown(capsys):
    assert main(args("model.json", "cluster.json", "training.json", "--top", "2")) == 0
    out = capsys.readouterr().out
    assert "step s" in out and "tokens/s" in out and "best plan breakdown" in out
    assert "memory/device GiB" in out and "comm s: tp" in out


def test_invalid_field_exits_2_naming_it(capsys, tmp_path):
    model = json.loads((CONTRACTS / "model.json").read_text())
    model["hidden_size"] = "big"
    path = write(tmp_path, "m.json", model)
    assert (
        main(
            [
                "strategy",
                "--model",
                path,
                "--cluster",
                str(CONTRACTS / "cluster.json"),
                "--training",
                str(CONTRACTS / "training.json"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "model.hidden_size" in err and "must be an integer" in err


def test_broken_json_and_missing_file_exit_2(capsys, tmp_path):
    bad = write(tmp_path, "t.json", "{not json")
    assert (
        main(
            [
                "strategy",
                "--model",
                str(CONTRACTS / "model.json"),
                "--cluster",
                str(CONTRACTS / "cluster.json"),
                "--training",
                bad,
            ]
        )
        == 2
    )
    assert "--training" in capsys.readouterr().err
    assert (
        main(["strategy", "--model", str(tmp_path / "nope.json"), "--cluster", "x", "--training", "y"]) == 2
    )
    assert "--model" in capsys.readouterr().err


def test_invalid_fixed_layout_exits_2(capsys, tmp_path):
    s = write(
        tmp_path,
        "s.json",
        {
            "tp": 8,
            "pp": 8,
            "dp": 64,  # 4096 devices: more than the cluster's 3072
            "ep": 1,
            "cp": 1,
            "vpp": 1,
            "micro_batch_size": 1,
            "recompute": "full",
            "zero_stage": 1,
            "sequence_parallel": True,
        },
    )
    assert main(args("model.json", "cluster.json", "training.json", "--strategy", s)) == 2
    assert "strategy.dp" in capsys.readouterr().err


def test_nothing_fits_exits_3_naming_the_tightest_constraint(capsys, tmp_path):
    cluster = json.loads((CONTRACTS / "cluster.json").read_text())
    cluster["num_nodes"] = 2
    path = write(tmp_path, "c.json", cluster)
    assert (
        main(
            [
                "strategy",
                "--model",
                str(CONTRACTS / "model.json"),
                "--cluster",
                path,
                "--training",
                str(CONTRACTS / "training.json"),
            ]
        )
        == 3
    )
    err = capsys.readouterr().err
    assert "needs ≥" in err and "GiB per device" in err and "add nodes" in err
