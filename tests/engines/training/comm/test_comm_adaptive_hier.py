"""The ``adaptive`` hook's hierarchical levels (``hier``, ``hier_topk@d``), in real gloo groups.

One spawn of 4 ranks on 127.0.0.1, laid out as 2 nodes x 2 ranks (``ranks_per_node=2``; the ranks of a
node share this host, so the intra-node stages use shared memory as on a real node), runs every scenario:

- the levels offered: ``hier`` after ``dense``, ``hier_topk@d`` in place of each ``topk@d``; neither with
  one node (``ranks_per_node=4``) nor without a node layout;
- ``hier`` is lossless: the gradients it leaves equal plain DDP's all-reduce (fp32 summation order aside);
- at ``hier_topk`` the shard residual backs off along the hierarchy (``hier_topk@0.01 -> hier_topk@0.1 ->
  hier``) and is flushed, not dropped, when the bucket reaches ``hier``: after the flush step the gradient
  sum over the run equals the dense one's (what error feedback promises once nothing is withheld);
- every rank records the same switches; the state (levels, shard residuals with their offsets) round-trips
  through ``state_dict``, and a run without the hierarchy resumes it on the flat twins.
"""

from __future__ import annotations

import io

import pytest
import torch

from tests.engines.ranks import spawn_ranks

pytestmark = pytest.mark.slow

EAGER = "exposed_high=0,margin=0,tolerance=0,dwell=1,persist=1"
BOUND = 1e-3  # below any residual/gradient ratio top-k leaves: every top-k step backs off one level


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.ReLU(), torch.nn.Linear(256, 512))


