"""Pure-torch kernels: the fallback when the C++ extension cannot be built, the test oracle, and the
device path (CUDA, NPU, and buckets that are not float32).

Every function has the same signature and the same bit-exact semantics as its counterpart in
``csrc/compress.cpp`` (see the header comment there); ``tests/unit/test_native_ops.py`` and
``tests/unit/test_compression_device.py`` compare them. Multiplications by ``scale``/``alpha`` are done
as a separate multiply then add (two roundings), as the C++ code (built with ``-ffp-contract=off``) does,
so results match bit for bit.

Device-generic: only torch ops, every tensor made here is made on the input's device, and nothing goes
through the host except the sizes ``torch.nonzero`` returns (one sync per top-k, one per decode's range
check). Gradients may be float16/bfloat16/float32: error feedback and decoding accumulate in float32 (the
residual is float32) and round into a lower-precision ``out`` once, at the end.
"""

from __future__ import annotations

import torch

FP16_MAX = 65504.0


def _accumulate(residual: torch.Tensor, grad: torch.Tensor, scale: float) -> torch.Tensor:
    """``residual + scale * grad`` in float32 with two roundings (no fused multiply-add)."""
    grad = grad.float()  # no copy for float32
    return residual + grad * scale if scale != 1.0 else residual + grad


def _cast_values(values: torch.Tensor, value_dtype: torch.dtype) -> torch.Tensor:
    if value_dtype == torch.float16:
        return values.clamp(-FP16_MAX, FP16_MAX).to(torch.float16)  # saturate instead of inf
    if value_dtype in (torch.bfloat16, torch.float32):
        return values.to(value_dtype)
    raise ValueError("value dtype must be float32, float16 or bfloat16")


def topk_select(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (int32, ascending) of the k largest |x|; ties at the k-th magnitude go to lower indices."""
    n = x.numel()
    k = max(0, min(int(k), n))
    if k == n:
        return torch.arange(n, dtype=torch.int32, device=x.device)
    if k == 0:
        return torch.empty(0, dtype=torch.int32, device=x.device)
    mag = x.abs()
    kth = torch.topk(mag, k, sorted=False).values.min()
    above = torch.nonzero(mag > kth).flatten()
    ties = torch.nonzero(mag == kth).flatten()[: k - above.numel()]
    return torch.cat([above, ties]).sort().values.to(torch.int32)


def topk_compress(x: torch.Tensor, k: int, value_dtype: torch.dtype) -> list[torch.Tensor]:
    idx = topk_select(x, k)
    return [idx, _cast_values(x[idx.long()], value_dtype)]


def topk_ef_compress(
    grad: torch.Tensor, residual: torch.Tensor, k: int, value_dtype: torch.dtype, scale: float
) -> list[torch.Tensor]:
    acc = _accumulate(residual, grad, scale)
    idx = topk_select(acc, k)
    li = idx.long()
    vals = _cast_values(acc[li], value_dtype)
    acc[li] = acc[li] - vals.float()
    residual.copy_(acc)
    return [idx, vals]


def _float32_target(out: torch.Tensor) -> torch.Tensor:
    """Where decoding accumulates: ``out`` itself if float32, else a float32 copy (copied back once)."""
    return out if out.dtype == torch.float32 else out.float()


def topk_decompress_add(out: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor, alpha: float) -> None:
    k = idx.shape[-1]
    # The messages may arrive elsewhere than `out` (a gathered buffer copied to the host): decode on `out`.
    rows_i = idx.to(out.device).reshape(-1, k).long()
    rows_v = vals.to(out.device, torch.float32).reshape(-1, k)
    if rows_i.numel() and bool(((rows_i < 0) | (rows_i >= out.numel())).any()):
        raise RuntimeError("top-k index out of range")
    acc = _float32_target(out)
    for ri, rv in zip(rows_i, rows_v, strict=True):  # rows in order; indices within a row are unique
        acc.index_add_(0, ri, rv * alpha if alpha != 1.0 else rv)
    if acc is not out:
        out.copy_(acc)


def _chunk_scales(x: torch.Tensor, chunk: int) -> torch.Tensor:
    n = x.numel()
    nchunks = (n + chunk - 1) // chunk
    padded = torch.zeros(nchunks * chunk, dtype=torch.float64, device=x.device)
    padded[:n] = x.abs().double()
    lengths = torch.full((nchunks,), float(chunk), dtype=torch.float64, device=x.device)
    lengths[-1] = n - (nchunks - 1) * chunk
    return (padded.view(nchunks, chunk).sum(1) / lengths).float()


def _bit_positions(device: torch.device) -> torch.Tensor:
    return torch.arange(8, dtype=torch.uint8, device=device)


def _pack_bits(neg: torch.Tensor) -> torch.Tensor:
    n = neg.numel()
    padded = torch.zeros((n + 7) // 8 * 8, dtype=torch.uint8, device=neg.device)
    padded[:n] = neg.to(torch.uint8)
    return (padded.view(-1, 8) << _bit_positions(neg.device)).sum(1, dtype=torch.uint8)


def _unpack_bits(bits: torch.Tensor, n: int) -> torch.Tensor:
    return ((bits[:, None] >> _bit_positions(bits.device)) & 1).flatten()[:n].bool()


def _check_chunk(chunk: int) -> None:
    if chunk <= 0 or chunk % 8:
        raise RuntimeError("chunk must be a positive multiple of 8")


def sign_compress(x: torch.Tensor, chunk: int) -> list[torch.Tensor]:
    _check_chunk(chunk)
    return [_pack_bits(x < 0), _chunk_scales(x, chunk)]


def _sign_values(neg: torch.Tensor, scales: torch.Tensor, chunk: int) -> torch.Tensor:
    per_elem = scales.repeat_interleave(chunk)[: neg.numel()]
    return torch.where(neg, -per_elem, per_elem)


def sign_ef_compress(
    grad: torch.Tensor, residual: torch.Tensor, chunk: int, scale: float
) -> list[torch.Tensor]:
    _check_chunk(chunk)
    acc = _accumulate(residual, grad, scale)
    neg = acc < 0
    scales = _chunk_scales(acc, chunk)
    residual.copy_(acc - _sign_values(neg, scales, chunk))
    return [_pack_bits(neg), scales]


def sign_decompress_add(
    out: torch.Tensor, bits: torch.Tensor, scales: torch.Tensor, chunk: int, alpha: float
) -> None:
    _check_chunk(chunk)
    n = out.numel()
    nbytes, nchunks = (n + 7) // 8, (n + chunk - 1) // chunk
    rows_bits = bits.to(out.device).reshape(-1, nbytes)
    rows_scales = scales.to(out.device).reshape(-1, nchunks)
    acc = _float32_target(out)
    for row_bits, row_scales in zip(rows_bits, rows_scales, strict=True):  # rows in order
        s = row_scales * alpha if alpha != 1.0 else row_scales
        acc.add_(_sign_values(_unpack_bits(row_bits, n), s, chunk))
    if acc is not out:
        out.copy_(acc)


def ef_update(residual: torch.Tensor, grad: torch.Tensor, decompressed: torch.Tensor, scale: float) -> None:
    residual.copy_(_accumulate(residual, grad, scale) - decompressed)
