"""The SDK's run: :func:`init` and :class:`Run` (the package docstring shows the loop).

Nothing here is new machinery: a run speaks the same protocols as our own runtime
(``workers.training.trainer``), so the supervisor, the recovery engine, the risk loop and the energy meter
cannot tell a user's script from it:

- progress files and rank 0's timeline (``workers.training.supervision.progress``): hangs, dead ranks,
  faults timed, goodput;
- step times (``...supervision.step_times``): the straggler watch;
- snapshot requests (``...supervision.snapshot_now``): the risk loop's "snapshot now";
- stop requests (``...supervision.stop_now``): cancel, drain and a carbon-aware pause, answered by a clean exit;
- live events through the runtime's publisher onto the job's stream (``job/<id>``) with the job's own
  credential (``workers.training.metrics.EventPublisher``);
- energy and carbon (``workers.green.job.JobEnergy``), tokens from :meth:`Run.report`;
- snapshots through the snapshot engine (``workers.training.checkpoint.SnapshotManager``: DCP underneath,
  asynchronous, verified, incremental, resharded on another world size), the state through torch's own
  ``get_state_dict`` / ``set_state_dict`` (DDP, FSDP2 and TP modules alike).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from workers.devices import backend as device_mod

device_mod.prepare_environment()  # before torch is imported (torch-npu without CANN would break it)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from cann_train import state as state_mod  # noqa: E402
from workers.training.entrypoint import RUN_CONFIG_ENV  # noqa: E402

LOCAL_DIR_ENV = "CANN_TRAIN_LOCAL_DIR"
DEFAULT_LOCAL_DIR = "cann-train-run"
PROGRESS_EVERY_S = 0.25
"""How often :meth:`Run.report` rewrites the rank's progress file (the supervisor's hang watch and fault
injector read it; they count in seconds): a short step does not pay for a file rename each time."""
REQUESTS_EVERY_S = 0.1
"""How often a node's local rank 0 looks at its snapshot-now and stop requests (a ``stat`` each; under a
busy writer thread a ``stat`` measured ~50 us, waiting for the interpreter lock on the way back). Between
looks the step's all-reduce still runs, so every rank agrees on the step a request is acted on."""
MESH_ORDER = ("pp", "dp", "cp", "tp")
"""The DeviceMesh's dimensions, outermost first (torchtitan's order: tensor parallelism innermost, on the
fastest links); ``ep`` shards experts over the dp*cp ranks and is not a mesh dimension of its own."""


