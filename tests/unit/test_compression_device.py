"""The device path of the compression hooks: pure-torch kernels on the bucket's device give what the C++
kernels give on the CPU.

``native_ops.kernels_for`` sends CPU float32 tensors to the C++ kernels and everything else (CUDA, NPU,
bf16/fp16 buckets) to ``native_ops.reference``. Without a GPU the device path is checked by calling the
reference directly on CPU tensors (same code, device-generic), by bf16 buckets (which take it on the CPU
too), and by forcing it in a real 2-rank gloo DDP run; with CUDA, the hooks also run on CUDA buckets.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import native_ops
from native_ops import reference
from tests.engines.ranks import spawn_ranks
from tests.unit.test_native_ops import gradients

VALUE_DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@pytest.fixture(scope="module")
def native():
    module = native_ops.load(build=True)
    if native_ops.backend() != "native":
        pytest.skip(f"C++ kernels unavailable ({native_ops.fallback_reason()}): nothing to compare with")
    return module


def assert_topk_is_a_valid_selection(x: torch.Tensor, idx: torch.Tensor, k: int) -> None:
    """Tie-robust: k distinct ascending indices, and no element left out is larger than one sent."""
    assert idx.numel() == k and torch.equal(idx, idx.unique())
    if 0 < k < x.numel():
        kept = torch.zeros(x.numel(), dtype=torch.bool)
        kept[idx.long()] = True
        assert x.abs()[kept].min() >= x.abs()[~kept].max()


# -- the generic kernels against the C++ kernels, on CPU tensors -------------------------------------


def test_dispatch_sends_cpu_float32_to_the_cpp_kernels_and_the_rest_to_torch_ops(native):
    cpu32 = torch.zeros(8)
    assert native_ops.kernels_for(cpu32, cpu32) is native
    assert native_ops.kernels_for(cpu32.bfloat16(), cpu32) is reference  # bf16 bucket, fp32 residual
    assert native_ops.kernels_for(cpu32.half()) is reference
    on_device = torch.zeros(8, device="meta")  # any non-CPU device takes the torch-ops path
    assert native_ops.kernels_for(on_device, on_device) is reference
    assert native_ops.kernels_for(cpu32, inputs=(on_device,)) is reference  # messages not on the host


@pytest.mark.parametrize("n", [1, 7, 1000, 65_537, 300_001])
@pytest.mark.parametrize("density", [0.001, 0.01, 0.3, 1.0])
@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_generic_topk_error_feedback_matches_cpp_kernels(native, n, density, scale):
    k = native_ops.k_for_density(n, density)
    g = torch.Generator().manual_seed(n)
    residual0 = torch.randn(n, generator=g) * 0.1
    for name, grad in gradients(n, seed=n + 1).items():
        # a zero residual keeps the tied gradients tied after the accumulation
        start = torch.zeros(n) if name in ("many_ties", "all_zero") else residual0
        for value_dtype in VALUE_DTYPES:
            res_cpp, res_gen = start.clone(), start.clone()
            accumulated = res_cpp + grad * scale if scale != 1.0 else res_cpp + grad
            idx, vals = native.topk_ef_compress(grad, res_cpp, k, value_dtype, scale)
            g_idx, g_vals = reference.topk_ef_compress(grad, res_gen, k, value_dtype, scale)
            where = f"{name} {value_dtype} k={k}"
            assert_topk_is_a_valid_selection(accumulated, g_idx, k)
            assert torch.equal(g_idx, idx), f"{where}: indices differ (tie rule: lower index first)"
            assert g_vals.dtype == value_dtype and torch.equal(g_vals, vals), f"{where}: values differ"
            assert torch.equal(res_gen, res_cpp), f"{where}: residuals differ"


@pytest.mark.parametrize("n,k", [(1, 1), (1000, 10), (65_537, 700), (300_001, 3_000)])
def test_generic_topk_decode_of_several_ranks_matches_cpp_kernels(native, n, k):
    g = torch.Generator().manual_seed(k)
    rows = [native.topk_compress(torch.randn(n, generator=g), k, torch.float16) for _ in range(3)]
    idx, vals = torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])
    base = torch.randn(n, generator=g)
    for alpha in (1.0, 1 / 3):
        out_cpp, out_gen = base.clone(), base.clone()
        native.topk_decompress_add(out_cpp, idx, vals, alpha)
        reference.topk_decompress_add(out_gen, idx, vals, alpha)
        assert torch.equal(out_gen, out_cpp)
    with pytest.raises(RuntimeError, match="out of range"):
        reference.topk_decompress_add(
            torch.zeros(n), torch.tensor([n], dtype=torch.int32), torch.ones(1), 1.0
        )


def test_generic_topk_error_feedback_rounds_keep_the_same_residual(native):
    """Several EF rounds in a row: the residuals (and so every later selection) never drift apart."""
    n, k = 50_000, 500
    g = torch.Generator().manual_seed(21)
    res_cpp, res_gen = torch.zeros(n), torch.zeros(n)
    out_cpp, out_gen = torch.zeros(n), torch.zeros(n)
    for _ in range(6):
        grad = torch.randn(n, generator=g) ** 3
        idx, vals = native.topk_ef_compress(grad, res_cpp, k, torch.float16, 0.5)
        g_idx, g_vals = reference.topk_ef_compress(grad, res_gen, k, torch.float16, 0.5)
        native.topk_decompress_add(out_cpp, idx, vals, 1.0)
        reference.topk_decompress_add(out_gen, g_idx, g_vals, 1.0)
        assert torch.equal(g_idx, idx) and torch.equal(res_gen, res_cpp)
    assert torch.equal(out_gen, out_cpp)


@pytest.mark.parametrize("n", [1, 9, 4096, 100_003])
@pytest.mark.parametrize("chunk", [8, 256, 4096])
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_generic_sign_error_feedback_and_decode_match_cpp_kernels(native, n, chunk, scale):
    g = torch.Generator().manual_seed(n + chunk)
    residual0 = torch.randn(n, generator=g) * 0.1
    for name, grad in gradients(n, seed=3).items():
        res_cpp, res_gen = residual0.clone(), residual0.clone()
        bits, scales = native.sign_ef_compress(grad, res_cpp, chunk, scale)
        g_bits, g_scales = reference.sign_ef_compress(grad, res_gen, chunk, scale)
        assert torch.equal(g_bits, bits), f"{name}: bits differ"
        assert torch.equal(g_scales, scales), f"{name}: scales differ"
        assert torch.equal(res_gen, res_cpp), f"{name}: residuals differ"
    rows_bits = torch.randint(0, 256, (3, bits.numel()), generator=g, dtype=torch.uint8)
    rows_scales = torch.rand(3, scales.numel(), generator=g)
    out_cpp, out_gen = torch.ones(n), torch.ones(n)
    native.sign_decompress_add(out_cpp, rows_bits, rows_scales, chunk, 0.25)
    reference.sign_decompress_add(out_gen, rows_bits, rows_scales, chunk, 0.25)
    assert torch.equal(out_gen, out_cpp)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_gradients_accumulate_in_float32(native, dtype):
    """A bf16/fp16 bucket takes the torch-ops path: the result is the C++ kernels' on the gradient
    widened to float32, and decoding into a bf16/fp16 bucket rounds the float32 sum once."""
    n, k, chunk = 20_011, 200, 512
    g = torch.Generator().manual_seed(4)
    grad = torch.randn(n, generator=g).to(dtype)
    residual0 = torch.randn(n, generator=g) * 0.1
    res_cpp, res_low = residual0.clone(), residual0.clone()
    idx, vals = native.topk_ef_compress(grad.float(), res_cpp, k, torch.float16, 0.5)
    l_idx, l_vals = native_ops.topk_ef_compress(grad, res_low, k=k, scale=0.5)  # public wrapper dispatches
    assert torch.equal(l_idx, idx) and torch.equal(l_vals, vals) and torch.equal(res_low, res_cpp)
    out_cpp, out_low = torch.zeros(n), torch.zeros(n, dtype=dtype)
    native.topk_decompress_add(out_cpp, idx.repeat(2, 1), vals.repeat(2, 1), 1.0)
    native_ops.topk_decompress_add(out_low, idx.repeat(2, 1), vals.repeat(2, 1))
    assert torch.equal(out_low, out_cpp.to(dtype))

    res_cpp, res_low = residual0.clone(), residual0.clone()
    bits, scales = native.sign_ef_compress(grad.float(), res_cpp, chunk, 1.0)
    l_bits, l_scales = native_ops.sign_ef_compress(grad, res_low, chunk=chunk)
    assert torch.equal(l_bits, bits) and torch.equal(l_scales, scales) and torch.equal(res_low, res_cpp)
    out_cpp, out_low = torch.zeros(n), torch.zeros(n, dtype=dtype)
    native.sign_decompress_add(out_cpp, bits.repeat(2, 1), scales.repeat(2, 1), chunk, 1.0)
    native_ops.sign_decompress_add(out_low, bits.repeat(2, 1), scales.repeat(2, 1), chunk=chunk)
    assert torch.equal(out_low, out_cpp.to(dtype))


# -- the hooks themselves on one rank: CPU fp32 (C++) vs bf16 / CUDA buckets (torch ops) ------------


class _Bucket:
    """What the hooks ask of DDP's ``GradBucket``."""

    def __init__(self, buffer: torch.Tensor, sizes: list[int], index: int = 0) -> None:
        self._buffer, self._index = buffer, index
        self._params = [torch.empty(s) for s in sizes]

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return True

    def parameters(self) -> list[torch.Tensor]:
        return self._params


