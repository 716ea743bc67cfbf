"""The ``adaptive`` comm hook and ``topk_ef``'s default density warm-up, in real gloo groups.

One spawn of 2 ranks on 127.0.0.1 runs every scenario and saves what each rank saw; the tests pin the
behaviour down from that:

- the controller goes sparser while communication is exposed (a model whose one big bucket dwarfs its
  compute, on loopback: the exposure is measured, not set) and not when the gate says comm is hidden;
- it backs off, one level at a time, when the error-feedback residual outgrows a (tiny) bound, bans the
  level it left, and flushes the residual when it reaches a dense level;
- every rank records the same switches, reasons included (decisions come from all-reduced measurements);
- its choices, bans and residuals round-trip through ``state_dict`` (a resumed run keeps its levels);
- the runtime publishes each switch as a ``comm_switch`` event on the job's Redis stream, and
  ``comm_density`` in its ``train`` events;
- a ``topk_ef`` job without ``warmup_steps`` warms up (DGC's exponential schedule over its first steps),
  and a resumed job continues that schedule where it left off, even when told another step count.

On a machine with root and iproute2, one more run uses the emulated network (``netem``): a 50 Mbit/s link
between two nodes, the controller with its default thresholds, the whole runtime under torchrun.
"""

from __future__ import annotations

import io
import json
import os
import uuid

import pytest
import torch

from tests.engines.ranks import spawn_ranks
from tests.engines.training.harness import EXAMPLES
from workers.training.comm import netem

pytestmark = pytest.mark.slow

TINY = json.loads((EXAMPLES / "comm-tiny.json").read_text())
# reaction within one step, no margins: what the controller does follows from the measurements alone
EAGER = "exposed_high=0,margin=0,tolerance=0,dwell=1,persist=1"
BOUND = 1e-3  # far below any residual/gradient norm ratio top-k leaves: every top-k step exceeds it