@dataclass(frozen=True)
class Strategy:
    """The plan's layout (``strategy.json``): what the script should build (:meth:`mesh`)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    vpp: int = 1
    micro_batch_size: int = 1
    recompute: str = "none"
    zero_stage: int = 0
    sequence_parallel: bool = False

    @classmethod
    def from_dict(cls, d: dict) -> Strategy:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (d or {}).items() if k in names})

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def short_name(self) -> str:
        return f"tp{self.tp}-pp{self.pp}-dp{self.dp}-ep{self.ep}" + (f"-cp{self.cp}" if self.cp > 1 else "")

    def mesh(self, device_type: str | None = None, *, keep_unit_dims: bool = False):
        """A ``DeviceMesh`` over the job's ranks with the strategy's dimensions (``pp, dp, cp, tp``, those
        above 1 unless ``keep_unit_dims``), e.g. ``mesh["dp"]`` for ``fully_shard`` and ``mesh["tp"]`` for
        ``parallelize_module``. Needs the default process group (:func:`init` made it)."""
        from torch.distributed.device_mesh import init_device_mesh

        dims = [(n, getattr(self, n)) for n in MESH_ORDER if keep_unit_dims or getattr(self, n) > 1]
        if not dims:
            dims = [("dp", 1)]
        world = dist.get_world_size() if dist.is_initialized() else 1
        if self.world_size != world:
            raise ValueError(
                f"strategy {self.short_name()} needs {self.world_size} ranks, the job has {world}"
            )
        device_type = device_type or _current_device_type()
        return init_device_mesh(
            device_type, tuple(size for _, size in dims), mesh_dim_names=tuple(name for name, _ in dims)
        )


def _current_device_type() -> str:
    return _RUN.device.type if _RUN is not None else "cpu"


_RUN: Run | None = None


def init(
    *,
    dir: str | os.PathLike | None = None,  # noqa: A002 - the SDK's documented name
    snapshot_every: int | None = None,
    hyperparameters: dict | None = None,
    strategy: dict | None = None,
    steps: int | None = None,
    process_group: bool = True,
) -> Run:
    """The run this process belongs to (once per process; a second call returns the same run).

    Launched by cann-train: the job's run config (``CANN_TRAIN_RUN_CONFIG``) says everything, and the
    arguments are defaults it overrides. Otherwise a local run in ``dir`` (``CANN_TRAIN_LOCAL_DIR``, default
    ``./cann-train-run``) with these arguments. ``process_group``: initialise torch's default process group
    when there are several ranks and nobody did yet (the device's backend: gloo, nccl or hccl)."""
    global _RUN
    if _RUN is not None:
        return _RUN
    defaults: dict[str, Any] = {
        "snapshot_every": snapshot_every or 0,
        "hyperparameters": hyperparameters or {},
        "strategy": strategy,
        "steps": steps,
    }
    path = os.environ.get(RUN_CONFIG_ENV)
    if path:
        config = {
            **defaults,
            **{k: v for k, v in json.loads(Path(path).read_text()).items() if v is not None},
        }
        directory = Path(path).parent
        local = False
    else:
        directory = Path(dir or os.environ.get(LOCAL_DIR_ENV) or DEFAULT_LOCAL_DIR).resolve()
        directory.mkdir(parents=True, exist_ok=True)
        config = {
            **defaults,
            "snapshot_dir": str(directory / "snapshots"),
            "summary_path": str(directory / "summary.json"),
        }
        local = True
    _RUN = Run(config, directory=directory, local=local, process_group=process_group)
    return _RUN


class Run:
    """One rank's view of the job (:func:`init` makes it). Every method but :attr:`strategy` and the
    figures is a collective where the job has several ranks: call it on every rank, at the same step."""

    def __init__(self, config: dict, *, directory: Path, local: bool, process_group: bool = True):
        from workers.training.supervision import progress as progress_mod
        from workers.training.supervision.background import (
            BackgroundCalls,
            DeferredProgress,
            DeferredStepTimes,
        )
        from workers.training.supervision.snapshot_now import SnapshotRequests
        from workers.training.supervision.step_times import StepTimesWriter
        from workers.training.supervision.stop_now import StopRequests

        self.config = config
        self.directory = directory
        self.local = local
        """Not launched by cann-train: events go to ``<directory>/events.jsonl``."""
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        self.attempt = int(config.get("attempt") or 1)
        self.job_id: str | None = str(config["job_id"]) if config.get("job_id") else None
        self.stream = f"job/{self.job_id}" if self.job_id else None
        self.hyperparameters: dict = dict(config.get("hyperparameters") or {})
        self.steps: int | None = config.get("steps")
        self.seed = int(config.get("seed") or 0)
        strategy = config.get("strategy") or {"dp": self.world_size}
        if config.get("rescale") and Strategy.from_dict(strategy).world_size != self.world_size:
            # an elastic job's group re-formed on the nodes it has: the plan's layout with dp taking the ranks
            from workers.training.entrypoint import rescaled_strategy

            strategy = rescaled_strategy(strategy, self.world_size)
        self.strategy = Strategy.from_dict(strategy)
        self.snapshot_every = int(config.get("snapshot_every") or 0)
        self.snapshot_dir = Path(config["snapshot_dir"]) if config.get("snapshot_dir") else None
        requested = config.get("device") or "auto"
        self.device_choice = device_mod.select_device(None if requested == "auto" else requested)
        self.device = self.device_choice.device_for_local_rank(self.local_rank)
        if self.device.type != "cpu":
            getattr(torch, self.device.type).set_device(self.device)
        self._owns_default_group = False
        if process_group and self.world_size > 1 and not dist.is_initialized():
            dist.init_process_group(self.device_choice.backend)
            self._owns_default_group = True
        # The default group, held until this process's exit handler. A script that ends as the DDP example
        # did (``dist.destroy_process_group()`` while its DDP module is alive, then return) otherwise leaves
        # the module's Reducer holding the group's last reference, and the gloo backend's destructor (it
        # joins its worker threads) then ran in the Reducer's dealloc with the GIL held while a worker
        # thread waited for the GIL to release a finished all-reduce's tensor: rank 0 hung at exit for good
        # after the run had ended well (1 run in 5 here; gdb: ~Reducer -> ~ProcessGroupGloo -> join, and
        # pt_gloo_runloop in decref_pyobject -> take_gil; pytorch#56297). Dropped in _at_exit, the last
        # reference goes through ProcessGroup's own binding, which releases the GIL (pytorch#154976).
        self._default_group = (
            dist.distributed_c10d._get_default_group()
            if self.world_size > 1 and dist.is_initialized()
            else None
        )
        self.restart = progress_mod.restart_count()
        progress = progress_mod.ProgressWriter.from_env(self.rank)
        if progress is not None:
            progress.update("starting")
            progress.event("start", t=progress_mod.process_start_unix())
        # from here the progress file, the timeline, the step-times line and a local run's events are written
        # on a thread of their own, in order (background.py says why and what a kill can lose)
        self._writes = BackgroundCalls()
        self.progress = DeferredProgress(progress, self._writes) if progress is not None else None
        step_times = StepTimesWriter.from_env(self.rank, restart=self.restart)
        self.step_times = DeferredStepTimes(step_times, self._writes) if step_times is not None else None
        self._snapshot_requests = SnapshotRequests.from_env() if self.local_rank == 0 else None
        self._stop_requests = StopRequests.from_env() if self.local_rank == 0 else None
        self._group = self._snapshot_group = None
        if self.distributed:
            # two gloo groups of the run's own, on CPU tensors, never queued behind the script's collectives:
            # the snapshots' (DCP plans a write in its background thread) and the loop's small agreements
            # (snapshot now, stop now). One group for both deadlocked: a collective of the training thread
            # and one of the writer thread met on it in different orders on two ranks
            self._snapshot_group = dist.new_group(backend="gloo")
            self._group = dist.new_group(backend="gloo")
        self.publisher = self._publisher(config)
        self.energy = self._energy(config)
        self._snapshots = None
        self._ready = False
        self._last_report: float | None = None
        self._stall_since_report = 0.0
        self._tokens = 0
        self._forced_snapshot = False
        self._stop_agreed = False
        self._asked_at: tuple[int, tuple[bool, bool]] | None = None
        self._looked_at = float("-inf")  # perf_counter of the last look at the request files
        self._progress_at = float("-inf")
        self.history: list[dict] = []
        """This process's reported steps: ``{step, loss, step_time_s, tokens}``."""
        self.step = 0
        self.resumed: dict | None = None
        self._finished = False
        self._failed: BaseException | None = None
        self.publisher.submit("event", self._started_values(), step=0)
        self._log(
            f"attempt {self.attempt}: {self.world_size} rank(s) · {self.strategy.short_name()} · "
            f"{self.device_choice.kind}/{self.device_choice.backend}"
            + (
                f" · local run in {self.directory}"
                if self.local
                else f" · job {self.job_id}"
                if self.job_id
                else ""
            )
        )
        previous_hook = sys.excepthook

        def hook(kind, value, tb):
            self._failed = value
            previous_hook(kind, value, tb)

        sys.excepthook = hook
        atexit.register(self._at_exit)

    # -------------------------------------------------------------------------------------------- setup

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 and dist.is_available() and dist.is_initialized()

    def _publisher(self, config: dict):
        from workers.training.metrics import EventPublisher, NullPublisher
        from workers.training.supervision.background import DeferredPublisher

        if self.rank != 0:
            return NullPublisher()
        if self.local:
            return state_mod.FilePublisher(self.directory / "events.jsonl", self._writes)
        if self.job_id and config.get("redis_url") and config.get("publish", True):
            return DeferredPublisher(EventPublisher(config["redis_url"], self.job_id), self._writes)
        return NullPublisher()

    def _energy(self, config: dict):
        settings = config.get("energy")
        if self.local or (settings or {}).get("enabled") is False:
            return None
        from workers.green.job import JobEnergy

        count = max(1, self.device_choice.count) if self.device.type != "cpu" else 1
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        energy = JobEnergy(
            settings,
            device_kind=self.device.type,
            device_indices=sorted({r % count for r in range(local_world)}),
            rank=self.rank,
            world_size=self.world_size,
            local_rank=self.local_rank,
            under_torchrun="TORCHELASTIC_RUN_ID" in os.environ,
        )
        return energy

    def _started_values(self) -> dict:
        entry = self.config.get("entrypoint") or {}
        return {
            "state": "started",
            "attempt": self.attempt,
            "restart": self.restart,
            "world_size": self.world_size,
            "strategy": self.strategy.short_name(),
            "device": self.device_choice.kind,
            "backend": self.device_choice.backend,
            "device_note": self.device_choice.explain(),
            "model": entry.get("script") or entry.get("module") or sys.argv[0],
            "entrypoint": True,
            "steps": self.steps,
        }

    def _log(self, line: str) -> None:
        if self.rank == 0:
            print(f"cann-train: {line}", flush=True)

    def _mark_ready(self) -> None:
        if self._ready:
            return
        self._ready = True
        if self.progress is not None:
            self.progress.event("ready")
        if self.energy is not None:
            self.energy.start(self.device, restart=self.restart)

    def _manager(self):
        if self._snapshots is None:
            if self.snapshot_dir is None:
                raise RuntimeError("this run has no snapshot directory (the job sets snapshot_every > 0)")
            from workers.training.checkpoint import SnapshotManager

            self._snapshots = SnapshotManager(
                self.snapshot_dir,
                rank=self.rank,
                world_size=self.world_size,
                process_group=self._snapshot_group,
                full_every=int(self.config.get("snapshot_full_every") or 4),
                keep=int(self.config.get("snapshot_keep") or 3),
                layout={"world_size": self.world_size, "strategy": self.strategy.to_dict(), "sdk": True},
                log=self._log,
            )
        return self._snapshots

    # -------------------------------------------------------------------------------------- the calls

    def restore(self, state: dict) -> int:
        """Fill ``state`` (modules, optimizers, anything with ``state_dict``/``load_state_dict``, plain
        values) from the newest snapshot that verifies, and return the step it was taken after (0: nothing to
        restore, ``state`` untouched). A corrupt newest snapshot is set aside for the one before it; a
        snapshot of another world size is resharded (the ranks' own RNG streams then stay as seeded)."""
        self._mark_ready()
        if self.snapshot_dir is None:
            return 0
        t0 = time.perf_counter()
        if self.progress is not None:
            self.progress.update("resuming")
        manager = self._manager()
        exactly = self.config.get("resume_from") if self.restart == 0 else None
        info, skipped = manager.latest_good(exactly=exactly)
        step = 0
        if info is not None:
            same_layout = (info.manifest.get("layout") or {}).get("world_size") == self.world_size
            prefix = state_mod.rank_prefix(self.rank)
            target = state_mod.gather(state)
            manager.load(info, target, extra_prefixes=(prefix,) if same_layout else ())
            state_mod.scatter(state, target)
            if same_layout:
                state_mod.restore_rank_entries(target, prefix, self.device)
            step = info.step
        self.step = step
        seconds = time.perf_counter() - t0
        self.resumed = {
            "from": info.name if info is not None else None,
            "step": step,
            "skipped": [{"name": s.name, "why": s.why} for s in skipped],
            "seconds": round(seconds, 4),
        }
        if self.progress is not None:
            self.progress.event(
                "resumed",
                from_step=step if info is not None else None,
                snapshot=self.resumed["from"],
                tier="disk",
                seconds=seconds,
                skipped=self.resumed["skipped"],
            )
            self.progress.update("training", step)
        if info is not None:
            self._log(f"restored {info.name} (step {step}) in {seconds:.2f} s")
        self._last_report = time.perf_counter()
        self._stall_since_report = 0.0
        return step

    def restored_by_framework(self, step: int, checkpoint: str | None = None, seconds: float = 0.0) -> None:
        """A framework that checkpoints itself (a ``transformers.Trainer`` resuming from its ``checkpoint-N``)
        restored the run at ``step`` (0: a fresh start): the supervisor's timeline says so, as after
        :meth:`restore` (faults then say which step the run went back to)."""
        self._mark_ready()
        self.step = int(step)
        self.resumed = {"from": checkpoint, "step": self.step, "skipped": [], "seconds": round(seconds, 4)}
        if self.progress is not None:
            self.progress.event(
                "resumed",
                from_step=self.step if checkpoint else None,
                snapshot=checkpoint,
                tier="framework",
                seconds=seconds,
                skipped=[],
            )
            self.progress.update("training", self.step)
        self._last_report = time.perf_counter()
        self._stall_since_report = 0.0

    def snapshot_taken_by_framework(self, step: int, name: str, stall_s: float) -> None:
        """A framework saved its own checkpoint after ``step`` (asked by :meth:`snapshot_due`): a supervisor's
        "snapshot now" request is answered, and the stall is left out of the step time."""
        self._answer_request(int(step), name, stall_s, previous_step=None)
        self._stall_since_report += stall_s

    def _answer_request(self, step: int, name: str, stall_s: float, *, previous_step: int | None) -> None:
        """The snapshot just taken answers a supervisor's "snapshot now", when :meth:`snapshot_due` said it
        was one (local rank 0 writes the answer; rank 0's timeline says it)."""
        forced, self._forced_snapshot = self._forced_snapshot, False
        if not forced:
            return
        if self._snapshot_requests is not None:
            self._snapshot_requests.answer(step=step, name=name, stall_s=stall_s, previous_step=previous_step)
        if self.progress is not None:
            self.progress.event("snapshot-now", step=step, name=name, stall_s=stall_s)
        self._log(f"snapshot {name} now, as the node's supervisor asked")

    def report(
        self, step: int, *, loss: float | torch.Tensor | None = None, tokens: int | None = None, **metrics
    ) -> None:
        """Step ``step`` is done (every rank): its loss, the tokens it trained (the whole job's), and any
        other figures (numbers; they appear on the job page). Times the step from the previous report."""
        self._mark_ready()
        now = time.perf_counter()
        step_time = None if self._last_report is None else now - self._last_report - self._stall_since_report
        stall, self._stall_since_report = self._stall_since_report, 0.0
        self._last_report = now
        # .item() of the loss as it is (a detach and a cast first cost two more tensor ops a step)
        loss_value = float(loss.item()) if isinstance(loss, torch.Tensor) else loss
        self.step = step = int(step)
        if tokens:
            self._tokens += int(tokens)
        self.history.append({"step": step, "loss": loss_value, "step_time_s": step_time, "tokens": tokens})
        if metrics:  # a tensor's value now, on this thread: the script may change it in place after
            metrics = {k: v.item() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}
        # the step's lines and its event are built and written on the writer thread (background.py): two
        # appends here, the rounding, dicts, time stamps' text and the memory figure (~75 us a step on this
        # machine, cache-cold after a step) there. The wall-clock time is taken here: the lines say when
        t = time.time()
        if self.progress is not None or self.step_times is not None:
            self._writes.call(self._write_step, step, loss_value, step_time, stall, t, now)
        if self.rank == 0:
            self.publisher.submit_later(
                "train", step, self._train_values, loss_value, step_time, tokens, metrics
            )
        if self.energy is not None:
            values = self.energy.sample(self.step, self._tokens, self.device)
            if values is not None and self.rank == 0:
                self.publisher.submit("energy", {"attempt": self.attempt, **values}, step=self.step)

    def _write_step(
        self, step: int, loss: float | None, step_time: float | None, stall: float, t: float, now: float
    ) -> None:
        """On the writer thread: a reported step's progress (the file at most every :data:`PROGRESS_EVERY_S`,
        rewritten and renamed: ~0.3 ms here; the hang watch counts in seconds), rank 0's timeline line and
        the step-times line, in that order, stamped ``t``."""
        if self.progress is not None:
            if now - self._progress_at >= PROGRESS_EVERY_S:
                self._progress_at = now
                self.progress.writer.update("training", step, t=t)
            self.progress.writer.event(
                "step", step=step, loss=loss, step_time_s=step_time or 0.0, stall_s=stall, t=t
            )
        if self.step_times is not None:
            self.step_times.writer.record(step, wait_s=0.0, step_time_s=step_time, at=t)

    def _train_values(
        self, loss: float | None, step_time: float | None, tokens: int | None, metrics: dict
    ) -> dict[str, Any]:
        """On the writer thread: a ``train`` event's values."""
        values: dict[str, Any] = {"attempt": self.attempt, "restart": self.restart}
        if loss is not None:
            values["loss"] = round(loss, 6)
        if step_time:
            values["step_time_s"] = round(step_time, 6)
            if tokens:
                values["tokens_per_s"] = round(tokens / step_time, 2)
        values["memory_GiB"] = round(device_mod.max_memory_GiB(self.device.type, self.device.index), 4)
        for key, value in metrics.items():
            if isinstance(value, bool | int | float | str) and key not in values:
                values[key] = value
        return values

    def _requests(self, step: int) -> tuple[bool, bool]:
        """(snapshot now, stop now): whether any node's supervisor asks, agreed by every rank in one small
        all-reduce per step (local rank 0 of each node looks at its node's request files, one ``stat`` each, at
        most every :data:`REQUESTS_EVERY_S`)."""
        if self._asked_at is not None and self._asked_at[0] == step:
            return self._asked_at[1]
        snap = stop = False
        now = time.perf_counter()
        if now - self._looked_at >= REQUESTS_EVERY_S:
            self._looked_at = now
            snap = self._snapshot_requests is not None and self._snapshot_requests.pending() is not None
            stop = self._stop_requests is not None and self._stop_requests.pending() is not None
        if self.distributed and self.progress is not None:  # watched: a supervisor may ask any node
            t = torch.tensor([int(snap), int(stop)], dtype=torch.int32)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._group)
            snap, stop = bool(t[0]), bool(t[1])
        self._asked_at = (step, (snap, stop))
        return snap, stop

    def snapshot_due(self, step: int) -> bool:
        """Whether to snapshot after ``step``: the job's ``snapshot_every``, or a supervisor's request (the
        risk loop's "snapshot now"; any node's asks all). Every rank gets the same answer."""
        requested = self._requests(int(step))[0]
        self._forced_snapshot = requested
        due = bool(self.snapshot_every) and step % self.snapshot_every == 0
        return self.snapshot_dir is not None and (due or requested)

    def snapshot(self, step: int, state: dict) -> None:
        """Snapshot ``state`` after ``step`` (every rank). Returns once it is copied to CPU memory; the write
        (verified, atomic, a full snapshot every ``snapshot_full_every``, XOR deltas between) goes on in the
        background and its stall is left out of the step time."""
        t0 = time.perf_counter()
        # the lines of every step this snapshot covers on disk before it can become a resume point
        if not self._writes.flush():
            print(f"cann-train: progress and event writes still queued after 10 s at the snapshot of step {step}; "
                  "they are written after it", file=sys.stderr)  # fmt: skip
        manager = self._manager()
        manager.poll()
        previous = manager.records[-1].step if manager.records else None
        prefix = state_mod.rank_prefix(self.rank)
        record = manager.save(
            int(step),
            lambda: {**state_mod.gather(state), **state_mod.rank_entries(prefix, self.device)},
            info={
                "attempt": self.attempt,
                "sdk": True,
                "loss": self.history[-1]["loss"] if self.history else None,
            },
        )
        self._answer_request(int(step), record.name, record.stall_s, previous_step=previous)
        self._stall_since_report += time.perf_counter() - t0

    def should_stop(self) -> bool:
        """True once the job is cancelled, its node drained or it is paused for a carbon-aware window (every
        rank the same answer, and true from then on): snapshot and return; the control plane resumes it
        later from that snapshot. Call it once a step, after :meth:`report`."""
        if self._stop_agreed:
            return True
        if self._requests(self.step)[1]:
            self._stop_agreed = True
            reason = (self._stop_requests.pending() or {}).get("reason") if self._stop_requests else None
            self._log(f"stopping after step {self.step}: {reason or 'the supervisor asked'}")
        return self._stop_agreed

    def finish(self) -> dict:
        """The run ended well (every rank): the snapshot in flight written, the run summary published and
        written where the launcher asked. Called at exit when the script did not (unless it raised)."""
        if self._finished:
            return self.summary()
        self._finished = True
        if self.progress is not None:
            self.progress.update("finishing", self.step)
        if self.energy is not None and self._ready:
            values = self.energy.finish(self.step, self._tokens, self.device)
            if values is not None and self.rank == 0:
                self.publisher.submit("energy", {"attempt": self.attempt, **values}, step=self.step)
        if self._snapshots is not None:
            self._snapshots.close()
        if self.progress is not None:
            self.progress.event("end", step=self.step)
        summary = self.summary()
        state = "stopped" if self._stop_agreed else "finished"
        self.publisher.submit("event", {"state": state, "attempt": self.attempt, **summary}, step=self.step)
        self.publisher.close()
        if self.rank == 0 and self.config.get("summary_path"):
            Path(self.config["summary_path"]).write_text(json.dumps(summary))
        self._close()
        return summary

    def summary(self) -> dict:
        """What this run did: its steps, losses, steady step time and throughput, snapshots, energy."""
        h = [r for r in self.history if r["step_time_s"] is not None]
        steady = h[1:] or h
        out: dict[str, Any] = {
            "world_size": self.world_size,
            "strategy": self.strategy.short_name(),
            "strategy_config": self.strategy.to_dict(),
            "device": self.device_choice.kind,
            "entrypoint": True,
            "steps": len(self.history),
            "losses": [r["loss"] for r in self.history],
            "resumed": self.resumed,
        }
        if (submitted := getattr(self.publisher, "submitted", None)) is not None:  # a launched job's rank 0
            out["events_submitted"] = submitted.to_dict()
        if self.history and self.history[-1]["loss"] is not None:
            out["loss_first"], out["loss_last"] = self.history[0]["loss"], self.history[-1]["loss"]
        if steady:
            step_time = sum(r["step_time_s"] for r in steady) / len(steady)
            out["step_time_s"] = round(step_time, 6)
            out["step_times_s"] = [round(r["step_time_s"], 6) for r in h]
            tokens = [r["tokens"] for r in steady if r["tokens"]]
            if tokens:
                out["tokens_per_step"] = tokens[-1]
                out["tokens_per_s"] = round(
                    sum(tokens) / sum(r["step_time_s"] for r in steady if r["tokens"]), 2
                )
        if self._snapshots is not None and self._snapshots.records:
            stalls = sorted(r.stall_s for r in self._snapshots.records)
            out["snapshots"] = [r.to_dict() for r in self._snapshots.records]
            out["snapshot_stall_s_median"] = stalls[len(stalls) // 2]
            out["snapshot_stall_s_total"] = sum(stalls)
        if self.energy is not None and self.energy.summary() is not None:
            out["energy"] = self.energy.summary()
        return out

    def _close(self) -> None:
        if self.energy is not None:
            self.energy.close()
        if self.step_times is not None:
            self.step_times.close()
        if self.progress is not None:
            self.progress.close()
        self._writes.close()

    def _at_exit(self) -> None:
        try:
            self._exit()
        finally:
            self._writes.close()  # what is queued reaches its files, however the run ended
            # the group's last reference, if the script destroyed it (see __init__)
            self._default_group = None

    def _exit(self) -> None:
        if self._failed is not None:  # the script raised: say so, keep what was published
            if not self._finished:
                message = f"{type(self._failed).__name__}: {self._failed}"
                self.publisher.submit(
                    "event", {"state": "failed", "attempt": self.attempt, "message": message}, step=self.step
                )
                self.publisher.close()
            return
        if not self._finished:
            try:
                self.finish()
            except Exception as exc:  # noqa: BLE001 - at exit a peer may be gone: the run's outcome stands
                print(f"cann-train: finishing the run at exit failed: {exc}", file=sys.stderr)
                return
        if self._owns_default_group and dist.is_initialized():
            # the process groups this run made, torn down before the interpreter's own teardown (as the DDP
            # example does by hand): a rank of a transformers.Trainer job that had ended well aborted in the
            # interpreter's teardown ("terminate called without an active exception", under load, 2026-12-06)
            # and torchrun restarted the finished job. Only after a good end: destroying groups while a peer
            # may still sit in a collective can hang (torchtitan#1342)
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a script that destroyed them itself, or a peer gone
                pass
