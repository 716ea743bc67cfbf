"""torch's own DDP comm hooks (``allreduce``, ``fp16``, ``bf16``, ``powerSGD``), wrapped, not rewritten,
so they report the same per-step ``comm_stats()`` and checkpoint like ours.

- fp16/bf16: cast the bucket, all-reduce, cast back (``torch.distributed.algorithms.ddp_comm_hooks.default_hooks``).
- PowerSGD: rank-r low-rank approximation with error feedback (Vogels et al. 2019, PowerSGD), torch's
  ``powerSGD_hook``/``batched_powerSGD_hook``. Its byte count is computed from torch's own decision rule
  (``_should_compress``): P (rows x r) and Q (cols x r) for compressed matrices, everything else dense.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

from workers.training.comm.collectives import SerialCommWorker
from workers.training.comm.stats import CommStats, ring_all_reduce_wire_bytes, timed


class TorchHookState:
    """Wraps a torch hook's own state (the process group, or a ``PowerSGDState``)."""

    def run_inner(self, bucket) -> torch.futures.Future:
        return self.inner_hook(self.inner_state, bucket)

    def close(self) -> None:
        return None

    def __init__(self, name: str, process_group, inner_hook, inner_state, bytes_per_element: int) -> None:
        self.name = name
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.inner_hook = inner_hook
        self.inner_state = inner_state
        self.bytes_per_element = bytes_per_element
        self.stats = CommStats()

    def comm_stats(self) -> dict[str, float]:
        return self.stats.comm_stats()

    def payload_bytes(self, bucket) -> int:
        return bucket.buffer().numel() * self.bytes_per_element

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None


class PowerSGDHookState(TorchHookState):
    """torch's PowerSGD issues its second and third all-reduce from completion callbacks; with several
    buckets on gloo those interleave differently on different ranks (observed: ``Received data size
    doesn't match expected size``). Each bucket's whole hook therefore runs on a ``SerialCommWorker``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._worker = SerialCommWorker("powersgd")

    def run_inner(self, bucket) -> torch.futures.Future:
        return self._worker.submit(lambda: self.inner_hook(self.inner_state, bucket).wait())

    def close(self) -> None:
        self._worker.close()

    def payload_bytes(self, bucket) -> int:
        st: psgd.PowerSGDState = self.inner_state
        if st.iter < st.start_powerSGD_iter:
            return bucket.buffer().numel() * 4  # vanilla all-reduce during warm-up
        r = st.matrix_approximation_rank
        total = 0
        for grad in bucket.gradients():
            if grad.ndimension() <= 1:
                total += grad.numel() * 4
                continue
            rows, cols = grad.shape[0], math.prod(grad.shape[1:])
            r_eff = min(rows, cols, r)
            compress, dense_elems, compressed_elems = psgd._should_compress(
                rows, cols, r_eff, st.min_compression_rate
            )
            total += (compressed_elems if compress else dense_elems) * 4
        return total

    def state_dict(self) -> dict:
        # PowerSGDState pickles itself without its process group (torch >= 1.13).
        return {"powersgd": self.inner_state.__getstate__()}

    def load_state_dict(self, state: dict) -> None:
        self.inner_state.__setstate__(state["powersgd"])
        self.inner_state.process_group = self.process_group


def torch_hook(state: TorchHookState, bucket):
    payload = state.payload_bytes(bucket)
    n = bucket.buffer().numel()
    return timed(
        state.stats,
        bucket,
        lambda: state.run_inner(bucket),
        bytes_sent=payload,
        wire_bytes=ring_all_reduce_wire_bytes(payload, state.world_size),
        dense_bytes=4 * n,
    )


def _no_options(name: str, options: dict | None) -> None:
    if options:
        raise ValueError(f"{name}: takes no options, got {sorted(options)}")


def make_allreduce(process_group, options: dict | None = None):
    _no_options("allreduce", options)
    return TorchHookState(
        "allreduce", process_group, default_hooks.allreduce_hook, process_group, 4
    ), torch_hook


def make_fp16(process_group, options: dict | None = None):
    _no_options("fp16", options)
    return TorchHookState(
        "fp16", process_group, default_hooks.fp16_compress_hook, process_group, 2
    ), torch_hook


def make_bf16(process_group, options: dict | None = None):
    _no_options("bf16", options)
    return TorchHookState(
        "bf16", process_group, default_hooks.bf16_compress_hook, process_group, 2
    ), torch_hook


POWERSGD_OPTIONS = {
    "matrix_approximation_rank",
    "start_powerSGD_iter",
    "min_compression_rate",
    "use_error_feedback",
    "warm_start",
    "orthogonalization_epsilon",
    "random_seed",
    "batch_tensors_with_same_shape",
}


def make_powersgd(process_group, options: dict | None = None):
    """Options: those of ``PowerSGDState`` (rank 1 and start at step 2 by default here: torch's default
    start of 1000 vanilla steps is for long runs), plus ``batched`` (use ``batched_powerSGD_hook``)."""
    opts = dict(options or {})
    batched = bool(opts.pop("batched", False))
    unknown = set(opts) - POWERSGD_OPTIONS
    if unknown:
        raise ValueError(f"powerSGD: unknown options {sorted(unknown)}")
    opts.setdefault("matrix_approximation_rank", 1)
    opts.setdefault("start_powerSGD_iter", 2)  # torch requires >= 2 with error feedback
    inner = psgd.PowerSGDState(process_group=process_group, **opts)
    hook = psgd.batched_powerSGD_hook if batched else psgd.powerSGD_hook
    return PowerSGDHookState("powerSGD", process_group, hook, inner, 4), torch_hook
