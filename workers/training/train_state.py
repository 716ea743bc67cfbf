"""The trainer's snapshot and resume state, beside the loop (as torchtitan's ``CheckpointManager`` beside
its ``Trainer``).

:meth:`TrainState.snapshot_state` is everything needed to continue bit for bit, in the layout this rank
holds it (model and optimizer through DCP's ``get_state_dict``, so FSDP2/TP DTensors stay sharded; step,
data position and LR schedule; this rank's RNG streams and comm-hook residuals), and
:meth:`TrainState.restore_state` puts it back; ``workers.training.checkpoint`` stages, writes, verifies and
reshards it. With ``snapshot_delta: log`` the snapshots between full ones are logs: each step's gradients,
as ``optimizer.step()`` consumed them, are copied (:meth:`TrainState.record_gradients`), a log holds them
plus :meth:`TrainState.log_state`, and a resume replays them on the chain's full snapshot.
:meth:`TrainState.state_dict` is the same state for an in-memory copy.

The step stays the trainer's (``trainer.step``): a restore sets it, a snapshot reads it."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from workers.training.checkpoint import SnapshotInfo, SnapshotManager, SnapshotRecord
from workers.training.checkpoint.gradlog import group_hyper, replay
from workers.training.checkpoint.memory import MemorySnapshots
from workers.training.checkpoint.state import (
    capture_rng,
    pack_tensors,
    restore_rng,
    state_module,
    suffix_keys,
    unpack_tensors,
    unsuffix_keys,
)
from workers.training.checkpoint.storage import list_snapshots, snapshot_name, step_of
from workers.training.parallelize import is_expert_param

if TYPE_CHECKING:
    from workers.training.trainer import StepResult, Trainer

SNAPSHOT_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
"""Optimizer state keyed ``state.<fqn>.<name>`` / ``param_groups.<fqn>.<name>``: pipeline stages' entries
never collide, and a snapshot loads on another layout by parameter name."""
BUFFERS_OPTIONS = StateDictOptions(strict=False)
"""Putting back a log's model entries: its buffers only (the parameters come from the replay)."""
SNAPSHOT_GROUP_TIMEOUT = timedelta(minutes=10)
"""Timeout of the snapshot process group's collectives (planning, the final gather of write results)."""


