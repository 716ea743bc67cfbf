"""Collective helpers of the hooks.

The two single-tensor collectives the hooks use, under their torch 2.13 names (``all_gather_single``,
``reduce_scatter_single``; earlier releases call them ``*_into_tensor`` / ``*_tensor``). Outputs are flat:
gloo checks the output is exactly ``W * input.numel()`` elements, 1-D."""

from __future__ import annotations

import queue
import threading

import torch
import torch.distributed as dist

_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_gather_rows(packed: torch.Tensor, group, async_op: bool = False):
    """Gather a 1-D ``packed`` from every rank; returns (work or None, tensor of shape [W, numel])."""
    world = dist.get_world_size(group)
    flat = packed.new_empty(world * packed.numel())
    work = _all_gather_single(flat, packed, group=group, async_op=async_op)
    return work, flat.view(world, packed.numel())


def all_gather_flat(output: torch.Tensor, shard: torch.Tensor, group) -> None:
    _all_gather_single(output, shard, group=group)


def reduce_scatter_flat(shard: torch.Tensor, full: torch.Tensor, group) -> None:
    _reduce_scatter_single(shard, full, group=group)


class SerialCommWorker:
    """Runs multi-collective bucket jobs one at a time, in submission (= bucket) order, on one thread.

    gloo matches collectives by the order they are issued on a group. A hook that issues its second
    collective from a completion callback (PowerSGD, a hierarchical all-reduce) lets two buckets' calls
    interleave differently on different ranks: a mismatch, then a crash or wrong sums. Here each job
    issues all its collectives, blocking, before the next job starts; the thread still runs alongside
    backward, so communication keeps overlapping computation."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, fut = job
            try:
                fut.set_result(fn())
            except Exception as exc:  # surfaces in DDP's wait on the future
                fut.set_exception(exc)

    def submit(self, fn) -> torch.futures.Future:
        """Schedule ``fn()`` (blocking, returns the bucket tensor); returns a future of its result."""
        fut: torch.futures.Future = torch.futures.Future()
        self._jobs.put((fn, fut))
        return fut

    def close(self, timeout: float = 10.0) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=timeout)


def row_slice_as(rows: torch.Tensor, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
    """Bytes ``[start, stop)`` of every row of a [W, m] uint8 tensor, reinterpreted as ``dtype``.

    Always copies into a fresh buffer: a row stride of ``m`` bytes is not a multiple of 4 in general,
    and ``.contiguous()`` would not copy a single-row tensor (then ``.view(int32)`` fails)."""
    out = torch.empty((rows.shape[0], stop - start), dtype=torch.uint8, device=rows.device)
    out.copy_(rows[:, start:stop])
    return out.view(dtype)
