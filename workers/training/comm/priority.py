"""Priority-ordered gradient communication (``JobConfig.comm_order``): ByteScheduler / P3 for data parallelism.

DDP all-reduces a bucket as soon as backward has produced it -- the last layers first -- and its backward
returns only once every bucket is reduced; the optimizer then steps the whole model and the next forward
starts. That forward needs the *first* layers first, which DDP sends last, so every byte still on the wire
at the end of backward is exposed, and reordering DDP's buckets alone cannot change it: the end-of-backward
wait (``Reducer::finalize_backward`` waits on every bucket's future) is a barrier for all of them.
ByteScheduler (Peng et al., SOSP'19, sec. 2-3) and P3 (Jayarajan et al., SysML'19, sec. 3) get their gain
by (1) partitioning gradients, (2) sending the ready partition the next forward needs first and (3) letting
layer i's update and the next forward of layer i run as soon as layer i's gradient is in, while later
partitions are still in flight. :class:`PriorityGradSync` does exactly that, in place of DDP:

- Gradients go into one flat buffer in the model's registration (= forward) order, cut into partitions of
  ``partition_mb`` (a cut may fall inside a tensor: ByteScheduler's tensor partitioning). A
  ``register_post_accumulate_grad_hook`` per parameter (torch's "optimizer in backward" seam) copies the
  gradient, pre-multiplied by 1/W as DDP's reducer does without a hook, into the buffer and hides it
  (``grad = None``); a partition is ready when all its parameters are.
- One comm thread all-reduces ready partitions one at a time on a process group of its own. Which one goes
  next is agreed first by a small all-reduce of every rank's ready flags (and, for ``magnitude``, of the
  partitions' squared norms): gloo matches collectives by issue order, so every rank must pick the same
  partition (Horovod's coordinator negotiates each round for the same reason; Sergeev & Del Balso 2018).
- ``optimizer.step()`` sees no gradient. Its pre-hook records the step's hyper-parameters (that step's lr);
  each stage's forward pre-hook of the next step waits for the stage's partitions and applies that step to
  the stage's parameters. torch's SGD/AdamW update every tensor on its own, so per-stage steps give the
  same parameters bit for bit as the whole-model step (``tests/engines/training/comm/test_comm_priority.py``).

Orders (``ORDERS``): ``priority`` -- the lowest partition (the first layers) among those ready on every
rank; ``magnitude`` -- the largest gradient norm among them (sum over ranks of the local squared norms).
DDP's own ``reverse`` order is DDP itself (``workers.training.parallel.data_parallel``).

Timing (``comm_stats()``, the keys of :mod:`.stats`): ``comm_s_total`` is, summed over partitions, ready ->
reduced; ``comm_s_exposed`` is the time the training thread waited for them (in the next forward, or in
:meth:`PriorityGradSync.flush`): the same quantity as a DDP hook's exposed time, the end-of-backward wait.
A step's communication ends in the next step's forward, so after step t's backward ``comm_stats()`` and
:meth:`PriorityGradSync.last_grad_sq` describe step t-1 (the latest complete one).
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from workers.training.comm.stats import ring_all_reduce_wire_bytes

ORDERS = ("priority", "magnitude")
SEND_LOG_LENGTH = 4096
"""Sends kept in ``send_log`` (a memory bound, not a tuning knob: a few steps' worth of partitions)."""
CLOSE_TIMEOUT_S = 10.0


@dataclass
class _StepRecord:
    step: int
    partitions: int
    t_ready: list[float | None]
    t_done: list[float | None]
    exposed_s: float = 0.0
    negotiate_s: float = 0.0
    grad_sq: float = 0.0
    applied: bool = False

    def complete(self) -> bool:
        return self.applied and all(t is not None for t in self.t_done)

    def comm_s_total(self) -> float:
        return sum(
            d - r for r, d in zip(self.t_ready, self.t_done, strict=True) if r is not None and d is not None
        )


@dataclass
class _Stage:
    module: nn.Module
    params: list[int]
    partitions: list[int]
    at_start: bool = False
    """The root's own parameters: applied in the root's forward pre-hook (else: the stage's own pre-hook,
    or the root's post-hook for parameters no stage holds)."""
    applied: bool = False


@dataclass
class Partition:
    """Elements ``[start, stop)`` of the flat gradient; ``params``: indices of the parameters it holds."""

    index: int
    start: int
    stop: int
    params: list[int] = field(default_factory=list)


def _stage_modules(root: nn.Module) -> list[nn.Module]:
    """The modules a forward runs one after another, in registration order: the root's children, with
    containers (``ModuleDict``/``ModuleList``/``Sequential``) opened; the root itself first when it holds
    parameters of its own."""
    out: list[nn.Module] = []
    if any(True for _ in root.parameters(recurse=False)):
        out.append(root)
    for child in root.children():
        if isinstance(child, nn.ModuleDict | nn.ModuleList | nn.Sequential):
            out += _stage_modules(child)
        elif any(True for _ in child.parameters()):
            out.append(child)
    return out


def plan_partitions(numels: list[int], partition_elems: int) -> list[Partition]:
    """Cut the flat concatenation of tensors of ``numels`` elements into pieces of ``partition_elems``."""
    if partition_elems < 1:
        raise ValueError(f"partition size must be >= 1 element, got {partition_elems}")
    total = sum(numels)
    parts = [
        Partition(i, start, min(total, start + partition_elems))
        for i, start in enumerate(range(0, total, partition_elems))
    ]
    offset = 0
    for p_index, n in enumerate(numels):
        first, last = offset // partition_elems, (offset + n - 1) // partition_elems
        for b in range(first, last + 1):
            parts[b].params.append(p_index)
        offset += n
    return parts


class PriorityGradSync:
    """Data-parallel gradient averaging of ``module``'s parameters over ``group`` in ``order``, with each
    stage's update deferred to its next forward (see the module docstring). Call :meth:`bind_optimizer`
    with the optimizer over these parameters before training; :meth:`flush` before reading parameters
    after the last step; :meth:`close` at the end.

    ``accumulation`` forward-backward passes with gradients make one step (micro-batches: gradients accumulate locally, the last
    one's are sent). ``send_log`` records every send: ``{"step", "partition", "candidates"}`` -- the
    partitions ready on every rank when it was chosen (``magnitude``: and their ``sq_norms``)."""

    def __init__(
        self,
        module: nn.Module,
        group: dist.ProcessGroup | None = None,
        *,
        order: str = "priority",
        partition_mb: float = 4.0,
        accumulation: int = 1,
    ) -> None:
        if order not in ORDERS:
            raise ValueError(f"comm_order {order!r}: PriorityGradSync orders {', '.join(ORDERS)}")
        if accumulation < 1:
            raise ValueError(f"accumulation must be >= 1, got {accumulation}")
        self.module, self.order, self.accumulation = module, order, accumulation
        self.world = dist.get_world_size(group)
        ranks = (
            dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
        )
        # its own group: the trainer's collectives on the data-parallel group never interleave with ours
        self.group = dist.new_group(ranks=ranks, backend=dist.get_backend(group))
        self.params = [p for p in module.parameters() if p.requires_grad]
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1:
            raise ValueError(f"PriorityGradSync needs one parameter dtype, got {sorted(map(str, dtypes))}")
        self.dtype = dtypes.pop()
        numels = [p.numel() for p in self.params]
        elem = torch.empty((), dtype=self.dtype).element_size()
        self.partition_mb = partition_mb
        self.partitions = plan_partitions(numels, max(1, round(partition_mb * 1e6 / elem)))
        self.flat = torch.zeros(sum(numels), dtype=self.dtype, device=self.params[0].device)
        self._offsets = [0]
        for n in numels:
            self._offsets.append(self._offsets[-1] + n)
        self._param_partitions: list[list[int]] = [[] for _ in self.params]
        for part in self.partitions:
            for i in part.params:
                self._param_partitions[i].append(part.index)
        index_of = {id(p): i for i, p in enumerate(self.params)}
        self._stages: list[_Stage] = []
        seen: set[int] = set()
        for mod in _stage_modules(module):
            own = mod.parameters(recurse=mod is not module)
            ids = [index_of[id(p)] for p in own if id(p) in index_of and index_of[id(p)] not in seen]
            seen.update(ids)  # a tied weight belongs to the first stage that uses it
            if ids:
                parts = sorted({b for i in ids for b in self._param_partitions[i]})
                self._stages.append(_Stage(mod, ids, parts, at_start=mod is module))
        missing = [i for i in range(len(self.params)) if i not in seen]
        if missing:  # parameters of no stage: applied by the root's forward post-hook
            self._stages.append(
                _Stage(module, missing, sorted({b for i in missing for b in self._param_partitions[i]}))
            )
        self.send_log: collections.deque = collections.deque(maxlen=SEND_LOG_LENGTH)
        self.optimizer: torch.optim.Optimizer | None = None
        self._cv = threading.Condition()
        self._forwards = 0  # forward passes with gradients: micro-batches
        self._fired = [False] * len(self.params)
        self._remaining = [len(p.params) for p in self.partitions]
        self._ready = [False] * len(self.partitions)
        self._sent = [False] * len(self.partitions)
        self._version = 0
        self._step = 0
        self._open = False  # a step's gradients are being produced or sent
        self._update_due = False  # optimizer.step() was called: stages apply it in their next forward
        self._hyper: list[dict] = []
        self._applying = False
        self._closing = False
        self._record: _StepRecord | None = None
        self._previous: _StepRecord | None = None
        self._handles = []
        for i, p in enumerate(self.params):
            self._handles.append(p.register_post_accumulate_grad_hook(self._grad_hook(i)))
        for k, stage in enumerate(self._stages):
            if stage.module is not module:
                self._handles.append(stage.module.register_forward_pre_hook(self._stage_hook(k)))
        self._handles.append(module.register_forward_pre_hook(self._root_pre_hook))
        self._handles.append(module.register_forward_hook(self._root_post_hook))
        self._thread = threading.Thread(target=self._run, name=f"comm-{order}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------------ the optimizer
    def bind_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Steps of ``optimizer`` record their hyper-parameters; the update itself runs stage by stage."""
        self.optimizer = optimizer
        self._handles.append(optimizer.register_step_pre_hook(self._on_optimizer_step))

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        if self._applying or not self._open:
            return
        self._hyper = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        for i in [i for i, fired in enumerate(self._fired) if not fired]:
            # no gradient in the step's last backward on this rank: what earlier micro-batches left, else
            # zeros (DDP's buckets hold zeros for an unused parameter too)
            self._take_grad(i)
        self._open = False
        self._update_due = True
        for stage in self._stages:
            stage.applied = False

    def _apply(self, indices: list[int]) -> None:
        """One step of the bound optimizer over the parameters ``indices`` (their gradients arrived), with the
        hyper-parameters recorded when the trainer called ``optimizer.step()``."""
        opt = self.optimizer
        if opt is None:
            raise RuntimeError(
                "PriorityGradSync: bind_optimizer() was not called; the gradients have no optimizer"
            )
        saved = [{k: g[k] for k in hyper} for g, hyper in zip(opt.param_groups, self._hyper, strict=True)]
        for g, hyper in zip(opt.param_groups, self._hyper, strict=True):
            g.update(hyper)
        for i in indices:
            p = self.params[i]
            p.grad = self.flat[self._offsets[i] : self._offsets[i + 1]].view_as(p)
        self._applying = True
        try:
            opt.step()
        finally:
            self._applying = False
            for i in indices:
                self.params[i].grad = None
            for g, values in zip(opt.param_groups, saved, strict=True):
                g.update(values)

    def _wait_partitions(self, partitions: list[int]) -> None:
        rec = self._record
        t0 = time.perf_counter()
        with self._cv:
            while not all(rec.t_done[b] is not None for b in partitions):
                self._cv.wait()
        rec.exposed_s += time.perf_counter() - t0

    def _apply_stage(self, k: int) -> None:
        stage = self._stages[k]
        if stage.applied:
            return
        self._wait_partitions(stage.partitions)
        self._apply(stage.params)
        stage.applied = True
        if all(s.applied for s in self._stages):
            self._update_due = False
            self._record.applied = True

    def flush(self) -> None:
        """Wait for the step in flight and apply what it left (before reading parameters or a snapshot)."""
        if self._update_due:
            for k in range(len(self._stages)):
                self._apply_stage(k)

    # --------------------------------------------------------------------------------------- the hooks
    def _stage_hook(self, k: int):
        def hook(module, args):
            if self._update_due:
                self._apply_stage(k)

        return hook

    def _root_pre_hook(self, module, args) -> None:
        if torch.is_grad_enabled():
            self._forwards += 1
        for k, stage in enumerate(self._stages):  # the root's own parameters are used from the start
            if self._update_due and stage.at_start:
                self._apply_stage(k)

    def _root_post_hook(self, module, args, output) -> None:
        self.flush()  # a stage the forward skipped: its update is due before the next backward

    def _begin_step(self) -> None:
        if self._update_due or self._open:
            raise RuntimeError(
                "PriorityGradSync: a backward started before the previous step's update was applied "
                "(call optimizer.step() between steps, and run a forward)"
            )
        self._step += 1
        n = len(self.partitions)
        with self._cv:
            self._remaining = [len(p.params) for p in self.partitions]
            self._ready = [False] * n
            self._sent = [False] * n
            self._fired = [False] * len(self.params)
            self._previous, self._record = self._record, _StepRecord(self._step, n, [None] * n, [None] * n)
            self._open = True

    def _grad_hook(self, i: int):
        def hook(p: torch.Tensor) -> None:
            if self._forwards % self.accumulation:
                return  # an earlier micro-batch of the step: the gradient accumulates locally
            if not self._open:
                self._begin_step()
            self._take_grad(i)

        return hook

    def _take_grad(self, i: int) -> None:
        """Parameter ``i``'s gradient into the flat buffer, hidden from the optimizer; its partitions may go."""
        p, out = self.params[i], self.flat[self._offsets[i] : self._offsets[i + 1]]
        if p.grad is None:
            out.zero_()
        else:  # DDP's reducer without a hook: bucket = grad * (1 / W), then a SUM all-reduce
            torch.mul(p.grad.reshape(-1), 1.0 / self.world, out=out)
            p.grad = None
        self._fired[i] = True
        self._mark_ready(i, time.perf_counter())

    def _mark_ready(self, i: int, now: float) -> None:
        with self._cv:
            for b in self._param_partitions[i]:
                self._remaining[b] -= 1
                if self._remaining[b] == 0:
                    self._ready[b] = True
                    self._record.t_ready[b] = now
                    self._version += 1
            self._cv.notify_all()

    # ---------------------------------------------------------------------------------- the comm thread
    def _choose(self, candidates: list[int], norms: torch.Tensor) -> int:
        if self.order == "magnitude":
            return max(candidates, key=lambda b: (float(norms[b]), -b))
        return min(candidates)

    def _run(self) -> None:
        n = len(self.partitions)
        empty_at = -1  # the ready version at which the ranks last agreed on nothing
        norms_local = torch.zeros(n, dtype=torch.float64)
        norm_step = [0] * n  # the step whose gradient norms_local[b] holds
        while True:
            with self._cv:
                while not self._closing:
                    unsent = [b for b in range(n) if self._ready[b] and not self._sent[b]]
                    if unsent and (self._version != empty_at or all(self._ready)):
                        break
                    self._cv.wait()
                if self._closing:
                    return
                version, rec = self._version, self._record
                flags = torch.tensor([1.0 if self._ready[b] and not self._sent[b] else 0.0 for b in range(n)])
            t0 = time.perf_counter()
            if self.order == "magnitude":
                for b in unsent:
                    if norm_step[b] != rec.step:
                        part = self.partitions[b]
                        chunk = self.flat[part.start : part.stop]
                        norms_local[b] = torch.linalg.vector_norm(chunk, dtype=torch.float64) ** 2
                        norm_step[b] = rec.step
            agreed = torch.cat([flags.double(), norms_local * flags.double()])
            dist.all_reduce(agreed, group=self.group)
            rec.negotiate_s += time.perf_counter() - t0
            candidates = [b for b in range(n) if agreed[b] >= self.world - 0.5]
            if not candidates:
                empty_at = version
                continue
            b = self._choose(candidates, agreed[n:])
            entry = {"step": rec.step, "partition": b, "candidates": tuple(candidates)}
            if self.order == "magnitude":  # the agreed squared norms the choice was made on
                entry["sq_norms"] = tuple(float(agreed[n + c]) for c in candidates)
            self.send_log.append(entry)
            part = self.partitions[b]
            with self._cv:
                self._sent[b] = True
            chunk = self.flat[part.start : part.stop]
            dist.all_reduce(chunk, group=self.group)
            sq = float(torch.linalg.vector_norm(chunk, dtype=torch.float64) ** 2)
            done = time.perf_counter()
            with self._cv:
                rec.grad_sq += sq
                rec.t_done[b] = done
                self._cv.notify_all()

    # ---------------------------------------------------------------------------------------- figures
    def _latest_complete(self) -> _StepRecord | None:
        if self._record is not None and self._record.complete():
            return self._record
        return self._previous if self._previous is not None and self._previous.complete() else self._record

    def comm_stats(self) -> dict[str, float]:
        """The latest complete step's figures (see the module docstring), in :mod:`.stats`' keys."""
        rec = self._latest_complete()
        payload = self.flat.numel() * self.flat.element_size()
        if rec is None:
            return {
                "step": 0,
                "buckets": 0,
                "comm_s_total": 0.0,
                "comm_s_exposed": 0.0,
                "bytes_sent": 0,
                "wire_bytes": 0,
                "dense_fp32_bytes": 0,
                "compression_ratio": 1.0,
                "complete": False,
            }
        return {
            "step": rec.step,
            "buckets": rec.partitions,
            "comm_s_total": rec.comm_s_total(),
            "comm_s_exposed": rec.exposed_s,
            "negotiate_s": rec.negotiate_s,
            "bytes_sent": payload,
            "wire_bytes": ring_all_reduce_wire_bytes(payload, self.world),
            "dense_fp32_bytes": self.flat.numel() * 4,
            "compression_ratio": 1.0,
            "complete": rec.complete(),
        }

    def last_grad_sq(self) -> float:
        """Squared norm of the averaged gradient of the latest complete step (0 before there is one)."""
        rec = self._latest_complete()
        return rec.grad_sq if rec is not None and rec.complete() else 0.0

    def sent_partitions(self, step: int) -> list[int]:
        return [e["partition"] for e in self.send_log if e["step"] == step]

    def partition_stage(self, b: int) -> int:
        """The first forward stage whose parameters partition ``b`` holds."""
        return next(k for k, s in enumerate(self._stages) if b in s.partitions)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None

    def close(self) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._thread.join(timeout=CLOSE_TIMEOUT_S)
        for h in self._handles:
            h.remove()
        self._handles = []


def partition_mb_for(bucket_cap_mb: float | None) -> float:
    """The partition size: the job's DDP bucket size when it has one (the same granularity as the ``reverse``
    run it is compared with), else DDP's 25 MB default (Li et al. 2020, VLDB, sec. 3.2.3)."""
    from workers.training.comm.bucketing import DDP_DEFAULT_BUCKET_MB

    return float(bucket_cap_mb) if bucket_cap_mb else DDP_DEFAULT_BUCKET_MB


__all__ = ["ORDERS", "Partition", "PriorityGradSync", "partition_mb_for", "plan_partitions"]