class TrainState:
    """A :class:`~workers.training.trainer.Trainer`'s snapshots: the disk tier (``snapshot_every``, a
    :class:`SnapshotManager` on a gloo group of its own), the in-memory tier (``snapshot_memory_every``),
    this rank's state as they save and load it, and the resume. Built by the trainer once its model,
    optimizer and loader exist; reads the trainer's step, progress writer and log through ``trainer``."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        cfg = trainer.cfg
        self.cfg, self.rank, self.world_size = cfg, trainer.rank, trainer.world_size
        self.device, self.pm = trainer.device, trainer.pm
        self.optimizer, self.loader = trainer.optimizer, trainer.loader
        self._state_module = state_module(self.pm.raw_parts)
        self._expert_fqns, self._expert_suffix = self._per_rank_chunks()
        self._param_fqns, self._log_params = self._parameter_keys()
        self._group_of = {id(p): i for i, g in enumerate(self.optimizer.param_groups) for p in g["params"]}
        self.snapshot_now = False
        """Snapshot after this step: a node's supervisor asked (the step's packed all-reduce carried it)."""
        self.resumed: dict | None = None
        """After :meth:`resume`: the snapshot continued from, the ones skipped and why, the seconds taken."""
        self._snapshot_buffers_started = False
        self.snapshots: SnapshotManager | None = None
        if cfg.snapshot_every or cfg.snapshot_memory_every or trainer.resuming:
            # a gloo group of its own: DCP's planning collectives run in the writer thread, on CPU tensors,
            # and never queue behind (or between) the training collectives of the default group
            group = dist.new_group(backend="gloo", timeout=SNAPSHOT_GROUP_TIMEOUT)
            self.snapshots = SnapshotManager(
                cfg.snapshot_dir,
                rank=self.rank,
                world_size=self.world_size,
                process_group=group,
                full_every=cfg.snapshot_full_every,
                keep=cfg.snapshot_keep,
                layout=self.layout(),
                log=trainer.log_line,
                fresh=not trainer.resuming,
                delta=cfg.snapshot_delta,
            )
        self.memory: MemorySnapshots | None = None
        """The in-memory tier (``snapshot_memory_every``): this rank's newest state in the node's RAM."""
        if cfg.snapshot_memory_every:
            self.memory = MemorySnapshots(cfg.snapshot_dir, self.rank, self.layout())
            if not trainer.resuming:
                self.memory.clear()  # another run's state under the same directory is not ours

    # ------------------------------------------------------------------------------- in-memory copy

    def state_dict(self) -> dict:
        """Everything a snapshot needs: model parts (sharded where FSDP/TP shard them), optimizer, data
        position, step. ``torch.distributed.checkpoint`` can save it as is."""
        state = {
            "step": self.trainer.step,
            "data": self.loader.state_dict(),
            "model": [part.state_dict() for part in self.pm.raw_parts],
            "optimizer": self.optimizer.state_dict(),
        }
        if self.pm.comm_states:
            # Error-feedback residuals (and step counters) of the comm hooks: per rank, like the
            # optimizer state -- each rank keeps what it did not send. One entry per DDP part.
            state["comm_hook"] = [st.state_dict() for st in self.pm.comm_states]
        return state

    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict` on a trainer built from the same config (resume)."""
        for part, part_state in zip(self.pm.raw_parts, state["model"], strict=True):
            part.load_state_dict(part_state)
        self.optimizer.load_state_dict(state["optimizer"])
        self.loader.load_state_dict(state["data"])
        self.trainer.step = int(state["step"])
        hook_states = state.get("comm_hook")
        if hook_states is None and self.pm.comm_states:
            raise ValueError(
                "the snapshot has no comm-hook state but this run uses " + str(self.cfg.comm_hook)
            )
        for st, hook_state in zip(self.pm.comm_states, hook_states or [], strict=True):
            st.load_state_dict(hook_state)

    # ------------------------------------------------------------------------------------- snapshots

    def layout(self) -> dict:
        """What decides whether a rank's own entries (RNG streams, comm-hook residuals) of a snapshot fit
        this run: the same world, strategy and hook. The model and optimizer load on any layout."""
        cfg = self.cfg
        return {
            "world_size": self.world_size,
            "strategy": cfg.strategy.to_dict(),
            "comm_hook": cfg.comm_hook,
            "model": cfg.model.name,
        }

    def _per_rank_chunks(self) -> tuple[set[str], str]:
        """Expert-parallel weights are plain local tensors holding this rank's experts under the same name
        on every EP rank: DCP would take them for replicas. They get the EP coordinate in their name
        (``...experts.w1@ep0of2``): a snapshot reshards over data-parallel ranks, not across ``ep``."""
        ep = self.pm.dims.ep
        if ep == 1:
            return set(), ""
        fqns = {
            name.replace("_checkpoint_wrapped_module.", "")
            for name, p in self._state_module.named_parameters()
            if is_expert_param(p)
        }
        return fqns, f"@ep{self.pm.coords['ep']}of{ep}"

    def _parameter_keys(self) -> tuple[set[str], list[tuple[str, torch.Tensor]]]:
        """This rank's parameters by the names snapshots give them (``get_state_dict``'s, experts with their
        EP suffix): the fqns, and ``(key, parameter)`` pairs, the names of a log's gradients."""
        fqns, params = set(), []
        for name, p in self._state_module.named_parameters():
            fqn = name.replace("_checkpoint_wrapped_module.", "")
            fqns.add(fqn)
            params.append((fqn + self._expert_suffix if fqn in self._expert_fqns else fqn, p))
        return fqns, params

    def logged_parameters(self) -> dict[str, torch.Tensor]:
        """``{key: parameter}`` of this rank under the names a log snapshot gives their gradients (the shapes
        its gradient buffers are prepared for)."""
        return dict(self._log_params)

    def before_optimizer_step(self) -> float:
        """Between clipping and ``optimizer.step()``: a log's gradient copy (:meth:`record_gradients`), and
        the in-memory tier's wait (its copy of the last state must be done before the state changes).
        Training-thread seconds taken (snapshot stall)."""
        recorded_s = self.record_gradients() if self.snapshots is not None else 0.0
        if self.memory is not None:
            recorded_s += self.memory.wait()
        return recorded_s

    def record_gradients(self) -> float:
        """Between clipping and ``optimizer.step()``: when the next snapshot is a log, copy the gradients
        the step is about to consume, with each parameter's param-group hyper-parameters. Seconds taken."""
        if not self.snapshots.wants_gradients:
            return 0.0
        t0 = time.perf_counter()
        hyper = [group_hyper(g) for g in self.optimizer.param_groups]
        grads, meta = {}, {}
        for key, p in self._log_params:
            meta[key] = {"grad": p.grad is not None, "hyper": hyper[self._group_of[id(p)]]}
            if p.grad is not None:
                grads[key] = p.grad
        self.snapshots.record_gradients(self.trainer.step + 1, grads, meta)
        return time.perf_counter() - t0

    def _rank_prefix(self) -> str:
        return f"rank{self.rank}/"

    def snapshot_state(self, *, rank_entries: bool = True) -> dict:
        """Everything needed to continue bit for bit, as DCP saves it: ``model`` and ``optimizer`` keyed by
        parameter name (sharded DTensors where FSDP2/TP shard them, each pipeline stage its own names),
        ``progress`` (step, data position, LR schedule; the same on every rank) and, under
        ``rank<r>/``, this rank's RNG streams and comm-hook state (error-feedback residuals, momentum,
        PowerSGD memories). MoE balancing biases are model buffers. The tensors are the live ones: stage
        (copy) before training goes on. Before the first step this initialises the optimizer state
        (DCP's ``get_state_dict`` runs a zero-lr step), so call it for saving only after a step."""
        model, optimizer = get_state_dict(self._state_module, self.optimizer, options=SNAPSHOT_OPTIONS)
        return {
            "model": suffix_keys(model, self._expert_fqns, self._expert_suffix),
            "optimizer": suffix_keys(optimizer, self._expert_fqns, self._expert_suffix),
            **self._progress_state(rank_entries),
        }

    def log_state(self, *, rank_entries: bool = True) -> dict:
        """What a log snapshot holds besides its gradients: everything of :meth:`snapshot_state` that is not
        a parameter or optimizer state -- the model's buffers (MoE balancing biases), ``progress`` and this
        rank's entries -- the live tensors, like :meth:`snapshot_state`."""
        model = get_model_state_dict(self._state_module, options=SNAPSHOT_OPTIONS)
        unnamed = self._param_fqns - model.keys()
        if unnamed:  # the log's gradient names must be the snapshot's parameter names
            raise RuntimeError(f"parameters missing from the model state dict: {sorted(unnamed)[:3]}")
        buffers = {k: v for k, v in model.items() if k not in self._param_fqns}
        return {
            "model": suffix_keys(buffers, self._expert_fqns, self._expert_suffix),
            **self._progress_state(rank_entries),
        }

    def _progress_state(self, rank_entries: bool) -> dict:
        cfg = self.cfg
        state: dict = {
            "progress": {
                "step": self.trainer.step,
                "data": self.loader.state_dict(),
                "data_order": self._data_order(),
                "schedule": {
                    "lr": cfg.lr,
                    "warmup_steps": cfg.warmup_steps,
                    "last_step": cfg.start_step + cfg.steps,
                },
            },
        }
        if rank_entries:
            mine = {
                "rng": capture_rng(self.device),
                "comm_hooks": [st.state_dict() for st in self.pm.comm_states],
            }
            state.update(pack_tensors(mine, self._rank_prefix()))
        return state

    def restore_state(self, state: dict) -> list[str]:
        """Put a state of :meth:`snapshot_state`'s shape (loaded into this run's own) back in place -- or of
        :meth:`log_state`'s (after a replay: buffers, progress, this rank's entries). Without this rank's
        entries (the snapshot came from another layout) RNG streams stay as seeded and comm-hook residuals
        start from zero. Returns notes on what differed, for the log."""
        notes = []
        model = unsuffix_keys(state["model"], self._expert_fqns, self._expert_suffix)
        if "optimizer" in state:
            optimizer = unsuffix_keys(state["optimizer"], self._expert_fqns, self._expert_suffix)
            set_state_dict(
                self._state_module,
                self.optimizer,
                model_state_dict=model,
                optim_state_dict=optimizer,
                options=SNAPSHOT_OPTIONS,
            )
        else:
            set_model_state_dict(self._state_module, model, options=BUFFERS_OPTIONS)
        progress = state["progress"]
        saved_order = progress.get("data_order")
        if saved_order is not None and saved_order != self._data_order():
            raise ValueError(
                f"the snapshot's data order {saved_order} is not this run's {self._data_order()} "
                "(another corpus, seed or sequence length): its data position would point elsewhere"
            )
        self.trainer.step = int(progress["step"])
        self.loader.load_state_dict(progress["data"])
        mine = {
            "lr": self.cfg.lr,
            "warmup_steps": self.cfg.warmup_steps,
            "last_step": self.cfg.start_step + self.cfg.steps,
        }
        schedule = progress.get("schedule") or {}
        if {k: schedule.get(k) for k in mine} != mine:
            notes.append(f"the LR schedule changed from {schedule} to {mine}: this run's applies from here")
        prefix = self._rank_prefix()
        if prefix + "skeleton" in state:
            entries = unpack_tensors(state, prefix)
            restore_rng(entries["rng"], self.device)
            for st, hook_state in zip(self.pm.comm_states, entries["comm_hooks"], strict=True):
                st.load_state_dict(hook_state)
        elif self.pm.comm_states:
            notes.append("comm-hook residuals start from zero (the snapshot was taken on another layout)")
        return notes

    def _data_order(self) -> dict:
        """What the sample order depends on besides the position (the loader's state is the position)."""
        loader = self.loader
        return {"seed": loader.seed, "num_samples": loader.num_samples, "seq_length": loader.seq_length}

    def resume_and_report(self) -> dict:
        """:meth:`resume`, the progress file told before (``resuming``) and after (a ``resumed`` event)."""
        progress = self.trainer.progress
        if progress is not None:
            progress.update("resuming")
        resumed = self.resume()
        if progress is not None:
            progress.event(
                "resumed",
                from_step=self.trainer.step if resumed["from"] else None,
                snapshot=resumed["from"],
                tier=resumed.get("tier", "disk"),
                seconds=resumed["seconds"],
                skipped=resumed["skipped"],
            )
        return resumed

    def resume(self) -> dict:
        """Continue from the newest snapshot in ``snapshot_dir`` that verifies; newer ones that do not are
        skipped (and said so). Loads on any layout (DCP reshards); this rank's own entries only when the
        layout is the one the snapshot was taken on. Returns (and keeps in ``resumed``) what happened."""
        assert self.snapshots is not None
        t0 = time.perf_counter()
        # a chosen snapshot (a restore) on the first start only: a torchrun restart continues from the newest
        exactly = self.cfg.resume_from if self.trainer.restart == 0 and not self.trainer.regrouped else None
        if exactly is None and self.memory is not None:
            in_memory = self._resume_from_memory(t0)
            if in_memory is not None:
                return in_memory
        info, skipped = self.snapshots.latest_good(exactly)
        for s in skipped:
            self.trainer.log_line(f"resume: skipped snapshot {s.name}: {s.reason}")
        out: dict = {"from": None, "skipped": [{"name": s.name, "reason": s.reason} for s in skipped]}
        if info is None:
            self.trainer.log_line(
                f"resume: no usable snapshot in {self.cfg.snapshot_dir}; starting at step {self.trainer.step}"
            )
        else:
            same_layout = info.manifest.get("layout") == self.layout()
            notes, chain = self.restore_snapshot(info, rank_entries=same_layout)
            taken_on = info.manifest.get("layout") or {}
            if taken_on.get("world_size") not in (None, self.world_size) and taken_on.get("strategy"):
                self._log_scaling(taken_on["strategy"])
            out.update(
                {
                    "from": info.name,
                    "step": self.trainer.step,
                    "kind": info.kind,
                    "same_layout": same_layout,
                    "taken_on": info.manifest.get("layout"),
                    "notes": notes,
                }
            )
            if len(chain) > 1:
                out["chain"] = [link.name for link in chain]
                out["replayed_steps"] = self.trainer.step - chain[0].step
            layout = (
                ""
                if same_layout
                else f" (taken on {info.manifest['layout']['world_size']} rank(s), resharded)"
            )
            how = (
                f"log: {chain[0].name} + {len(chain) - 1} log(s), {self.trainer.step - chain[0].step} step(s) replayed"
                if len(chain) > 1
                else info.kind
            )
            self.trainer.log_line(
                f"resume: continuing from {info.name} ({how}) at step {self.trainer.step}{layout} "
                f"in {time.perf_counter() - t0:.2f} s" + "".join(f"; {n}" for n in notes)
            )
        out["seconds"] = round(time.perf_counter() - t0, 4)
        self.resumed = out
        return out

    def restore_snapshot(self, info: SnapshotInfo, *, rank_entries: bool) -> tuple[list[str], list]:
        """Load verified snapshot ``info`` into the live model and optimizer (any layout: DCP reshards), with
        this rank's own entries when ``rank_entries`` (the snapshot's layout is this run's). A log is rebuilt
        from its chain: the full snapshot, then each log's gradients replayed through ``optimizer.step()``,
        then the last log's buffers, progress and rank entries. Returns the notes and the chain."""
        assert self.snapshots is not None
        chain = self.snapshots.chain(info)
        prefixes = (self._rank_prefix(),) if rank_entries else ()
        target = self.snapshot_state(rank_entries=False)
        self.snapshots.load(chain[0], target, extra_prefixes=prefixes if len(chain) == 1 else ())
        notes = self.restore_state(target)
        if len(chain) == 1:
            return notes, chain
        for log in chain[1:]:
            replay(self.snapshots, log, self._log_params, self.optimizer)
        target = self.log_state(rank_entries=False)
        self.snapshots.load(info, target, extra_prefixes=prefixes)
        return self.restore_state(target), chain

    def _log_scaling(self, before_strategy: dict) -> None:
        """The run continues on another number of ranks than the snapshot's: say so, with the planner's
        predicted throughput before and after (rank 0's log and timeline)."""
        from workers.training.scaling import between

        d = between(self.cfg, before_strategy)
        if self.trainer.rescaled is not None:
            d["how"] = self.trainer.rescaled["how"]
        before, after = d["predicted_before"] or {}, d["predicted_after"] or {}
        self.trainer.log_line(
            f"{d['action']}: {d['from_world_size']} -> {d['to_world_size']} rank(s), {d['strategy_before']} -> "
            f"{d['strategy_after']}, global batch {d['global_batch_size']} kept; planner's prediction "
            f"{before.get('tokens_per_s', '?')} -> {after.get('tokens_per_s', '?')} tokens/s"
        )
        if self.trainer.progress is not None:
            self.trainer.progress.event("rescaled", **d)

    def _resume_from_memory(self, t0: float) -> dict | None:
        """Resume from the in-memory tier when every rank holds a common step there that is at least as
        new as the newest disk snapshot (listed on rank 0); ``None``: use the disk."""
        steps = sorted(self.memory.steps())
        newest_disk = None
        if self.rank == 0:
            names = list_snapshots(self.cfg.snapshot_dir)
            newest_disk = step_of(names[0]) if names else None
        offers: list = [None] * self.world_size
        if dist.is_initialized() and self.world_size > 1:
            dist.all_gather_object(offers, (steps, newest_disk))
        else:
            offers = [(steps, newest_disk)]
        common = set(offers[0][0]).intersection(*(set(o[0]) for o in offers[1:]))
        disk = offers[0][1]
        if not common or (disk is not None and max(common) < disk):
            return None
        step = max(common)
        target = self.snapshot_state(rank_entries=False)
        self.memory.load(step, target, self._rank_prefix())
        notes = self.restore_state(target)
        out = {
            "from": snapshot_name(step),
            "tier": "memory",
            "step": self.trainer.step,
            "kind": "memory",
            "same_layout": True,
            "skipped": [],
            "notes": notes,
            "seconds": round(time.perf_counter() - t0, 4),
        }
        self.trainer.log_line(
            f"resume: continuing from the in-memory snapshot of step {step} in {out['seconds']:.2f} s"
        )
        self.resumed = out
        return out

    def snapshot_after(self, result: StepResult) -> None:
        """Called after every step: completes a finished background write's bookkeeping and, every
        ``snapshot_every`` steps, snapshots (the stall lands in ``result.snapshot_stall_s``); every
        ``snapshot_memory_every`` steps copies the state into the in-memory tier (in the background where
        nothing but the optimizer step changes it; what the next step waits for it is stall too)."""
        assert self.snapshots is not None
        self.snapshots.poll()
        if self.memory is not None and self.trainer.step % self.cfg.snapshot_memory_every == 0:
            t_mem = time.perf_counter()
            if self.pm.comm_states:  # comm-hook residuals change in the next backward: copied now
                self.memory.save(self.trainer.step, self.snapshot_state())
            else:  # in the background, beside the next step's forward and backward (waited on before
                self.memory.save_async(self.trainer.step, self.snapshot_state())  # its optimizer step)
            result.snapshot_stall_s = (result.snapshot_stall_s or 0.0) + time.perf_counter() - t_mem
        every = self.cfg.snapshot_every
        if every and not self._snapshot_buffers_started:
            # after the first step (the optimizer state exists then), in the background: a restarted rank
            # trains on while its staging buffers are allocated; the first snapshot waits for them (stall)
            self._snapshot_buffers_started = True
            like = self.logged_parameters() if self.snapshots.delta == "log" else None
            self.snapshots.prepare_async(self.snapshot_state(), like)
        forced, self.snapshot_now = self.snapshot_now, False
        if not forced and (not every or self.trainer.step % every):
            return
        previous = self.snapshots.records[-1].step if self.snapshots.records else None
        record: SnapshotRecord = self.snapshots.save(
            self.trainer.step,
            self.snapshot_state,
            info={
                "loss": result.loss,
                "attempt": self.trainer.attempt,
                "model": self.cfg.model.to_dict(),  # what an export of it builds (cann-train export)
                **({"requested": True} if forced else {}),
            },
            log_state=self.log_state,
        )
        # a log's gradient copies were counted at the steps that paid for them (train_step)
        result.snapshot_stall_s = (result.snapshot_stall_s or 0.0) + record.stall_s - record.record_s
        if forced:  # a node's supervisor asked for it (a prevention action): say when it was taken
            if self.trainer.snapshot_requests is not None:
                self.trainer.snapshot_requests.answer(
                    step=self.trainer.step, name=record.name, stall_s=record.stall_s, previous_step=previous
                )
            if self.trainer.progress is not None:
                self.trainer.progress.event(
                    "snapshot-now", step=self.trainer.step, name=record.name, stall_s=record.stall_s
                )
            self.trainer.log_line(
                f"snapshot {record.name} now, as the node's supervisor asked (stall {record.stall_s:.3f} s)"
            )

    def wait(self) -> None:
        """Until every snapshot in flight (both tiers) is written."""
        if self.snapshots is not None:
            self.snapshots.wait()
        if self.memory is not None:
            self.memory.wait()

    def close(self) -> None:
        """After a run that succeeded: the disk tier's writer stopped (its write in flight uses the snapshot
        group: before any teardown), the in-memory tier cleared (the disk holds the run's last snapshot)."""
        if self.snapshots is not None:
            self.snapshots.close()
        if self.memory is not None:
            self.memory.clear()

    def summary(self) -> dict:
        """The run summary's snapshot figures: what :meth:`resume` did, every snapshot taken, their stalls."""
        records = self.snapshots.records if self.snapshots is not None else []
        out: dict = {"resumed": self.resumed}
        if not records:
            return out
        stalls = sorted(r.stall_s for r in records)
        out["snapshots"] = [r.to_dict() for r in records]
        out["snapshot_stall_s_median"] = stalls[len(stalls) // 2]
        out["snapshot_stall_s_total"] = sum(stalls)
        out["snapshot_prepare_s"] = self.snapshots.prepare_s if self.snapshots is not None else 0.0
        return out
