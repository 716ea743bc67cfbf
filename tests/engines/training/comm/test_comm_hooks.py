"""Each DDP comm hook in real 2- and 4-rank gloo groups on 127.0.0.1.

One spawn per world size runs every scenario (fresh DDP models from the same seed) and saves what each
rank ended with; the tests then pin down the behaviour from those results.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.engines.ranks import spawn_ranks
from tests.engines.training.comm.small_ddp import small_mlp, train_small_ddp

pytestmark = pytest.mark.slow


def _scenarios(rank: int, world: int) -> dict:
    import torch.distributed as dist

    res: dict = {}
    res["plain"], _, _ = train_small_ddp()
    res["allreduce"], _, _ = train_small_ddp("allreduce")
    res["topk_dense_equiv"], _, _ = train_small_ddp("topk_ef", {"density": 1.0, "value_dtype": "fp32"})
    res["topk_sparse_path_d1"], _, _ = train_small_ddp(
        "topk_ef", {"density": 1.0, "value_dtype": "fp32", "dense_fallback": False}
    )
    stats: list = []
    res["topk_1pct"], st, _ = train_small_ddp("topk_ef", {"density": 0.01}, stats=stats)
    res["topk_1pct_stats"] = stats
    res["topk_1pct_residual_norm"] = st.residuals.norm()
    stats = []
    res["topk_warmup"], st, _ = train_small_ddp(
        "topk_ef", {"density": 0.01, "warmup_steps": 3, "start_density": 0.9}, stats=stats
    )
    res["topk_warmup_bytes"] = [s["bytes_sent"] for s in stats]
    dgc = {"density": 0.05, "momentum": 0.9, "clip_norm": 0.5, "warmup": "exponential", "warmup_steps": 3}
    dgc["start_density"] = 0.25
    res["topk_dgc"], st, _ = train_small_ddp("topk_ef", dgc)
    res["topk_dgc_momentum_norm"] = st.momentum_buffers.norm()
    res["topk_dgc_ref"], _, _ = train_small_ddp("topk_ef", dgc, steps=4)
    _, st, model = train_small_ddp("topk_ef", dgc, steps=2)
    sd = st.state_dict()
    res["topk_dgc_ckpt_keys"] = sorted(sd)
    res["topk_dgc_resumed"], _, _ = train_small_ddp(
        "topk_ef", dgc, steps=2, start_step=2, model_state=model.state_dict(), hook_state=sd
    )
    stats = []
    res["sign"], _, _ = train_small_ddp("sign_ef", {"chunk": 256}, stats=stats)
    res["sign_stats"] = stats
    res["fp16"], _, _ = train_small_ddp("fp16")
    res["bf16"], _, _ = train_small_ddp("bf16")
    stats = []
    res["powerSGD"], _, _ = train_small_ddp("powerSGD", {"start_powerSGD_iter": 2}, stats=stats)
    res["powerSGD_stats"] = stats

    # checkpoint/resume of the error-feedback state: 2 + 2 steps == 4 steps, bit for bit
    res["topk_resume_ref"], _, _ = train_small_ddp("topk_ef", {"density": 0.05}, steps=4)
    _, st, model = train_small_ddp("topk_ef", {"density": 0.05}, steps=2)
    sd = st.state_dict()
    res["topk_ckpt_keys"] = sorted(sd["residuals"])
    res["topk_ckpt_step"] = sd["step"]
    res["topk_resumed"], _, _ = train_small_ddp(
        "topk_ef", {"density": 0.05}, steps=2, start_step=2, model_state=model.state_dict(), hook_state=sd
    )

    if world == 4:
        from workers.training.comm.hierarchical import hierarchical_all_reduce, node_groups

        hier_opts = {"ranks_per_node": 2}
        stats = []
        res["hier_dense"], st, _ = train_small_ddp("hierarchical", hier_opts, stats=stats)
        res["hier_dense_stats"] = stats
        st.close()
        res["hier_topk_d1"], st, _ = train_small_ddp(
            "hierarchical", {**hier_opts, "inter_node": "topk", "density": 1.0}
        )
        st.close()
        res["hier_topk"], st, _ = train_small_ddp(
            "hierarchical", {**hier_opts, "inter_node": "topk", "density": 0.05}
        )
        st.close()
        intra, inter = node_groups(2)
        g = torch.Generator().manual_seed(rank)
        for n in (1, 7, 10_001):
            x = torch.randn(n, generator=g)
            flat = x.clone()
            dist.all_reduce(flat)
            res[f"hier_fn_{n}"] = (hierarchical_all_reduce(x.clone(), intra, inter), flat)
    return res


@pytest.fixture(scope="module")
def two_ranks(native_built):
    return spawn_ranks(_scenarios, 2)


@pytest.fixture(scope="module")
def four_ranks(native_built):
    return spawn_ranks(_scenarios, 4)


def _same_on_all_ranks(results: list[dict], key: str) -> torch.Tensor:
    first = results[0][key]
    for r in results[1:]:
        assert torch.equal(r[key], first), f"{key}: replicas diverged"
    return first


@pytest.fixture(params=[2, 4], ids=["2ranks", "4ranks"])
def ranks(request, two_ranks, four_ranks):
    return two_ranks if request.param == 2 else four_ranks


def test_every_hook_keeps_replicas_identical(ranks):
    keys = [
        "plain",
        "allreduce",
        "topk_dense_equiv",
        "topk_1pct",
        "topk_warmup",
        "topk_dgc",
        "sign",
        "fp16",
        "bf16",
        "powerSGD",
    ]
    for key in keys:
        params = _same_on_all_ranks(ranks, key)
        assert torch.isfinite(params).all(), key


def test_dense_equivalent_topk_reproduces_plain_ddp_exactly(ranks):
    plain = _same_on_all_ranks(ranks, "plain")
    assert torch.equal(_same_on_all_ranks(ranks, "allreduce"), plain)
    assert torch.equal(_same_on_all_ranks(ranks, "topk_dense_equiv"), plain)


def test_sparse_exchange_at_full_density_matches_plain_ddp(ranks):
    plain = _same_on_all_ranks(ranks, "plain")
    sparse = _same_on_all_ranks(ranks, "topk_sparse_path_d1")
    if len(ranks) == 2:
        assert torch.equal(sparse, plain)  # a + b == b + a: same bits as gloo's sum
    else:
        torch.testing.assert_close(sparse, plain, rtol=1e-6, atol=1e-7)  # only the summation order differs


def test_compressed_hooks_train_but_differ_from_dense(ranks):
    plain = _same_on_all_ranks(ranks, "plain")
    init = torch.cat([p.detach().reshape(-1) for p in small_mlp().parameters()])
    for key, tol in [("fp16", 1e-2), ("bf16", 5e-2)]:
        torch.testing.assert_close(_same_on_all_ranks(ranks, key), plain, rtol=tol, atol=tol)
    for key in ["topk_1pct", "sign", "powerSGD"]:
        params = _same_on_all_ranks(ranks, key)
        assert not torch.equal(params, plain), key
        assert not torch.equal(params, init), f"{key} did not update the parameters"
    assert ranks[0]["topk_1pct_residual_norm"] > 0


def test_topk_at_one_percent_sends_over_50x_fewer_bytes(ranks):
    for s in ranks[0]["topk_1pct_stats"]:
        assert s["complete"]
        assert s["dense_fp32_bytes"] / s["bytes_sent"] >= 50, s
        assert s["comm_s_total"] > 0 and 0 <= s["comm_s_exposed"]
    assert ranks[0]["topk_1pct_stats"][-1]["buckets"] >= 2  # DDP re-buckets after step 0


def test_density_warmup_grows_sparsity_linearly(ranks):
    sent = ranks[0]["topk_warmup_bytes"]  # densities 0.9, 0.63, 0.37, 0.01
    assert sent[0] >= sent[1] >= sent[2] > sent[3]  # dense all-reduce while cheaper than the sparse message
    if len(ranks) == 2:
        assert sent[1] > sent[2]
    assert sent[3] == ranks[0]["topk_1pct_stats"][-1]["bytes_sent"]


def test_linear_density_schedule():
    from workers.training.comm.compression import linear_density

    ramp = [linear_density(s, target=0.1, start=0.9, warmup_steps=4) for s in range(6)]
    assert ramp == pytest.approx([0.9, 0.7, 0.5, 0.3, 0.1, 0.1])
    assert linear_density(0, target=0.01) == 0.01


def test_exponential_density_schedule():
    from workers.training.comm.compression import exponential_density

    ramp = [exponential_density(s, target=0.01, start=0.25, warmup_steps=4) for s in range(6)]
    assert ramp[0] == pytest.approx(0.25) and ramp[4:] == [0.01, 0.01]
    assert all(a / b == pytest.approx(25**0.25) for a, b in zip(ramp[:4], ramp[1:5], strict=True))


def test_dgc_options_are_checked():
    from workers.training.comm.compression import TopKState

    class _Group:  # only dist.get_world_size is asked of the group
        pass

    import torch.distributed as dist

    orig = dist.get_world_size
    dist.get_world_size = lambda group=None: 4
    try:
        for bad in ({"warmup": "cubic"}, {"momentum": 1.0}, {"clip_norm": -1}):
            with pytest.raises(ValueError):
                TopKState(_Group(), bad)
        st = TopKState(_Group(), {"momentum": 0.9, "momentum_masking": "false"})
        assert st.momentum_buffers is not None and st.momentum_masking is False
        assert TopKState(_Group(), {}).momentum_buffers is None  # defaults: no DGC momentum
    finally:
        dist.get_world_size = orig


def test_dgc_momentum_and_clipping_checkpoint_and_resume_exactly(ranks):
    assert ranks[0]["topk_dgc_momentum_norm"] > 0
    assert ranks[0]["topk_dgc_ckpt_keys"] == ["momentum", "residuals", "schedule", "step"]
    assert not torch.equal(_same_on_all_ranks(ranks, "topk_dgc"), _same_on_all_ranks(ranks, "topk_1pct"))
    assert torch.equal(
        _same_on_all_ranks(ranks, "topk_dgc_resumed"), _same_on_all_ranks(ranks, "topk_dgc_ref")
    )


def test_sign_sends_one_bit_per_element_plus_a_scale_per_chunk(ranks):
    for s in ranks[0]["sign_stats"]:
        assert 28 <= s["dense_fp32_bytes"] / s["bytes_sent"] <= 32, s


def test_powersgd_is_dense_during_warmup_then_compresses(ranks):
    stats = ranks[0]["powerSGD_stats"]
    assert stats[0]["bytes_sent"] == stats[0]["dense_fp32_bytes"]
    assert stats[-1]["bytes_sent"] < stats[-1]["dense_fp32_bytes"] / 2


def test_error_feedback_state_checkpoints_and_resumes_exactly(ranks):
    assert ranks[0]["topk_ckpt_step"] == 2
    assert "0.weight" in ranks[0]["topk_ckpt_keys"]  # residuals are keyed by parameter name
    assert torch.equal(
        _same_on_all_ranks(ranks, "topk_resumed"), _same_on_all_ranks(ranks, "topk_resume_ref")
    )


def test_hierarchical_all_reduce_equals_flat(four_ranks):
    for r in four_ranks:
        for n in (1, 7, 10_001):
            hier, flat = r[f"hier_fn_{n}"]
            torch.testing.assert_close(hier, flat, rtol=1e-6, atol=1e-6)


def test_hierarchical_hook_matches_plain_ddp(four_ranks):
    plain = _same_on_all_ranks(four_ranks, "plain")
    torch.testing.assert_close(_same_on_all_ranks(four_ranks, "hier_dense"), plain, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(_same_on_all_ranks(four_ranks, "hier_topk_d1"), plain, rtol=1e-5, atol=1e-6)
    sparse = _same_on_all_ranks(four_ranks, "hier_topk")
    assert torch.isfinite(sparse).all() and not torch.equal(sparse, plain)
    stats = four_ranks[0]["hier_dense_stats"]
    assert all(s["complete"] and s["comm_s_total"] > 0 for s in stats)
    # each rank ships half of each bucket across nodes
    last = stats[-1]
    assert math.isclose(last["inter_node_bytes"], last["dense_fp32_bytes"] / 2, rel_tol=0.01)
