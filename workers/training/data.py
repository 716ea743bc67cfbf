"""Deterministic, data-parallel-sharded, resumable token stream.

Default source: the running interpreter's standard-library ``.py`` sources (every machine with Python has
them, no download), read as bytes: byte-level tokens, vocabulary 256. ``data`` may instead point at a file
or a directory of files: raw files are byte tokens, ``.npy`` files hold token ids.

Files are concatenated (sorted by relative path) into one virtual stream and cut into non-overlapping
samples of ``seq_length + 1`` tokens (inputs + shifted labels). Each epoch visits the samples in a
permutation seeded by ``(seed, epoch)``. Step ``s`` uses the global sample indices
``[s*B, (s+1)*B)`` (``B`` = global batch) and data-parallel rank ``r`` takes the ``r``-th contiguous slice of
them, so any ``dp`` sees the same global batch in the same order as a single process: the state to
resume from is one integer, ``consumed_samples``.
"""

from __future__ import annotations

import bisect
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


def stdlib_files() -> list[Path]:
    """The ``.py`` files of this interpreter's standard library (not site-packages), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__")
        )
        files += [Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py")]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def user_files(path: str | Path) -> list[Path]:
    path = Path(path)
    if path.is_file():
        return [path]
    if path.is_dir():
        # hidden files and folders left out: .cann-tokens (a tokenized corpus's cache) among them
        files = sorted(
            (
                p
                for p in path.rglob("*")
                if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
            ),
            key=lambda p: p.relative_to(path).as_posix(),
        )
        if files:
            return files
        raise FileNotFoundError(f"data directory {path} has no files")
    raise FileNotFoundError(f"data path {path} does not exist")


class TokenCorpus:
    """Random access into the concatenation of token files without loading them."""

    def __init__(self, files: list[Path]):
        self.files = files
        self._arrays: dict[int, np.ndarray] = {}
        sizes = [
            self._open(i).shape[0] if f.suffix == ".npy" else f.stat().st_size for i, f in enumerate(files)
        ]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    @classmethod
    def from_source(cls, data: str | None) -> TokenCorpus:
        return cls(stdlib_files() if data is None else user_files(data))

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def _open(self, i: int) -> np.ndarray:
        if i not in self._arrays:
            f = self.files[i]
            self._arrays[i] = np.load(f, mmap_mode="r") if f.suffix == ".npy" else np.memmap(f, np.uint8, "r")
        return self._arrays[i]

    def read(self, start: int, length: int) -> np.ndarray:
        out = np.empty(length, dtype=np.int64)
        filled = 0
        i = bisect.bisect_right(self.offsets, start) - 1
        while filled < length:
            local = start + filled - int(self.offsets[i])
            take = min(length - filled, int(self.offsets[i + 1]) - int(self.offsets[i]) - local)
            if take > 0:
                out[filled : filled + take] = self._open(i)[local : local + take]
                filled += take
            i += 1
        return out

    def max_token(self) -> int:
        return max(
            int(self._open(i).max()) for i in range(len(self.files)) if self.offsets[i + 1] > self.offsets[i]
        )


@dataclass
class DataLoaderState:
    consumed_samples: int = 0
    """Global samples (sequences) consumed: step * global_batch_size. The whole resume state."""


class ShardedTokenLoader:
    """Yields ``(inputs, labels)`` of shape ``[global_batch / dp_size, seq_length]`` for one DP rank."""

    def __init__(
        self,
        corpus: TokenCorpus,
        seq_length: int,
        global_batch_size: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        seed: int = 0,
        consumed_samples: int = 0,
    ):
        if global_batch_size % dp_size:
            raise ValueError(f"global batch {global_batch_size} not divisible by dp {dp_size}")
        self.corpus, self.seq_length, self.seed = corpus, seq_length, seed
        self.global_batch_size, self.dp_rank, self.dp_size = global_batch_size, dp_rank, dp_size
        self.num_samples = (corpus.num_tokens - 1) // seq_length
        if self.num_samples < global_batch_size:
            raise ValueError(
                f"corpus has {corpus.num_tokens} tokens: fewer than one global batch of "
                f"{global_batch_size} x {seq_length + 1}"
            )
        self.state = DataLoaderState(consumed_samples)
        self._epoch, self._order = -1, None

    def _sample_index(self, global_index: int) -> int:
        epoch, pos = divmod(global_index, self.num_samples)
        if epoch != self._epoch:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._order, self._epoch = torch.randperm(self.num_samples, generator=gen).numpy(), epoch
        return int(self._order[pos])

    def sample(self, global_index: int) -> np.ndarray:
        return self.corpus.read(self._sample_index(global_index) * self.seq_length, self.seq_length + 1)

    def global_indices_for_rank(self, consumed: int) -> range:
        per_rank = self.global_batch_size // self.dp_size
        start = consumed + self.dp_rank * per_rank
        return range(start, start + per_rank)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [self.sample(g) for g in self.global_indices_for_rank(self.state.consumed_samples)]
        self.state.consumed_samples += self.global_batch_size
        tokens = torch.from_numpy(np.stack(rows))
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def __iter__(self):
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict:
        return {"consumed_samples": self.state.consumed_samples}

    def load_state_dict(self, state: dict) -> None:
        self.state = DataLoaderState(int(state["consumed_samples"]))
