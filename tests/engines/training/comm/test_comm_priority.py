"""Priority-ordered gradient communication (``comm_order``, ``workers.training.comm.priority``) in a real
2-rank gloo group on 127.0.0.1.

One spawn runs everything and saves what each rank saw: the runtime's ``Trainer`` on ``comm-tiny`` under
each order (DDP's reverse, priority, magnitude; two micro-batches per step, so local accumulation too), and
``PriorityGradSync`` alone on a wide MLP at batch 1, where one partition takes far longer on the wire than
a layer's backward: the ready partitions queue up and the order the comm thread picks is visible.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.engines.ranks import spawn_ranks
from tests.engines.training.harness import EXAMPLES
from workers.training.config import ConfigError, JobConfig

pytestmark = pytest.mark.slow

ORDERS = ("reverse", "priority", "magnitude")
STEPS = 4
MLP_WIDTH, MLP_LAYERS, MLP_STEPS = 1024, 6, 3  # a 4 MB weight per layer: one partition each


def _job(order: str, **extra) -> dict:
    return {
        "model": json.loads((EXAMPLES / "comm-tiny.json").read_text()),
        "strategy": {"dp": 2, "micro_batch_size": 2},
        "training": {"global_batch_size": 8, "dtype": "fp32", "optimizer": "adamw"},
        "steps": STEPS,
        "device": "cpu",
        "grad_clip": 0.0,
        "comm_order": order,
        "bucket_cap_mb": 0.05,  # ~10 partitions / buckets of comm-tiny's 0.46 MB of gradients
        "energy": {"enabled": False},
        **extra,
    }


def _mlp_sends(order: str) -> dict:
    import torch.distributed as dist

    from workers.training.comm.priority import PriorityGradSync

    torch.manual_seed(0)
    layers = [torch.nn.Linear(MLP_WIDTH, MLP_WIDTH, bias=False) for _ in range(MLP_LAYERS)]
    model = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.Tanh())])
    sync = PriorityGradSync(model, order=order, partition_mb=MLP_WIDTH * MLP_WIDTH * 4 / 1e6)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sync.bind_optimizer(opt)
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(MLP_STEPS):
        model(torch.randn(1, MLP_WIDTH, generator=g)).square().sum().backward()
        opt.step()
    sync.flush()
    sync.close()
    return {"log": list(sync.send_log), "partitions": len(sync.partitions)}


def _scenarios(rank: int, world: int) -> dict:
    from workers.training.trainer import Trainer

    res: dict = {}
    for order in ORDERS:
        trainer = Trainer(JobConfig.from_dict(_job(order)), rank=rank, world_size=world)
        summary = trainer.train()
        res[order] = {
            "losses": summary["losses"],
            "grad_norms": [r.grad_norm for r in trainer.history],
            "comm": [r.comm for r in trainer.history],
            "params": torch.cat([p.detach().reshape(-1) for p in trainer.pm.raw_parts[0].parameters()]),
            "log": list(trainer.grad_sync.send_log) if trainer.grad_sync is not None else None,
        }
        for st in trainer.pm.comm_states:
            st.close()
    for order in ("priority", "magnitude"):
        res[f"mlp_{order}"] = _mlp_sends(order)
    return res


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return spawn_ranks(_scenarios, 2)


def _check_step_logs(results: list[dict], key: str) -> list[list[dict]]:
    """Every rank sent the same partitions in the same order, each exactly once per step."""
    logs = [r[key]["log"] for r in results]
    assert logs[0] == logs[1], "ranks chose different partitions: gloo would mismatch"
    steps = sorted({e["step"] for e in logs[0]})
    per_step = [[e for e in logs[0] if e["step"] == s] for s in steps]
    n = results[0][key].get("partitions") or len(per_step[0])
    for sends in per_step:
        assert sorted(e["partition"] for e in sends) == list(range(n))
    return per_step


def test_priority_sends_the_first_layers_first(ranks):
    per_step = _check_step_logs(ranks, "mlp_priority")
    queued = 0
    for sends in per_step:
        for e in sends:  # the lowest partition (the earliest layer) among those ready on both ranks
            assert e["partition"] == min(e["candidates"]), e
        queued += sum(len(e["candidates"]) > 1 for e in sends)
        order = [e["partition"] for e in sends]
        print("priority send order:", order)
        # backward readies the last layer first; once layers queue up, the first ones overtake them
        assert order != sorted(order, reverse=True)
    assert queued, "no partition ever waited for another: the order was never decided"
    # and in the runtime's own run (comm-tiny, partitions cutting across tensors)
    for sends in _check_step_logs(ranks, "priority"):
        assert all(e["partition"] == min(e["candidates"]) for e in sends)


def test_magnitude_sends_the_largest_gradient_first(ranks):
    for key in ("mlp_magnitude", "magnitude"):
        for sends in _check_step_logs(ranks, key):
            for e in sends:
                best = max(range(len(e["candidates"])), key=lambda i: e["sq_norms"][i])
                assert e["partition"] == e["candidates"][best], e
                assert all(v > 0 for v in e["sq_norms"])


def test_every_order_trains_to_the_same_loss_and_weights_as_ddp(ranks):
    for r in ranks:
        ref = r["reverse"]
        assert ref["losses"][-1] < ref["losses"][0]
        for order in ("priority", "magnitude"):
            run = r[order]
            print(f"{order}: losses {run['losses']} vs reverse {ref['losses']}")
            assert run["losses"] == ref["losses"]  # 2 ranks: the same sums, bit for bit
            assert torch.equal(run["params"], ref["params"])
            # the gradient norm is reported a step late (the gradient is still in flight at the step's end)
            assert run["grad_norms"][0] == 0.0
            assert run["grad_norms"][1:] == pytest.approx(ref["grad_norms"][:-1], rel=1e-9)
            steady = run["comm"][1:]
            assert all(c["comm_bytes"] == c["dense_fp32_bytes"] > 0 for c in steady)
            assert all(0.0 <= c["comm_s_exposed"] and c["comm_s_total"] > 0 for c in steady)
    assert torch.equal(ranks[0]["priority"]["params"], ranks[1]["priority"]["params"])


def test_an_unknown_comm_order_is_refused_with_the_choices():
    with pytest.raises(
        ConfigError, match=r"must be one of reverse, priority, magnitude, got 'fastest'"
    ) as exc:
        JobConfig.from_dict(_job("fastest"))
    assert exc.value.field == "comm_order"


def test_priority_order_is_refused_where_a_step_needs_the_whole_gradient():
    with pytest.raises(ConfigError, match="set grad_clip 0") as exc:
        JobConfig.from_dict(_job("priority", grad_clip=1.0))
    assert exc.value.field == "comm_order"
    with pytest.raises(ConfigError, match="data parallelism only"):
        JobConfig.from_dict(_job("magnitude", strategy={"dp": 2, "micro_batch_size": 2, "zero_stage": 1}))
    with pytest.raises(ConfigError, match="drop comm_hook"):
        JobConfig.from_dict(_job("priority", comm_hook="fp16"))
    assert JobConfig.from_dict(_job("reverse", grad_clip=1.0)).comm_order == "reverse"