def _run(spec: str, steps: int, *, hook_state=None, lr: float = 0.0):
    """DDP with the hook ``spec``; returns (state, the gradients of every step, summed over steps)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from workers.training.comm import register_comm_hook

    ddp = DDP(_model(), bucket_cap_mb=0.25)
    state = register_comm_hook(ddp, spec) if spec else None
    if hook_state is not None:
        state.load_state_dict(hook_state)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    total = [torch.zeros_like(p) for p in ddp.parameters()]
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + dist.get_rank())
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 512, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        for t, p in zip(total, ddp.parameters(), strict=True):
            t += p.grad
        opt.step()
    if state is not None and hasattr(state, "close"):
        state.close()
    return state, total


def _scenarios(rank: int, world: int) -> dict:
    from workers.training.comm.adaptive import AdaptiveState

    res: dict = {}
    for key, options in (("levels", {"ranks_per_node": 2}), ("levels_one_node", {"ranks_per_node": 4})):
        probe = AdaptiveState(None, options)
        res[key] = probe.levels
        probe.close()
    res["levels_no_layout"] = AdaptiveState(None, {}).levels

    # hier is lossless: the same gradients as DDP's own all-reduce
    _, dense = _run("", 3)
    st, hier = _run("adaptive:ranks_per_node=2,levels=hier/fp16,start=hier,exposed_high=1e9", 3)
    res["hier_vs_dense"] = max(float((a - b).abs().max()) for a, b in zip(hier, dense, strict=True))
    res["hier_levels"] = sorted(set(st.level_of.values()))
    res["hier_inter_bytes"] = st.comm_stats().get("inter_node_bytes")

    # residual back-off along the hierarchy, then the flush at hier: 5 steps, lr 0 so that every step sees
    # the same model (the sum of the sent gradients must then equal the dense sum)
    spec = f"adaptive:ranks_per_node=2,levels=hier/topk,start=hier_topk@0.01,residual_bound={BOUND},value_dtype=fp32"
    spec += f",{EAGER},exposed_high=1e9,cooldown=100"
    st, backed = _run(spec, 6)
    res["backoff"] = st.switches
    res["backoff_vs_dense"] = max(
        float((a - b).abs().max() / b.abs().max()) for a, b in zip(backed, _run("", 6)[1], strict=True)
    )
    res["shards_after_flush"] = {k[0]: float(r.abs().sum()) for k, (_, r, _) in st.shard_residuals.items()}
    # a state still holding shard residuals: saved, resumed with and without the hierarchy
    st, _ = _run(
        f"adaptive:ranks_per_node=2,levels=hier/topk,start=hier_topk@0.01,{EAGER},exposed_high=1e9", 2
    )
    buffer = io.BytesIO()
    torch.save(st.state_dict(), buffer)
    saved = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
    res["saved_shards"] = {k: (v[0], v[1].numel()) for k, v in saved["adaptive"]["shard_residuals"].items()}
    again = AdaptiveState(None, {"ranks_per_node": 2, "levels": "hier/topk"})
    again.load_state_dict(saved)
    res["resumed_levels"] = sorted(set(again.level_of.values()))
    res["resumed_shards"] = {k[0]: o for k, (o, _, _) in again.shard_residuals.items()}
    flat = AdaptiveState(None, {"levels": "dense/topk"})
    flat.load_state_dict(saved)
    res["flat_levels"] = sorted(set(flat.level_of.values()))
    res["flat_shards"] = len(flat.shard_residuals)
    buffer = io.BytesIO()
    torch.save(flat.state_dict(), buffer)
    back = AdaptiveState(None, {"ranks_per_node": 2, "levels": "hier/topk"})
    back.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=False))
    res["flat_to_hier_levels"] = sorted(set(back.level_of.values()))
    # a checkpoint of an older ladder (0.1 % in it) with a ban of that level: resumed, the ban is moot
    older = dict(saved["adaptive"])
    older["levels"] = [*older["levels"], "hier_topk@0.001"]
    older["banned"] = {"0.weight": [len(older["levels"]) - 1, 99], "2.weight": [1, 99]}
    newer = AdaptiveState(None, {"ranks_per_node": 2, "levels": "hier/topk"})
    newer.load_state_dict({**saved, "adaptive": older})
    res["older_ladder_bans"] = {k: newer.levels[i] for k, (i, _) in newer.banned.items()}
    for s in (again, flat, back, newer):
        s.close()
    return res


@pytest.fixture(scope="module")
def ranks(native_built):
    return spawn_ranks(_scenarios, 4)


def test_hier_levels_are_offered_only_across_nodes_with_ranks_to_share_a_node(ranks):
    # with a hierarchy, top-k goes through it: hier_topk in place of the flat top-k levels
    assert ranks[0]["levels"] == ["dense", "hier", "fp16", "hier_topk@0.1", "hier_topk@0.01"]
    assert ranks[0]["levels_one_node"] == ["dense", "fp16", "topk@0.1", "topk@0.01"]
    assert ranks[0]["levels_no_layout"] == ranks[0]["levels_one_node"]


def test_hier_is_lossless(ranks):
    for r in ranks:
        assert r["hier_levels"] == ["hier"]
        assert r["hier_vs_dense"] < 1e-6
        # each rank sends its half shard across nodes: 2 (nodes - 1) / nodes x 4 bytes x n / 2
        assert r["hier_inter_bytes"] > 0


def test_hier_topk_backs_off_along_the_hierarchy_and_flushes_its_residual(ranks):
    moves = {(s["from"], s["to"]) for s in ranks[0]["backoff"]}
    assert moves == {("hier_topk@0.01", "hier_topk@0.1"), ("hier_topk@0.1", "hier")}, ranks[0]["backoff"]
    assert all("residual norm" in s["reason"] for s in ranks[0]["backoff"])
    for r in ranks:
        assert r["shards_after_flush"] == {}  # flushed into the hier exchange, not kept
        # every withheld value went out in a later step: the run's gradient sum equals the dense run's
        assert r["backoff_vs_dense"] < 1e-4


def test_every_rank_records_the_same_switches(ranks):
    assert all(r["backoff"] == ranks[0]["backoff"] for r in ranks)


def test_shard_residuals_round_trip_and_resume_without_the_hierarchy(ranks):
    for rank, r in enumerate(ranks):
        # this rank's half of each bucket: offset = its rank in the node x the shard length
        assert r["saved_shards"] and all(off == (rank % 2) * n for off, n in r["saved_shards"].values())
        assert r["resumed_levels"] == ["hier_topk@0.01"]
        assert set(r["resumed_shards"].values()) == {off for off, _ in r["saved_shards"].values()}
        assert r["flat_levels"] == ["topk@0.01"]  # the flat twin; its shard residuals wait for the flush
        assert r["flat_shards"] == len(r["saved_shards"])
        assert r["flat_to_hier_levels"] == ["hier_topk@0.01"]  # and back: a flat checkpoint on a hierarchy


def test_a_ban_of_a_level_no_longer_offered_is_dropped_on_resume(ranks):
    # the kept ban names its level by index into the checkpoint's list: carried over by name
    assert ranks[0]["older_ladder_bans"] == {"2.weight": "hier_topk@0.1"}