def _model() -> torch.nn.Module:
    """One 0.5M-parameter layer (its all-reduce costs far more than the tiny forward/backward), and a
    small one so that there are two buckets."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1024))


def _train(spec: str, steps: int, *, hook_state=None, model_state=None):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from workers.training.comm import register_comm_hook

    model = _model()
    if model_state is not None:
        model.load_state_dict(model_state)
    ddp = DDP(model, bucket_cap_mb=1)
    state = register_comm_hook(ddp, spec)
    if hook_state is not None:
        state.load_state_dict(hook_state)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + dist.get_rank())
        x, y = torch.randn(4, 16, generator=g), torch.randn(4, 1024, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return state, model


def _trainer_cfg(hook: str, steps: int, **extra):
    from workers.training.config import JobConfig

    return JobConfig.from_dict(
        {
            "model": TINY,
            "strategy": {"dp": 2, "micro_batch_size": 2},
            "training": {"global_batch_size": 4},
            "steps": steps,
            "device": "cpu",
            "comm_hook": hook,
            "bucket_cap_mb": 0.05,
            **extra,
        }
    )


def _scenarios(rank: int, world: int, redis_url: str | None, job_id: str) -> dict:
    res: dict = {}
    import time as _t

    clock = [_t.monotonic()]

    def lap(name):
        now = _t.monotonic()
        res.setdefault("laps", {})[name] = round(now - clock[0], 2)
        clock[0] = now

    # comm exposed (measured) and the gate open: from the densest top-k level straight to a sparser one
    st, _ = _train(f"adaptive:levels=topk,{EAGER}", 4)
    res["sparser"] = st.switches
    lap("sparser")
    res["sparser_decision"] = st.last_decision
    # the same, but the gate says comm is never exposed enough: no sparser level is tried
    st, _ = _train(f"adaptive:levels=topk,{EAGER},exposed_high=1e9", 4)
    res["gated"] = st.switches
    # residual bound exceeded at every top-k step: back off topk@0.01 -> topk@0.1 -> fp16, then stay
    spec = f"adaptive:levels=fp16/topk,start=topk@0.01,residual_bound={BOUND},bound_scaling=false,{EAGER},cooldown=100"
    st, model = _train(spec, 5)
    res["backoff"] = st.switches
    res["backoff_residual_norm"] = st.residuals.norm()
    buffer = io.BytesIO()
    torch.save(st.state_dict(), buffer)
    saved = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
    res["saved"] = saved["adaptive"]
    resumed, _ = _train(spec, 2, hook_state=saved, model_state=model.state_dict())
    res["resumed_levels"] = sorted(set(resumed.level_of.values()))
    res["resumed_switches"] = resumed.switches
    try:
        _train("adaptive:levels=dense/topk", 0, hook_state=saved)  # no fp16 level: cannot continue
    except ValueError as exc:
        res["bad_resume"] = str(exc)

    # the runtime: topk_ef's default warm-up, comm_density per step, a resume that continues the schedule
    from workers.training.trainer import Trainer

    def densities(trainer, n):
        out = []
        for _ in range(n):
            result = trainer.train_step(*trainer.loader.next_batch())
            result.step_time_s = 0.1  # train() times a step; here only the comm figures matter
            out.append(trainer._train_values(result, 0.0)["comm_density"])
        return out

    lap("hook scenarios")
    full = Trainer(_trainer_cfg("topk_ef:density=0.01", 10), rank=rank, world_size=2)
    res["schedule"] = full.pm.comm_states[0].schedule()
    res["full_densities"] = densities(full, 1)
    buffer = io.BytesIO()
    torch.save(full.state_dict(), buffer)  # the snapshot after step 1, as a checkpoint would take it
    snapshot = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
    res["full_densities"] += densities(full, 3)
    longer = Trainer(_trainer_cfg("topk_ef:density=0.01", 40), rank=rank, world_size=2)  # plans 20 steps
    res["longer_schedule"] = longer.pm.comm_states[0].schedule()
    longer.load_state_dict(snapshot)
    res["resumed_densities"] = densities(longer, 3)
    for t in (full, longer):
        t.publisher.close()

    # the runtime publishes each switch as a comm_switch event (rank 0, the job's Redis stream)
    extra = {"job_id": job_id, "redis_url": redis_url} if redis_url else {}
    lap("warmup trainers")
    trainer = Trainer(_trainer_cfg(spec, 4, **extra), rank=rank, world_size=2)
    res["summary"] = trainer.train()
    trainer.close()
    lap("train")
    return res


@pytest.fixture(scope="module")
def job_id() -> str:
    return str(900_000_000 + uuid.uuid4().int % 99_999_999)


@pytest.fixture(scope="module")
def ranks(native_built, job_id):
    return spawn_ranks(_scenarios, 2, os.environ.get("REDIS_URL"), job_id)


def test_controller_goes_sparser_while_comm_is_exposed(ranks):
    switches = ranks[0]["sparser"]
    assert switches, ranks[0]["sparser_decision"]
    first = switches[0]
    assert first["from"] == "topk@0.1" and first["to"] in ("topk@0.01", "topk@0.001")
    assert first["reason"].startswith("sparser: exposed comm") and "Gbit/s achieved" in first["reason"]
    assert ranks[0]["sparser_decision"]["exposed_s"] > 0  # measured, all-reduced
    assert ranks[0]["gated"] == []  # exposure under the gate: no sparser level is tried


def test_controller_backs_off_when_the_residual_outgrows_its_bound(ranks):
    moves = [(s["step"], s["from"], s["to"]) for s in ranks[0]["backoff"]]
    # one level per decision, whichever bucket (DDP re-buckets after step 0): 0.01 -> 0.1, then 0.1 -> fp16
    first = min(m[0] for m in moves)  # the first decision (from step 1's measurements: step 0's are skipped)
    assert {m[1:] for m in moves if m[0] == first} == {("topk@0.01", "topk@0.1")}, moves
    assert {m[1:] for m in moves if m[0] > first} == {("topk@0.1", "fp16")}, moves
    assert all(
        "residual norm" in s["reason"] and f"> bound {BOUND:g}" in s["reason"] for s in ranks[0]["backoff"]
    )
    assert ranks[0]["backoff_residual_norm"] == 0.0  # fp16 flushed what top-k withheld


def test_every_rank_records_the_same_switches(ranks):
    for key in ("sparser", "backoff", "resumed_switches"):
        assert ranks[0][key] == ranks[1][key], key


def test_choices_bans_and_switches_round_trip_through_state_dict(ranks):
    r = ranks[0]
    saved = r["saved"]
    assert set(saved["level_of"].values()) == {"fp16"} and saved["banned"]
    assert r["resumed_levels"] == ["fp16"]  # the resumed run keeps its levels and does not retry banned ones
    assert r["resumed_switches"] == r["backoff"]  # history kept; banned levels not retried
    assert "resume with the same ladder and levels" in r["bad_resume"]


def test_topk_jobs_warm_up_by_default_and_report_the_density(ranks):
    r = ranks[0]
    # 10 steps: the first half (5) go from DGC's 25 % exponentially to the 1 % target
    assert r["schedule"] == {
        "density": 0.01,
        "start_density": 0.25,
        "warmup": "exponential",
        "warmup_steps": 5,
        "auto": True,
    }
    expected = [0.25 * 0.04 ** (s / 5) for s in range(4)]  # 25 % x (1 % / 25 %) ** (step / 5)
    assert r["full_densities"] == pytest.approx(expected, abs=1e-6)  # published rounded to 6 digits
    assert r["full_densities"][0] == pytest.approx(0.25) and r["full_densities"][3] < 0.04


def test_a_resumed_job_continues_its_warm_up_where_it_left_off(ranks):
    r = ranks[0]
    assert r["longer_schedule"]["warmup_steps"] == 20  # what a fresh 40-step job would plan
    assert r["resumed_densities"] == pytest.approx(r["full_densities"][1:], abs=1e-6)


def test_runtime_publishes_switches_and_density(ranks, job_id):
    summary = ranks[0]["summary"]
    switches = summary["comm_switches"]
    first = min(s["step"] for s in switches)
    assert {s["to"] for s in switches if s["step"] == first} == {"topk@0.1"}, switches  # back off, as above
    assert {s["to"] for s in switches if s["step"] > first} == {"fp16"}, switches
    assert 0 < summary["comm_density_last"] <= 1
    url = os.environ.get("REDIS_URL")
    if not url:
        pytest.skip("no REDIS_URL: the events were not published")
    import redis

    from workers.events import read_since

    events = read_since(redis.Redis.from_url(url), f"job/{job_id}", 0)
    published = [e["values"]["comm_switch"] for e in events if "comm_switch" in e.get("values", {})]
    assert published == switches
    trains = [e["values"] for e in events if e["kind"] == "train"]
    assert trains and all(0 < v["comm_density"] <= 1 for v in trains)


@pytest.mark.skipif(bool(netem.unavailable_reason()), reason=netem.unavailable_reason() or "ok")
def test_on_a_slow_emulated_link_the_default_controller_compresses():
    from workers.training.comm.compare import job_config, run_on_network

    with netem.TwoTierNetwork(nodes=2, inter_node_gbit=0.05) as net:
        cfg = job_config(TINY, world_size=2, hook="adaptive", steps=5, inter_node_gbit=0.05)
        summary = run_on_network(net, cfg, 1, timeout=240)
    switches = summary["comm_switches"]
    assert switches and switches[0]["from"] == "dense", switches
    assert switches[0]["reason"].startswith("sparser: exposed comm"), switches
    assert summary["comm_bytes_last"] < summary["dense_fp32_bytes"]  # compressed at the end: fp16 or top-k
