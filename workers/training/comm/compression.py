"""Error-feedback compression hooks for DDP: ``topk_ef`` and ``sign_ef``.

- top-k sparsification with error feedback and a density warm-up (Lin et al. 2018, Deep Gradient
  Compression; error feedback as in Seide et al. 2014 / Stich et al. 2018 "Sparsified SGD with memory").
- scaled sign compression with error feedback (Bernstein et al. 2018 signSGD; Karimireddy et al. 2019
  EF-SignSGD).

Each rank adds its (1/W-scaled) gradient to its residual, compresses the sum with a fused kernel
(``native_ops``: C++/OpenMP for CPU float32 buckets, torch ops on the bucket's device for CUDA/NPU or
bf16/fp16 buckets; the residual is float32), keeps what it did not send as the new residual, and
exchanges the compressed message with one ``all_gather_single`` (indices+values packed into one uint8
buffer: there is no sparse all-reduce; every rank then scatter-adds the W messages in rank order, so all
replicas get bit-identical gradients). When the sparse message would put more bytes on the wire than a
dense fp32 ring all-reduce (``k*bytes_per_entry*W >= 8n``, e.g. density 1.0), the bucket is all-reduced
densely instead, in the bucket's dtype, exactly as plain DDP does (divide by W, sum).

Hook functions take ``(state, bucket)`` without annotations: ``DistributedDataParallel`` checks the
annotations by identity, which postponed (string) annotations would fail.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

import native_ops
from workers.training.comm.collectives import all_gather_rows, row_slice_as
from workers.training.comm.stats import CommStats, all_gather_wire_bytes, ring_all_reduce_wire_bytes, timed

log = logging.getLogger(__name__)

VALUE_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def linear_density(step: int, *, target: float, start: float = 1.0, warmup_steps: int = 0) -> float:
    """Density at ``step``: linear from ``start`` to ``target`` over ``warmup_steps`` steps, then ``target``.

    DGC's warm-up (Lin et al. 2018, sec. 3.3) ramps sparsity up over the first epochs; the seed run used
    a linear 10% -> 90% sparsity ramp, i.e. ``start=0.9, target=0.1``."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return target
    return start + (target - start) * step / warmup_steps


