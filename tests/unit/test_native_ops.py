"""The C++ kernels agree bit for bit with the pure-torch reference, and error feedback loses nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import native_ops
from native_ops import reference

REPO = Path(__file__).resolve().parents[2]
VALUE_DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@pytest.fixture(scope="module")
def native():
    """The compiled extension; builds it once (outside any test timeout if `make setup` ran first)."""
    if native_ops.build_dir().exists() is False:
        print(f"\nnative_ops: extension not built yet, building into {native_ops.build_dir()} (one-off)")
    module = native_ops.load(build=True)
    if native_ops.backend() != "native":
        missing = native_ops._missing_toolchain()
        if missing:
            pytest.skip(f"no toolchain for the native extension: {missing}")
        pytest.fail(f"native extension failed to build: {native_ops.fallback_reason()}")
    return module


def gradients(n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tail = torch.zeros(n)
    tail[-max(1, n // 50) :] = torch.randn(max(1, n // 50), generator=g) * 100  # all mass in one region
    return {
        "normal": torch.randn(n, generator=g),
        "heavy_tailed": torch.randn(n, generator=g) ** 3,
        "many_ties": torch.randint(-3, 4, (n,), generator=g).float(),
        "concentrated_tail": tail,
        "all_zero": torch.zeros(n),
    }


@pytest.mark.parametrize("n", [1, 7, 1000, 65_537, 300_001])
@pytest.mark.parametrize("density", [0.001, 0.01, 0.3, 1.0])
def test_topk_compress_matches_reference_exactly(native, n, density):
    k = native_ops.k_for_density(n, density)
    for name, x in gradients(n, seed=n).items():
        for dtype in VALUE_DTYPES:
            idx, vals = native.topk_compress(x, k, dtype)
            ref_idx, ref_vals = reference.topk_compress(x, k, dtype)
            assert idx.dtype == torch.int32 and vals.dtype == dtype
            assert idx.numel() == k, name
            assert torch.equal(idx, ref_idx), f"{name} {dtype}: indices differ"
            assert torch.equal(vals, ref_vals), f"{name} {dtype}: values differ"


def test_topk_selects_largest_magnitudes_with_lower_index_on_ties():
    x = torch.tensor([1.0, -5.0, 2.0, 5.0, -2.0, 0.5])
    idx, vals = reference.topk_compress(x, 3, torch.float32)
    assert idx.tolist() == [1, 2, 3]  # |-5|, |5|, then the first of the tied |2|s
    assert vals.tolist() == [-5.0, 2.0, 5.0]


def test_fp16_values_saturate_instead_of_overflowing(native):
    x = torch.tensor([1e6, -1e6, 3.0, 1.0])
    for impl in (native, reference):
        _, vals = impl.topk_compress(x, 2, torch.float16)
        assert vals.tolist() == [65504.0, -65504.0]


def test_topk_k_zero_and_k_all(native):
    x = torch.randn(100)
    for impl in (native, reference):
        idx, vals = impl.topk_compress(x, 0, torch.float16)
        assert idx.numel() == 0 and vals.numel() == 0
        idx, vals = impl.topk_compress(x, 100, torch.float32)
        assert torch.equal(idx, torch.arange(100, dtype=torch.int32)) and torch.equal(vals, x)


@pytest.mark.parametrize("dtype", VALUE_DTYPES)
@pytest.mark.parametrize("scale", [1.0, 0.25, 1 / 3])
def test_topk_error_feedback_invariant_and_reference(native, dtype, scale):
    n, k = 200_003, 2_000
    g = torch.Generator().manual_seed(3)
    grad, residual0 = torch.randn(n, generator=g), torch.randn(n, generator=g) * 0.1
    res_native, res_ref = residual0.clone(), residual0.clone()
    idx, vals = native.topk_ef_compress(grad, res_native, k, dtype, scale)
    ref_idx, ref_vals = reference.topk_ef_compress(grad, res_ref, k, dtype, scale)
    assert torch.equal(idx, ref_idx) and torch.equal(vals, ref_vals)
    assert torch.equal(res_native, res_ref)
    # residual_after + sent == residual_before + scale*grad, exactly (Sterbenz: acc - round(acc) is exact)
    sent = torch.zeros(n)
    native.topk_decompress_add(sent, idx, vals, 1.0)
    accumulated = residual0 + grad * scale if scale != 1.0 else residual0 + grad
    assert torch.equal(res_native + sent, accumulated)


def test_topk_error_feedback_eventually_sends_everything(native):
    """Repeated EF rounds with a zero gradient drain the residual: nothing is lost, only delayed."""
    n, k = 10_000, 100
    grad = torch.randn(n)
    residual = torch.zeros(n)
    delivered = torch.zeros(n)
    zeros = torch.zeros(n)
    for step in range(n // k + 1):
        idx, vals = native.topk_ef_compress(grad if step == 0 else zeros, residual, k, torch.float32, 1.0)
        native.topk_decompress_add(delivered, idx, vals, 1.0)
    assert torch.equal(delivered, grad)
    assert residual.abs().max() == 0


def test_topk_decompress_add_rows_in_order(native):
    n, k, rows = 50_000, 700, 4
    g = torch.Generator().manual_seed(5)
    idx = torch.stack([torch.randperm(n, generator=g)[:k].sort().values.int() for _ in range(rows)])
    vals = torch.randn(rows, k, generator=g).half()
    base = torch.randn(n, generator=g)
    for alpha in (1.0, 0.25):
        out_n, out_r = base.clone(), base.clone()
        native.topk_decompress_add(out_n, idx, vals, alpha)
        reference.topk_decompress_add(out_r, idx, vals, alpha)
        assert torch.equal(out_n, out_r)
    with pytest.raises(RuntimeError, match="out of range"):
        native.topk_decompress_add(torch.zeros(10), torch.tensor([10], dtype=torch.int32), torch.ones(1), 1.0)


@pytest.mark.parametrize("n", [1, 9, 4096, 100_003])
@pytest.mark.parametrize("chunk", [8, 4096])
def test_sign_compress_matches_reference(native, n, chunk):
    for name, x in gradients(n, seed=11).items():
        bits, scales = native.sign_compress(x, chunk)
        ref_bits, ref_scales = reference.sign_compress(x, chunk)
        assert bits.dtype == torch.uint8 and bits.numel() == (n + 7) // 8
        assert scales.numel() == (n + chunk - 1) // chunk
        assert torch.equal(bits, ref_bits), name
        assert torch.equal(scales, ref_scales), name


def test_sign_bits_are_one_per_element_little_endian():
    bits, scales = reference.sign_compress(torch.tensor([-1.0, 2.0, -3.0, 4.0, 0.0, -0.5, 1.0, 1.0, -2.0]), 8)
    assert bits.tolist() == [0b00100101, 0b00000001]
    assert scales.tolist() == pytest.approx([(1 + 2 + 3 + 4 + 0 + 0.5 + 1 + 1) / 8, 2.0])


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_sign_error_feedback_matches_reference_and_conserves(native, scale):
    n, chunk = 100_003, 4096
    g = torch.Generator().manual_seed(7)
    grad, residual0 = torch.randn(n, generator=g), torch.randn(n, generator=g) * 0.1
    res_native, res_ref = residual0.clone(), residual0.clone()
    bits, scales = native.sign_ef_compress(grad, res_native, chunk, scale)
    ref_bits, ref_scales = reference.sign_ef_compress(grad, res_ref, chunk, scale)
    assert torch.equal(bits, ref_bits) and torch.equal(scales, ref_scales)
    assert torch.equal(res_native, res_ref)
    sent = torch.zeros(n)
    native.sign_decompress_add(sent, bits, scales, chunk, 1.0)
    torch.testing.assert_close(res_native + sent, residual0 + grad * scale, rtol=0, atol=1e-6)


def test_sign_decompress_add_rows_match_reference(native):
    n, chunk, rows = 70_001, 512, 3
    g = torch.Generator().manual_seed(9)
    bits = torch.randint(0, 256, (rows, (n + 7) // 8), generator=g, dtype=torch.uint8)
    scales = torch.rand(rows, (n + chunk - 1) // chunk, generator=g)
    for alpha in (1.0, 1 / 3):
        out_n, out_r = torch.ones(n), torch.ones(n)
        native.sign_decompress_add(out_n, bits, scales, chunk, alpha)
        reference.sign_decompress_add(out_r, bits, scales, chunk, alpha)
        assert torch.equal(out_n, out_r)


def test_ef_update_matches_reference(native):
    g = torch.Generator().manual_seed(13)
    r, grad, dec = (torch.randn(10_001, generator=g) for _ in range(3))
    for scale in (1.0, 0.125, 0.3):
        a, b = r.clone(), r.clone()
        native.ef_update(a, grad, dec, scale)
        reference.ef_update(b, grad, dec, scale)
        assert torch.equal(a, b)


def test_public_wrappers_take_density(native):
    x = torch.randn(1000)
    idx, vals = native_ops.topk_compress(x, 0.05)
    assert idx.numel() == 50 and vals.dtype == torch.float16
    with pytest.raises(ValueError):
        native_ops.topk_compress(x, 0.05, k=3)
    with pytest.raises(ValueError):
        native_ops.k_for_density(10, 1.5)


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_import_compiles_nothing(tmp_path):
    proc = _python("import native_ops; print(native_ops.backend())", CANN_TRAIN_EXT_DIR=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "unloaded"
    assert list(tmp_path.iterdir()) == []


def test_falls_back_to_reference_with_reason_when_compiler_missing(tmp_path):
    code = (
        "import torch, native_ops\n"
        "idx, vals = native_ops.topk_compress(torch.arange(10.0), k=2)\n"
        "print(native_ops.backend(), idx.tolist(), '|', native_ops.fallback_reason())\n"
    )
    proc = _python(code, CANN_TRAIN_EXT_DIR=str(tmp_path), CXX="/nonexistent/c++")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("reference [8, 9] |")
    assert "compiler" in proc.stdout and "using the pure-torch reference" in proc.stderr
