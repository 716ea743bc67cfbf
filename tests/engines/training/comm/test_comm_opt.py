"""The comm hooks inside the training runtime, and ``cann-train comm-opt`` end to end.

- the trainer registers the job's hook on the data-parallel group, reports the hook's figures in its
  ``train`` events, sizes DDP buckets from the job's link, and its ``state_dict()`` carries the
  error-feedback state: 2 steps + resume from the snapshot + 2 steps == 4 uninterrupted steps, bit for bit;
- ``comm-opt`` on the emulated network (root + iproute2, else skipped) with a tiny model and a few steps.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest
import torch

from tests.engines.ranks import spawn_ranks
from tests.engines.training.harness import EXAMPLES
from workers.training.comm import HOOKS, netem
from workers.training.comm_methods import HOOK_NAMES
from workers.training.config import ConfigError, JobConfig
from workers.training.parallelize import resolve_bucket_cap_mb

pytestmark = pytest.mark.slow

TINY = json.loads((EXAMPLES / "comm-tiny.json").read_text())
HOOK = "topk_ef:density=0.05"
BUCKET_CAP_MB = 0.05  # several buckets for a 0.1M-parameter model


def _job(**extra) -> JobConfig:
    return JobConfig.from_dict(
        {
            "model": TINY,
            "strategy": {"dp": 2, "micro_batch_size": 2},
            "training": {"global_batch_size": 4},
            "steps": 4,
            "device": "cpu",
            **extra,
        }
    )


def test_config_knows_every_registered_hook_and_rejects_unknown_ones():
    assert set(HOOK_NAMES) == set(HOOKS)
    assert _job(comm_hook="topk_ef:density=0.01,warmup_steps=5").comm_hook.startswith("topk_ef")
    with pytest.raises(ConfigError, match="comm_hook"):
        _job(comm_hook="gzip")
    with pytest.raises(ConfigError, match="bucket_cap_mb"):
        _job(bucket_cap_mb=0)


def test_bucket_size_comes_from_the_link_unless_given():
    assert resolve_bucket_cap_mb(_job()) is None  # DDP's default
    assert resolve_bucket_cap_mb(_job(bucket_cap_mb=3.5)) == 3.5
    big = {**TINY, "num_layers": 6, "hidden_size": 512, "ffn_hidden_size": 1536, "num_attention_heads": 8}
    slow = _job(model=big, inter_node_GBps=0.125)  # 1 Gbit/s: 83 MB of grads -> ~4 buckets
    assert 15 <= resolve_bucket_cap_mb(slow) <= 25
    # a long link: the latency floor W * latency * B / 0.1 = 2 * 200 us * 12.5 GB/s / 0.1 = 50 MB wins
    far = _job(model=big, inter_node_GBps=12.5, inter_node_latency_us=200)
    assert resolve_bucket_cap_mb(far) == pytest.approx(50.0)


def _resume_scenario(rank: int, world: int) -> dict:
    from workers.training.trainer import Trainer

    cfg = _job(comm_hook=HOOK, bucket_cap_mb=BUCKET_CAP_MB)

    def steps(trainer, n):
        return [trainer.train_step(*trainer.loader.next_batch()) for _ in range(n)]

    def params(trainer):
        return torch.cat([p.detach().reshape(-1) for p in trainer.pm.parameters()])

    res = {}
    full = Trainer(cfg, rank=rank, world_size=2)
    results = steps(full, 4)
    res["full"] = params(full)
    results[-1].step_time_s = 0.1  # train() times the step; here only the comm figures matter
    res["values"] = full._train_values(results[-1], 0.0)
    ddp = full.pm.parts[0]
    res["bucket_bytes_cap"] = ddp.bucket_bytes_cap
    res["hook_on_dp_group"] = full.pm.comm_states[0].process_group is ddp.process_group

    first = Trainer(cfg, rank=rank, world_size=2)
    steps(first, 2)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)  # as a checkpoint would
    snapshot = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
    res["residuals"] = snapshot["comm_hook"][0]["residuals"]
    res["hook_step"] = snapshot["comm_hook"][0]["step"]

    resumed = Trainer(cfg, rank=rank, world_size=2)
    resumed.load_state_dict(snapshot)
    steps(resumed, 2)
    res["resumed"] = params(resumed)

    fresh_hook = Trainer(cfg, rank=rank, world_size=2)  # same snapshot, error feedback dropped
    fresh_hook.load_state_dict({**snapshot, "comm_hook": [{"step": 2, "residuals": {}}]})
    steps(fresh_hook, 2)
    res["without_residuals"] = params(fresh_hook)
    for t in (full, first, resumed, fresh_hook):
        for st in t.pm.comm_states:
            getattr(st, "close", lambda: None)()
    full.close()
    return res


@pytest.fixture(scope="module")
def resume_run():
    return spawn_ranks(_resume_scenario, 2, group=False)  # the Trainer makes the group


def test_hook_state_round_trips_through_the_trainer_state_dict(resume_run):
    for r in resume_run:
        assert r["hook_step"] == 2
        assert r["residuals"] and sum(float(v.norm()) for v in r["residuals"].values()) > 0
        assert torch.equal(r["resumed"], r["full"])  # bit for bit
        assert not torch.equal(r["without_residuals"], r["full"])  # the residuals matter
    assert torch.equal(resume_run[0]["full"], resume_run[1]["full"])


def test_trainer_registers_the_hook_on_the_dp_group_with_the_jobs_bucket_size(resume_run):
    r = resume_run[0]
    assert r["hook_on_dp_group"]
    assert r["bucket_bytes_cap"] == int(BUCKET_CAP_MB * 1024 * 1024)


def test_train_events_carry_the_hooks_comm_figures(resume_run):
    values = resume_run[0]["values"]
    assert values["comm_s_total"] > 0 and 0 <= values["comm_s_exposed"] <= values["comm_s_total"] + 1e-3
    dense_bytes = 4 * resume_run[0]["full"].numel()  # the fp32 gradient of the model
    assert 0 < values["comm_bytes"] < dense_bytes / 5  # 5 % density, 6 bytes per entry


@pytest.mark.long
@pytest.mark.skipif(bool(netem.unavailable_reason()), reason=netem.unavailable_reason() or "ok")
def test_comm_opt_compares_methods_on_the_emulated_network():
    from workers.cli import main

    ours = f"ct-{os.getpid()}-"  # comm-opt runs in this process: its namespaces carry our pid
    before = {n for n in netem.list_namespaces() if n.startswith(ours)}
    out = io.StringIO()
    argv = ["comm-opt", "--model", str(EXAMPLES / "comm-tiny.json"), "--steps", "3"]
    with contextlib.redirect_stdout(out):
        rc = main([*argv, "--methods", "dense,topk_ef", "--timeout", "120", "--json"])
    assert rc == 0
    doc = json.loads(out.getvalue())
    dense, topk = doc["methods"]["dense"], doc["methods"]["topk_ef"]
    for row in (dense, topk):
        for key in (
            "bytes_per_rank_per_step",
            "comm_s_total",
            "comm_s_exposed",
            "step_time_s",
            "tokens_per_s",
        ):
            assert row[key] > 0, key
        assert 0 < row["loss_last"] < 6
    assert dense["bytes_per_rank_per_step"] == 4 * doc["model"]["params"]
    assert topk["bytes_reduction_vs_dense"] > 50
    assert doc["network"]["nodes"] == 2 and doc["network"]["measured_goodput_gbit"] > 0.5
    # nothing of ours left behind (other processes on the machine may have their own namespaces meanwhile)
    assert {n for n in netem.list_namespaces() if n.startswith(ours)} <= before


def _comm_opt_json(tmp_path: Path, strategy: dict, methods: str) -> tuple[int, dict | None, str]:
    from workers.cli import main

    path = tmp_path / "strategy.json"
    path.write_text(json.dumps(strategy))
    out, err = io.StringIO(), io.StringIO()
    argv = ["comm-opt", "--model", str(EXAMPLES / "comm-tiny.json"), "--steps", "3", "--timeout", "180"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([*argv, "--strategy", str(path), "--methods", methods, "--json"])
    return rc, (json.loads(out.getvalue()) if rc == 0 else None), err.getvalue()


def test_comm_opt_refuses_a_strategy_the_runtime_refuses(tmp_path):
    rc, _, err = _comm_opt_json(tmp_path, {"tp": 3}, "dense")  # 4 ranks: tp 3 does not divide them
    assert rc == 2 and "invalid input" in err and "tp" in err, err


@pytest.mark.skipif(bool(netem.unavailable_reason()), reason=netem.unavailable_reason() or "ok")
def test_comm_opt_strategy_runs_each_method_under_zero2_or_says_what_ran_instead(tmp_path):
    rc, doc, err = _comm_opt_json(tmp_path, {"zero_stage": 2}, "dense,hierarchical,adaptive")
    assert rc == 0, err
    rows = doc["methods"]
    assert list(rows) == ["dense", "hierarchical", "adaptive"]  # one entry per method
    assert rows["dense"]["zero_stage"] == rows["hierarchical"]["zero_stage"] == 2
    assert "note" not in rows["dense"]
    # the hierarchical reduce-scatter is lossless; its inter-node share is reported beside the total
    assert rows["hierarchical"]["loss_avg_last10"] == pytest.approx(
        rows["dense"]["loss_avg_last10"], rel=1e-4
    )
    assert 0 < rows["hierarchical"]["inter_node_bytes"] < rows["dense"]["bytes_per_rank_per_step"]
    # adaptive has no reduce-scatter form: it ran under ZeRO-0 with the same layout, and says why
    assert rows["adaptive"]["zero_stage"] == 0
    assert "refused under zero_stage 2" in rows["adaptive"]["note"] and "adaptive" in rows["adaptive"]["note"]
    assert "low-rank" not in rows["adaptive"]["note"]  # its own reason, not powerSGD's
