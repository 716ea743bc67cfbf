"""Lossless frame codecs of the snapshot format: byte-shuffled zstd for a full snapshot's tensors, XOR
against the base snapshot's bytes then byte-shuffled zstd for a delta's.

Byte shuffle (Blosc's "shuffle" filter): the i-th byte of every element goes into plane i, so the
sign/exponent bytes of float32 values -- nearly constant, or all zero after an XOR with a close value --
sit together where zstd finds them. Tensors are processed in :data:`CHUNK_BYTES` pieces (bounded
temporaries), each shuffled on its own; all pieces of one tensor go into one zstd frame.

Pure numpy + ``zstandard``; no torch, no files: :mod:`.storage` decides where the bytes go.
"""

from __future__ import annotations

import numpy as np
import zstandard

CHUNK_BYTES = 8 << 20
"""Shuffle unit (a multiple of every element size); part of the format: decoding uses the same."""

FULL = "shuffle-zstd"
DELTA = "xor-shuffle-zstd"
BYTES = "zstd"
CODECS = (FULL, DELTA, BYTES)


def shuffle(src: np.ndarray, width: int, out: np.ndarray) -> np.ndarray:
    """Byte planes of ``src`` (uint8, a whole number of ``width``-byte elements) into ``out``."""
    if width == 1:
        out[:] = src
        return out
    planes = out.reshape(width, -1)
    for j in range(width):  # strided plane copies: ~4 GB/s here, 10x numpy's transpose copy
        planes[j] = src[j::width]
    return out


def unshuffle(src: np.ndarray, width: int, out: np.ndarray) -> np.ndarray:
    if width == 1:
        out[:] = src
        return out
    planes = src.reshape(width, -1)
    for j in range(width):
        out[j::width] = planes[j]
    return out


def xor_into(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out = a ^ b`` on uint8 arrays, eight bytes at a time where the length allows."""
    if a.size % 8 == 0:
        np.bitwise_xor(a.view(np.uint64), b.view(np.uint64), out=out.view(np.uint64))
    else:
        np.bitwise_xor(a, b, out=out)
    return out


class FrameEncoder:
    """Encodes tensors' bytes into zstd frames. One per writer thread (a zstd context is not shared)."""

    def __init__(self, level: int = 1):
        self.level = level
        self._cctx = zstandard.ZstdCompressor(level=level)
        self._scratch = np.empty(CHUNK_BYTES, dtype=np.uint8)
        self._xored = np.empty(CHUNK_BYTES, dtype=np.uint8)

    def encode(self, data: np.ndarray, width: int, base: np.ndarray | None = None):
        """Yield the compressed pieces of one frame of ``data`` (uint8, contiguous): byte-shuffled, and
        XORed with ``base`` (same length) first when given."""
        if base is not None and base.size != data.size:
            raise ValueError(f"delta base has {base.size} bytes, data {data.size}")
        comp = self._cctx.compressobj(size=data.size)
        for start in range(0, data.size, CHUNK_BYTES):
            piece = data[start : start + CHUNK_BYTES]
            n = piece.size
            if base is not None:
                piece = xor_into(piece, base[start : start + n], self._xored[:n])
            out = comp.compress(shuffle(piece, width, self._scratch[:n]))
            if out:
                yield out
        yield comp.flush()

    def encode_bytes(self, blob: bytes) -> bytes:
        return self._cctx.compress(blob)


def decode(
    frame: bytes | memoryview, raw_nbytes: int, width: int, codec: str, base: np.ndarray | None = None
) -> np.ndarray:
    """The raw bytes (uint8 array) of one frame. ``base``: the base frame's raw bytes, for a delta."""
    if codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r}")
    raw = zstandard.ZstdDecompressor().decompress(frame, max_output_size=max(raw_nbytes, 1))
    if len(raw) != raw_nbytes:
        raise ValueError(f"frame decodes to {len(raw)} bytes, expected {raw_nbytes}")
    shuffled = np.frombuffer(raw, dtype=np.uint8)
    if codec == BYTES:
        return shuffled
    out = np.empty(raw_nbytes, dtype=np.uint8)
    for start in range(0, raw_nbytes, CHUNK_BYTES):
        n = min(CHUNK_BYTES, raw_nbytes - start)
        unshuffle(shuffled[start : start + n], width, out[start : start + n])
    if codec == DELTA:
        if base is None or base.size != raw_nbytes:
            raise ValueError("a delta frame needs its base frame's bytes")
        xor_into(out, base, out)
    return out
