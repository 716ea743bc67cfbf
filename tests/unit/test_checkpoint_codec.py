"""The snapshot frame codecs are lossless: full and delta frames decode to the exact bytes, for every dtype
and size (empty, scalars, several shuffle chunks), and a delta depends on its very base."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zstandard

from workers.training.checkpoint import codec
from workers.training.checkpoint.storage import tensor_bytes


def encode(data: np.ndarray, width: int, base: np.ndarray | None = None) -> bytes:
    return b"".join(codec.FrameEncoder(level=1).encode(data, width, base))


TENSORS = {
    "float32": torch.randn(1000) * 0.02,
    "bfloat16": torch.randn(333, 3).bfloat16(),
    "int64": torch.arange(-50, 77, dtype=torch.int64),
    "uint8 rng state": torch.get_rng_state(),
    "scalar step": torch.tensor(17.0),
    "empty": torch.empty(0, 4),
    "odd bytes": torch.randint(0, 255, (1001,), dtype=torch.uint8),
}


@pytest.mark.parametrize("name", list(TENSORS))
def test_full_frame_round_trips_bit_for_bit(name):
    t = TENSORS[name].contiguous()
    raw = tensor_bytes(t)
    frame = encode(raw, t.element_size())
    out = codec.decode(frame, raw.size, t.element_size(), codec.FULL)
    assert out.tobytes() == raw.tobytes()


@pytest.mark.parametrize("name", list(TENSORS))
def test_delta_frame_round_trips_against_its_base(name):
    t = TENSORS[name].contiguous()
    changed = t.clone()
    if changed.numel():
        changed.view(-1)[::7] = changed.view(-1)[::7] + 1  # some elements change, most do not
    raw, base = tensor_bytes(changed), tensor_bytes(t)
    frame = encode(raw, t.element_size(), base)
    out = codec.decode(frame, raw.size, t.element_size(), codec.DELTA, base)
    assert out.tobytes() == raw.tobytes()


def test_chunks_are_shuffled_independently_and_reassembled(monkeypatch):
    monkeypatch.setattr(codec, "CHUNK_BYTES", 64)  # 1000 floats = 63 chunks, the last one short
    t = torch.randn(1000)
    base = tensor_bytes(t + 1e-3)
    raw = tensor_bytes(t)
    for frame_codec, b in ((codec.FULL, None), (codec.DELTA, base)):
        frame = encode(raw, 4, b)
        assert codec.decode(frame, raw.size, 4, frame_codec, b).tobytes() == raw.tobytes()


def test_an_unchanged_tensor_costs_almost_nothing_as_a_delta():
    raw = tensor_bytes(torch.randn(1 << 18))  # 1 MiB of random floats
    full, delta = encode(raw, 4), encode(raw, 4, raw.copy())
    assert len(full) > 0.7 * raw.size  # random mantissas do not compress
    assert len(delta) < 0.01 * raw.size


def test_shuffling_helps_zstd_on_float_weights():
    raw = tensor_bytes(torch.randn(1 << 18) * 0.02)
    plain = codec.FrameEncoder(1).encode_bytes(raw.tobytes())
    assert len(encode(raw, 4)) < 0.95 * len(plain)


def test_a_delta_decoded_against_another_base_gives_other_bytes():
    t = torch.randn(4096)
    raw, base = tensor_bytes(t), tensor_bytes(t * 1.001)
    frame = encode(raw, 4, base)
    wrong = tensor_bytes(t * 0.999)
    assert codec.decode(frame, raw.size, 4, codec.DELTA, wrong).tobytes() != raw.tobytes()
    with pytest.raises(ValueError, match="base"):
        codec.decode(frame, raw.size, 4, codec.DELTA, None)


def test_a_truncated_frame_is_an_error_not_garbage():
    raw = tensor_bytes(torch.randn(4096))
    frame = encode(raw, 4)
    with pytest.raises(zstandard.ZstdError, match="did not decompress full frame"):
        codec.decode(frame[: len(frame) // 2], raw.size, 4, codec.FULL)
