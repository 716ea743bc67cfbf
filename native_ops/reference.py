"""Pure-torch reference kernels: the fallback when the C++ extension cannot be built, and the test oracle.

Every function has the same signature and the same bit-exact semantics as its counterpart in
``csrc/compress.cpp`` (see the header comment there); ``tests/unit/test_native_ops.py`` compares them.
Multiplications by ``scale``/``alpha`` are done as a separate multiply then add (two roundings), as the
C++ code (built with ``-ffp-contract=off``) does, so results match bit for bit.
"""

from __future__ import annotations

import torch

FP16_MAX = 65504.0


def _accumulate(residual: torch.Tensor, grad: torch.Tensor, scale: float) -> torch.Tensor:
    """``residual + scale * grad`` with two roundings (no fused multiply-add)."""
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
        return torch.arange(n, dtype=torch.int32)
    if k == 0:
        return torch.empty(0, dtype=torch.int32)
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


def topk_decompress_add(out: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor, alpha: float) -> None:
    k = idx.shape[-1]
    rows_i = idx.reshape(-1, k)
    rows_v = vals.float().reshape(-1, k)
    for ri, rv in zip(rows_i, rows_v, strict=True):
        if ri.numel() and (int(ri.min()) < 0 or int(ri.max()) >= out.numel()):
            raise RuntimeError("top-k index out of range")
        out.index_add_(0, ri.long(), rv * alpha if alpha != 1.0 else rv)


def _chunk_scales(x: torch.Tensor, chunk: int) -> torch.Tensor:
    n = x.numel()
    nchunks = (n + chunk - 1) // chunk
    padded = torch.zeros(nchunks * chunk, dtype=torch.float64)
    padded[:n] = x.abs().double()
    lengths = torch.full((nchunks,), float(chunk), dtype=torch.float64)
    lengths[-1] = n - (nchunks - 1) * chunk
    return (padded.view(nchunks, chunk).sum(1) / lengths).float()


_BIT_WEIGHTS = (1 << torch.arange(8)).to(torch.uint8)


def _pack_bits(neg: torch.Tensor) -> torch.Tensor:
    n = neg.numel()
    padded = torch.zeros((n + 7) // 8 * 8, dtype=torch.uint8)
    padded[:n] = neg.to(torch.uint8)
    return (padded.view(-1, 8) * _BIT_WEIGHTS).sum(1, dtype=torch.uint8)


def _unpack_bits(bits: torch.Tensor, n: int) -> torch.Tensor:
    return ((bits[:, None] >> torch.arange(8, dtype=torch.uint8)) & 1).flatten()[:n].bool()


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
    for row_bits, row_scales in zip(bits.reshape(-1, nbytes), scales.reshape(-1, nchunks), strict=True):
        s = row_scales * alpha if alpha != 1.0 else row_scales
        out.add_(_sign_values(_unpack_bits(row_bits, n), s, chunk))


def ef_update(residual: torch.Tensor, grad: torch.Tensor, decompressed: torch.Tensor, scale: float) -> None:
    residual.copy_(_accumulate(residual, grad, scale) - decompressed)


def openmp_max_threads() -> int:
    return torch.get_num_threads()