@pytest.fixture(scope="module")
def one_rank_group():
    """A world of one (gloo for CPU tensors, NCCL for CUDA ones), so the hooks' collectives run for real."""
    if dist.is_initialized():
        pytest.skip("a default process group already exists in this process")
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


SIZES = [3_000, 40, 12_345, 1]  # parameters of one bucket: top-k is per parameter
HOOK_CASES = {
    "topk_ef": ("topk_ef", {"density": 0.02}),
    "topk_ef_momentum": ("topk_ef", {"density": 0.05, "momentum": 0.9, "value_dtype": "bf16"}),
    "sign_ef": ("sign_ef", {"chunk": 256}),
    "hierarchical_topk": ("hierarchical", {"ranks_per_node": 1, "inter_node": "topk", "density": 0.02}),
}


def _run_hook(case: str, device: str, dtype: torch.dtype, steps: int = 3) -> tuple[list[torch.Tensor], dict]:
    """The hook's output bucket at each step and its final state, for the same gradients every time."""
    from workers.training.comm import build_hook

    name, options = HOOK_CASES[case]
    state, hook = build_hook(name, None, options)
    g = torch.Generator().manual_seed(7)
    outs = []
    try:
        for _ in range(steps):
            # bf16-representable values: the same gradient whatever the bucket's dtype
            grad = torch.randn(sum(SIZES), generator=g).bfloat16().to(dtype)
            out = hook(state, _Bucket(grad.to(device), SIZES)).wait()
            assert out.device.type == torch.device(device).type and out.dtype == dtype
            outs.append(out.cpu())
    finally:
        if hasattr(state, "close"):
            state.close()
    return outs, state.state_dict()