def exponential_density(step: int, *, target: float, start: float = 0.25, warmup_steps: int = 0) -> float:
    """DGC's warm-up (Lin et al. 2018, sec. 3.3: density 25% -> 6.25% -> 1.5625% -> ... per epoch):
    geometric from ``start`` to ``target`` over ``warmup_steps`` steps, then ``target``."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return target
    return start * (target / start) ** (step / warmup_steps)


WARMUP_SCHEDULES = {"linear": linear_density, "exponential": exponential_density}

# DGC's warm-up (Lin et al. 2018, sec. 3.3) starts at 25 % density and shrinks it exponentially (x 1/4 per
# epoch: 25 % -> 6.25 % -> 1.5625 % -> 0.4 % -> 0.1 %): the default of a job's ``topk_ef`` that sets no
# ``warmup_steps``.
DGC_WARMUP_START_DENSITY = 0.25
# Share of the job's steps the default warm-up takes. Measured on comm-tiny (300 steps, 2 x 2 ranks, AdamW,
# density 1 %, clip_norm 0.25, seed 0; mean loss of the last 10 steps vs no warm-up, 2.4674): over 10 % of
# the steps +6.6 %, 20 % +2.6 %, 50 % +0.2 % -- a short ramp hurts under AdamW, half the run is neutral
# (docs/comm.md "Convergence of top-k + EF" saw the same: 60 of 300 steps +9.0 %, 150 of 300 +3.3 %).
DEFAULT_WARMUP_FRACTION = 0.5
# ... and at most DGC's own length: 4 epochs of ImageNet at batch 256 (Lin et al. 2018, sec. 3.3 and 5.1),
# 4 x 1.281M / 256 ~ 20,000 steps
DEFAULT_WARMUP_MAX_STEPS = 20_000


def default_warmup_steps(total_steps: int, fraction: float = DEFAULT_WARMUP_FRACTION) -> int:
    """Warm-up steps of a ``topk_ef`` job of ``total_steps`` steps that sets none: the first ``fraction``
    of its steps, at most ``DEFAULT_WARMUP_MAX_STEPS`` (at least 1 once the job has 2 steps; the last step
    always runs at the target density)."""
    if total_steps < 2:
        return 0
    return max(1, min(total_steps - 1, DEFAULT_WARMUP_MAX_STEPS, round(fraction * total_steps)))


@dataclass
class _BucketResidual:
    keys: tuple[str, ...]
    sizes: tuple[int, ...]
    flat: torch.Tensor


class ResidualStore:
    """Error-feedback residuals, stored flat per DDP bucket but keyed by parameter for checkpoints.

    DDP rebuilds its buckets after the first iteration, and a restarted job may bucket differently;
    keying by parameter name keeps the residual of every parameter across both."""

    def __init__(self) -> None:
        self._buckets: dict[int, _BucketResidual] = {}
        self._loose: dict[str, torch.Tensor] = {}
        self._names: dict[int, str] = {}

    def bind_parameter_names(self, module: torch.nn.Module) -> None:
        self._names = {id(p): name for name, p in module.named_parameters()}

    def _keys(self, bucket) -> tuple[str, ...]:
        return tuple(
            self._names.get(id(p), f"bucket{bucket.index()}.{j}") for j, p in enumerate(bucket.parameters())
        )

    def _dissolve(self, index: int) -> None:
        entry = self._buckets.pop(index)
        for key, piece in zip(entry.keys, entry.flat.split(list(entry.sizes)), strict=True):
            self._loose[key] = piece.clone()

    def for_bucket(self, bucket) -> torch.Tensor:
        buf = bucket.buffer()
        keys = self._keys(bucket)
        entry = self._buckets.get(bucket.index())
        if entry is not None and entry.keys == keys and entry.flat.numel() == buf.numel():
            return entry.flat
        for index in [i for i, e in self._buckets.items() if i == bucket.index() or set(e.keys) & set(keys)]:
            self._dissolve(index)
        sizes = tuple(local_numel(p) for p in bucket.parameters())
        flat = torch.zeros(buf.numel(), dtype=torch.float32, device=buf.device)
        if sum(sizes) == buf.numel():
            for key, piece in zip(keys, flat.split(list(sizes)), strict=True):
                old = self._loose.pop(key, None)
                if old is not None and old.numel() == piece.numel():
                    piece.copy_(old.reshape(-1))
        else:  # layout not one contiguous slice per parameter: keep one flat residual for the bucket
            keys, sizes = (f"bucket{bucket.index()}",), (buf.numel(),)
        self._buckets[bucket.index()] = _BucketResidual(keys, sizes, flat)
        return flat

    def add_to_parameter(self, key: str, size: int, start: int, values: torch.Tensor) -> None:
        """Add ``values`` to the residual of parameter ``key`` (``size`` elements) from element ``start``:
        in its bucket's flat residual if it has one now, else in its loose piece (taken up when its bucket
        is built). For residuals kept outside this store (the adaptive hook's shard residuals) whose
        bucket DDP re-bucketed."""
        for entry in self._buckets.values():
            if key in entry.keys:
                j = entry.keys.index(key)
                base = sum(entry.sizes[:j]) + start
                entry.flat[base : base + values.numel()] += values.to(entry.flat.device)
                return
        piece = self._loose.get(key)
        if piece is None or piece.numel() != size:
            piece = self._loose[key] = torch.zeros(size, dtype=torch.float32, device=values.device)
        piece[start : start + values.numel()] += values.to(piece.device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {k: v.clone() for k, v in self._loose.items()}
        for entry in self._buckets.values():
            for key, piece in zip(entry.keys, entry.flat.split(list(entry.sizes)), strict=True):
                out[key] = piece.clone()
        return out

    def load_state_dict(self, residuals: dict[str, torch.Tensor]) -> None:
        self._buckets.clear()
        self._loose = {k: v.detach().clone().reshape(-1).float() for k, v in residuals.items()}

    def norm(self) -> float:
        total = sum(float(e.flat.double().pow(2).sum()) for e in self._buckets.values())
        return total**0.5


class CompressionState:
    """Common part of the error-feedback hook states: group, step counter, residuals, statistics."""

    def __init__(self, process_group: dist.ProcessGroup | None) -> None:
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.step = 0
        self.residuals = ResidualStore()
        self.stats = CommStats()

    def comm_stats(self) -> dict[str, float]:
        return self.stats.comm_stats()

    def state_dict(self) -> dict:
        out = {"step": self.step, "residuals": self.residuals.state_dict()}
        if getattr(self, "momentum_buffers", None) is not None:
            out["momentum"] = self.momentum_buffers.state_dict()
        return out

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self.residuals.load_state_dict(state["residuals"])
        if getattr(self, "momentum_buffers", None) is not None:
            self.momentum_buffers.load_state_dict(state.get("momentum", {}))

    def _scale_in_place(self, buf: torch.Tensor) -> float:
        """Plain DDP divides the bucket by W before summing. For W a power of two, x * (1/W) == x / W
        exactly, so the division is fused into the kernel; otherwise divide here to keep parity."""
        w = self.world_size
        if w & (w - 1) == 0:
            return 1.0 / w
        buf.div_(w)
        return 1.0

    def _scale_and_flush(self, buf: torch.Tensor, residual: torch.Tensor) -> None:
        """In place: ``buf`` <- buf / W + what error feedback withheld, which is then zero (a bucket sent
        densely carries its whole residual)."""
        buf.div_(self.world_size).add_(residual)
        residual.zero_()

    def _dense_all_reduce(self, bucket, residual: torch.Tensor) -> torch.futures.Future:
        buf = bucket.buffer()
        self._scale_and_flush(buf, residual)
        work = dist.all_reduce(buf, group=self.process_group, async_op=True)
        return work.get_future().then(lambda f: f.value()[0])

    def _end_of_bucket(self, bucket) -> None:
        if bucket.is_last():
            self.step += 1


BUCKET_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_bucket(buf: torch.Tensor, hook: str) -> None:
    """Buckets may live on any device (``native_ops.kernels_for`` picks the kernels by device) and be
    fp32/bf16/fp16 (the residual is fp32 either way); other dtypes would lose precision in the residual."""
    if buf.dtype not in BUCKET_DTYPES:
        raise TypeError(
            f"{hook}: buckets must be float32, bfloat16 or float16 (got {buf.dtype} on {buf.device})"
        )


def option_bool(value) -> bool:
    """A boolean hook option: ``1``/``true``/``yes``/``on`` (any case) when given as a string."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


class DensitySchedule:
    """The top-k density warm-up of a hook state (``topk_ef``'s DDP hook, the FSDP2 reduce-scatter of
    ``topk_ef`` and of ``hierarchical`` with top-k across nodes). :meth:`_parse_schedule` pops its
    options: ``density`` (target, default 0.01), ``warmup_steps``, ``start_density``, ``warmup``
    (``linear``|``exponential``). Without ``warmup_steps``, DGC's exponential warm-up from 25 % over the
    job's first steps, once the runtime says how many (:meth:`plan_for_job`); an explicit
    ``warmup_steps`` (0 = off) keeps the linear-from-dense defaults. The state keeps a ``step`` counter."""

    def _parse_schedule(self, opts: dict, name: str) -> None:
        self.density = float(opts.pop("density", 0.01))
        warmup_steps, warmup, start = (opts.pop(k, None) for k in ("warmup_steps", "warmup", "start_density"))
        self.warmup_auto = warmup_steps is None
        self.warmup_steps = 0 if warmup_steps is None else int(warmup_steps)
        self.warmup = str(warmup if warmup is not None else "exponential" if self.warmup_auto else "linear")
        default_start = DGC_WARMUP_START_DENSITY if self.warmup_auto else 1.0
        self.start_density = float(start if start is not None else max(default_start, self.density))
        for d in (self.density, self.start_density):
            if not 0.0 < d <= 1.0:
                raise ValueError(f"{name}: densities must be in (0, 1], got {d}")
        if self.warmup not in WARMUP_SCHEDULES:
            raise ValueError(f"{name}: warmup must be one of {sorted(WARMUP_SCHEDULES)}")
        if self.warmup_steps < 0:
            raise ValueError(f"{name}: warmup_steps must be >= 0 (0 = no warm-up), got {self.warmup_steps}")

    def current_density(self) -> float:
        return WARMUP_SCHEDULES[self.warmup](
            self.step, target=self.density, start=self.start_density, warmup_steps=self.warmup_steps
        )

    def plan_for_job(self, total_steps: int) -> None:
        """Called by the runtime with the job's step count: without an explicit ``warmup_steps``, warm up
        over :func:`default_warmup_steps` of them (none when the target is not sparser than the start)."""
        if self.warmup_auto and self.density < self.start_density:
            self.warmup_steps = default_warmup_steps(int(total_steps))

    def schedule(self) -> dict:
        return {
            "density": self.density,
            "start_density": self.start_density,
            "warmup": self.warmup,
            "warmup_steps": self.warmup_steps,
            "auto": self.warmup_auto,
        }

    def _load_schedule(self, saved: dict | None) -> None:
        """A resumed job continues the schedule it started with (a default warm-up keeps the length it was
        planned with, even if this run was told another step count)."""
        if saved and self.warmup_auto and saved.get("auto", True):
            self.warmup_steps = int(saved["warmup_steps"])
            self.start_density = float(saved["start_density"])
            self.warmup = str(saved["warmup"])


class TopKState(DensitySchedule, CompressionState):
    """State of ``topk_ef``. Options: the schedule's (:class:`DensitySchedule`: ``density``,
    ``warmup_steps``, ``start_density``, ``warmup``), ``value_dtype`` (``fp16``|``bf16``|``fp32``),
    ``dense_fallback`` (True: all-reduce densely when that puts fewer bytes on the wire), and Deep Gradient
    Compression's (Lin et al. 2018, sec. 3.2) ``momentum`` (0 = off: momentum correction, accumulate
    ``u = m*u + g`` locally and sparsify the accumulated velocity instead of the gradient),
    ``momentum_masking`` (True: zero ``u`` where sent) and ``clip_norm`` (0 = off: local gradient clipping
    of each parameter's local gradient to ``clip_norm * W**-0.5`` before it enters the residual)."""

    def __init__(self, process_group, options: dict | None = None) -> None:
        super().__init__(process_group)
        opts = dict(options or {})
        self._parse_schedule(opts, "topk_ef")
        self.value_dtype = VALUE_DTYPES[str(opts.pop("value_dtype", "fp16"))]
        self.dense_fallback = option_bool(opts.pop("dense_fallback", True))
        self.momentum = float(opts.pop("momentum", 0.0))
        self.momentum_masking = option_bool(opts.pop("momentum_masking", True))
        self.clip_norm = float(opts.pop("clip_norm", 0.0))
        if opts:
            raise ValueError(f"topk_ef: unknown options {sorted(opts)}")
        if not 0.0 <= self.momentum < 1.0 or self.clip_norm < 0:
            raise ValueError("topk_ef: momentum must be in [0, 1) and clip_norm >= 0")
        self.momentum_buffers = ResidualStore() if self.momentum > 0 else None

    def comm_stats(self) -> dict[str, float]:
        out = super().comm_stats()
        out["density"] = density_of(out)
        return out

    def state_dict(self) -> dict:
        return {**super().state_dict(), "schedule": self.schedule()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._load_schedule(state.get("schedule"))


def density_of(figures: dict) -> float:
    """Share of the step's gradient elements a hook selected to send (1.0 for dense buckets), from the
    ``density_elements`` it counted and the dense fp32 bytes of the step."""
    elements = figures.get("dense_fp32_bytes", 0) / 4
    return float(figures.get("density_elements", 0.0)) / elements if elements else 1.0


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's piece of a tensor: a tensor-parallel DTensor's local shard (its ``numel()`` is the
    global size, while its gradient in a bucket is the local shard), any other tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def local_numel(param) -> int:
    return local_tensor(param).numel()


def parameter_segments(bucket) -> list[tuple[int, int]]:
    """(offset, numel) of each parameter's gradient inside the flat bucket (DDP lays them out back to back
    in ``bucket.parameters()`` order); one segment for the whole bucket if the layout is anything else."""
    sizes = [local_numel(p) for p in bucket.parameters()]
    n = bucket.buffer().numel()
    if sum(sizes) != n:
        return [(0, n)]
    offsets = [0]
    for size in sizes[:-1]:
        offsets.append(offsets[-1] + size)
    return list(zip(offsets, sizes, strict=True))


def topk_plan(
    bucket, density: float, value_dtype: torch.dtype
) -> tuple[list[tuple[int, int]], list[int], int]:
    """(parameter segments, k per segment, bytes per sent entry) of a top-k exchange at ``density``."""
    segments = parameter_segments(bucket)
    ks = [native_ops.k_for_density(size, density) for _, size in segments]
    return segments, ks, 4 + torch.finfo(value_dtype).bits // 8


def topk_ef_hook(state: TopKState, bucket):
    """Top-k is taken per parameter tensor (layer-wise, as DGC does), not per bucket: the selection then
    does not depend on how DDP happens to bucket (it re-buckets after step 0, and again after a restart),
    so a resumed job reproduces an uninterrupted one bit for bit."""
    buf = bucket.buffer()
    check_bucket(buf, "topk_ef")
    n, w = buf.numel(), state.world_size
    density = state.current_density()
    segments, ks, entry_bytes = topk_plan(bucket, density, state.value_dtype)
    k = sum(ks)
    residual = state.residuals.for_bucket(bucket)
    velocity = state.momentum_buffers.for_bucket(bucket) if state.momentum_buffers is not None else None
    dense = state.dense_fallback and k * entry_bytes * w >= 8 * n  # all-gather wire >= ring all-reduce wire

    if dense:
        payload = 4 * n
        wire = ring_all_reduce_wire_bytes(payload, w)

        def launch():
            if state.clip_norm > 0 or velocity is not None:
                _dgc_local(state, buf, segments, velocity)
                if velocity is not None and state.momentum_masking:
                    velocity.zero_()  # everything is sent: mask all of it
            return state._dense_all_reduce(bucket, residual)
    else:
        payload = k * entry_bytes
        wire = all_gather_wire_bytes(payload, w)

        def launch():
            return topk_exchange(state, buf, residual, velocity, segments, ks)

    fut = timed(state.stats, bucket, launch, bytes_sent=payload, wire_bytes=wire, dense_bytes=4 * n)
    state.stats.add("density_elements", density * n)
    state._end_of_bucket(bucket)
    return fut


def topk_exchange(state, buf, residual, velocity, segments, ks, after_local=None) -> torch.futures.Future:
    """DGC's local steps, then per-parameter top-k of (gradient + residual) into one packed message (int32
    indices, then values in ``state.value_dtype``), all-gathered and scatter-added into ``buf`` in rank
    order. ``state`` gives ``world_size``, ``process_group``, ``value_dtype``, ``clip_norm``, ``momentum``,
    ``momentum_masking``. ``after_local(buf)`` sees the gradient that enters error feedback (unscaled)."""
    if state.clip_norm > 0 or velocity is not None:
        _dgc_local(state, buf, segments, velocity)
    if after_local is not None:
        after_local(buf)
    k = sum(ks)
    payload = k * (4 + torch.finfo(state.value_dtype).bits // 8)
    scale = state._scale_in_place(buf)
    idx_parts, val_parts = [], []
    for (offset, size), k_param in zip(segments, ks, strict=True):
        idx, vals = native_ops.topk_ef_compress(
            buf[offset : offset + size],
            residual[offset : offset + size],
            k=k_param,
            value_dtype=state.value_dtype,
            scale=scale,
        )
        if velocity is not None and state.momentum_masking:  # DGC momentum factor masking
            velocity[offset : offset + size].index_fill_(0, idx.long(), 0.0)
        idx_parts.append(idx.add_(offset))
        val_parts.append(vals)
    idx, vals = torch.cat(idx_parts), torch.cat(val_parts)
    packed = torch.cat([idx.view(torch.uint8), vals.view(torch.uint8)])  # one message, 4k + 2k bytes
    work, gathered = all_gather_rows(packed, state.process_group, async_op=True)

    def decode(fut):
        indices = row_slice_as(gathered, 0, 4 * k, torch.int32)
        values = row_slice_as(gathered, 4 * k, payload, state.value_dtype)
        buf.zero_()
        native_ops.topk_decompress_add(buf, indices, values)  # rank order: identical on all ranks
        return buf

    return work.get_future().then(decode)


def _dgc_local(state: TopKState, buf: torch.Tensor, segments, velocity: torch.Tensor | None) -> None:
    """DGC's local steps on this rank's gradient, in place in the bucket (Lin et al. 2018): local gradient
    clipping per parameter to ``clip_norm / sqrt(W)`` (sec. 3.3), then momentum correction (sec. 3.2):
    ``u = m*u + g`` and ``u`` is what enters the error-feedback residual and gets sparsified."""
    if state.clip_norm > 0:
        limit = state.clip_norm / state.world_size**0.5
        for offset, size in segments:
            piece = buf[offset : offset + size]
            norm = float(torch.linalg.vector_norm(piece))
            if norm > limit:
                piece.mul_(limit / (norm + 1e-6))
    if velocity is not None:
        velocity.mul_(state.momentum).add_(buf)
        buf.copy_(velocity)


class SignState(CompressionState):
    """State of ``sign_ef``. Options: ``chunk`` (elements per fp32 scale, multiple of 8; default 4096)."""

    def __init__(self, process_group, options: dict | None = None) -> None:
        super().__init__(process_group)
        opts = dict(options or {})
        self.chunk = int(opts.pop("chunk", 4096))
        if opts:
            raise ValueError(f"sign_ef: unknown options {sorted(opts)}")
        if self.chunk <= 0 or self.chunk % 8:
            raise ValueError("sign_ef: chunk must be a positive multiple of 8")


def sign_ef_hook(state: SignState, bucket):
    buf = bucket.buffer()
    check_bucket(buf, "sign_ef")
    n, w, chunk = buf.numel(), state.world_size, state.chunk
    nbytes, nchunks = (n + 7) // 8, (n + chunk - 1) // chunk
    payload = nbytes + 4 * nchunks
    residual = state.residuals.for_bucket(bucket)

    def launch():
        scale = state._scale_in_place(buf)
        bits, scales = native_ops.sign_ef_compress(buf, residual, chunk=chunk, scale=scale)
        packed = torch.cat([bits, scales.view(torch.uint8)])
        work, gathered = all_gather_rows(packed, state.process_group, async_op=True)

        def decode(fut):
            all_bits = row_slice_as(gathered, 0, nbytes, torch.uint8)
            all_scales = row_slice_as(gathered, nbytes, payload, torch.float32)
            buf.zero_()
            native_ops.sign_decompress_add(buf, all_bits, all_scales, chunk=chunk)
            return buf

        return work.get_future().then(decode)

    fut = timed(
        state.stats,
        bucket,
        launch,
        bytes_sent=payload,
        wire_bytes=all_gather_wire_bytes(payload, w),
        dense_bytes=4 * n,
    )
    state._end_of_bucket(bucket)
    return fut