def _flat_tensors(tree) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree.cpu()]
    if isinstance(tree, dict):
        return [t for key in sorted(tree) for t in _flat_tensors(tree[key])]
    return []


@pytest.mark.parametrize("case", ["topk_ef", "sign_ef", "hierarchical_topk"])
def test_hook_on_a_bf16_bucket_takes_the_torch_path_and_matches_the_cpp_kernels(native, one_rank_group, case):
    """bf16 buckets take the device path even on the CPU; fp32 buckets holding the same (bf16-rounded)
    values take the C++ kernels: same residuals, and the bf16 output is the fp32 output rounded once.
    (Not DGC momentum: it writes the fp32 velocity back into the bucket, i.e. rounds it to bf16.)"""
    low, low_state = _run_hook(case, "cpu", torch.bfloat16)
    ref, ref_state = _run_hook(case, "cpu", torch.float32)
    for step, (a, b) in enumerate(zip(low, ref, strict=True)):
        assert torch.equal(a, b.to(torch.bfloat16)), f"step {step}: outputs differ"
    assert low_state.keys() == ref_state.keys()
    for a, b in zip(_flat_tensors(low_state), _flat_tensors(ref_state), strict=True):
        assert torch.equal(a, b), "error-feedback state differs"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (the torch path is checked on CPU)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", sorted(HOOK_CASES))
def test_hook_on_a_cuda_bucket_matches_the_cpp_kernels_on_cpu(native, one_rank_group, case, dtype):
    on_cuda, cuda_state = _run_hook(case, "cuda", dtype)
    on_cpu, cpu_state = _run_hook(case, "cpu", dtype)
    # Sign scales are means accumulated in float64 in another order on the GPU: equal to within an ulp
    # (of float32; a bf16 output may then round one bf16 ulp apart).
    exact = not case.startswith("sign")
    rtol = 1e-6 if dtype == torch.float32 else 2**-7
    for step, (a, b) in enumerate(zip(on_cuda, on_cpu, strict=True)):
        if exact:
            assert torch.equal(a, b), f"step {step}: outputs differ"
        else:
            torch.testing.assert_close(a, b, rtol=rtol, atol=1e-7)
    for a, b in zip(_flat_tensors(cuda_state), _flat_tensors(cpu_state), strict=True):
        if exact:
            assert torch.equal(a, b), "error-feedback state differs"
        else:
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


# -- end to end: DDP in a real 2-rank gloo group, C++ kernels vs the torch path forced on the CPU ----

E2E_CASES = {
    "topk_ef": {"density": 0.05},
    "sign_ef": {"chunk": 256},
    "hierarchical": {"ranks_per_node": 1, "inter_node": "topk", "density": 0.05},
}


KERNELS_FOR = native_ops.kernels_for


def _e2e_ranks(rank: int, world: int) -> dict:
    from tests.engines.training.comm.small_ddp import train_small_ddp

    res = {}
    for hook, options in E2E_CASES.items():
        for path in ("cpp", "torch"):
            if path == "torch":  # what a CUDA/NPU bucket gets, forced on these CPU buckets
                native_ops.kernels_for = lambda *buffers, inputs=(): reference
            try:
                res[f"{hook}/{path}"], state, _ = train_small_ddp(hook, options)
            finally:
                native_ops.kernels_for = KERNELS_FOR
            if hasattr(state, "close"):
                state.close()
    return res


@pytest.mark.slow
def test_ddp_with_the_torch_path_trains_exactly_as_with_the_cpp_kernels(native):
    from tests.engines.training.comm.small_ddp import small_mlp

    ranks = spawn_ranks(_e2e_ranks, 2)
    init = torch.cat([p.detach().reshape(-1) for p in small_mlp().parameters()])
    for hook in E2E_CASES:
        cpp = ranks[0][f"{hook}/cpp"]
        assert not torch.equal(cpp, init), f"{hook} did not train"
        for r in ranks:
            assert torch.equal(r[f"{hook}/cpp"], cpp), f"{hook}: replicas diverged"
            assert torch.equal(r[f"{hook}/torch"], cpp), f"{hook}: the torch path trained differently"
