"""The training loop. Built from small components (device, model, data, parallelize, metrics) like
torchtitan's ``Trainer``; ``train()`` is: maybe resume -> ``train_step`` per step -> publish figures.

Snapshots (``snapshot_every``, ``resume``) are :class:`~workers.training.train_state.TrainState`'s, beside
the loop (``Trainer.train_state``, as torchtitan's ``CheckpointManager``): :meth:`Trainer.snapshot_state` is
everything needed to continue bit for bit, in the layout this rank holds it (model and optimizer through
DCP's ``get_state_dict``, so FSDP2/TP DTensors stay sharded; step, data position and LR schedule; this rank's
RNG streams and comm-hook residuals), and :meth:`Trainer.restore_state` puts it back;
``workers.training.checkpoint`` stages, writes, verifies and reshards it. With ``snapshot_delta: log`` the
snapshots between full ones are logs: each step's gradients, as ``optimizer.step()`` consumed them, are
copied (``record_gradients``), a log holds them plus :meth:`Trainer.log_state`, and a resume replays them on
the chain's full snapshot. :meth:`Trainer.state_dict` is the same state for an in-memory copy."""

from __future__ import annotations

import contextlib
import faulthandler
import math
import os
import sys
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from workers.devices import backend as device_mod
from workers.green.job import JobEnergy
from workers.training import system_metrics
from workers.training.checkpoint import SnapshotInfo, SnapshotManager
from workers.training.checkpoint.memory import MemorySnapshots
from workers.training.comm.stats import measured_overlap, run_comm_figures, step_comm_figures
from workers.training.config import JobConfig
from workers.training.corpora import corpus_for_run
from workers.training.data import ShardedTokenLoader, TokenCorpus
from workers.training.hf.runtime import build_model, export_parallel, weights_loader
from workers.training.metrics import EventPublisher, NullPublisher, split_comm_compute
from workers.training.model import flops_per_token, num_params
from workers.training.optimizer import build_optimizer, scale_gradients
from workers.training.parallelize import (
    ParallelModel,
    cross_entropy,
    parallelize,
    pipeline_bubble_fraction,
)
from workers.training.supervision.progress import (
    ProgressWriter,
    group_start,
    process_start_unix,
    restart_count,
)
from workers.training.supervision.snapshot_now import SnapshotRequests
from workers.training.supervision.step_times import StepTimesWriter, blocking_wait
from workers.training.train_state import TrainState
from workers.training.validation import Validation

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
LOG_EVERY_S = 2.0
"""Rank 0 prints a progress line at most this often (and for the first and last step): the job's log."""


@dataclass
class StepResult:
    step: int
    loss: float
    grad_norm: float
    step_time_s: float
    lr: float
    expert_load: list[float] | None = None
    expert_imbalance: float | None = None
    profiled: bool = False
    comm: dict | None = None
    """This rank's DDP comm-hook figures of the step (``comm_s_total``, ``comm_s_exposed``, ``comm_bytes``)
    when a hook is active."""
    snapshot_stall_s: float | None = None
    """Training-thread seconds snapshots cost at this step (staging after it; with log snapshots, the copy
    of the gradients it consumed), not in ``step_time_s``."""


def lr_at(step: int, cfg: JobConfig) -> float:
    """Linear warmup to ``lr`` then cosine decay to 10% of it at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    total = max(1, cfg.start_step + cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / total)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


class Trainer:
    def __init__(
        self, cfg: JobConfig, *, rank: int = 0, world_size: int = 1, local_rank: int = 0, attempt: int = 1
    ):
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.attempt = attempt
        """Which launch of the job this run is: every published event says it (``attempt``)."""
        self.restart = restart_count()
        self.regrouped = group_start() > 1
        """Not the run's first group although torchrun counted no failure: the agent re-formed it after a
        membership change (agreed by every rank, :meth:`_agree_on_restart`)."""
        """Which torchrun restart of this attempt these processes are (0: the first start); after a restart
        the run continues from the newest good snapshot (:mod:`workers.reliability.elastic` watches it)."""
        self.progress = ProgressWriter.from_env(rank)
        if self.progress is not None:
            self.progress.update("starting")
        self.rescaled: dict | None = None
        """When torchrun started another number of ranks than the strategy's (``rescale``): the decision."""
        if cfg.world_size != world_size:
            if not cfg.rescale:
                raise ValueError(
                    f"strategy needs tp*pp*dp*cp = {cfg.world_size} processes, torchrun started {world_size}"
                )
            from workers.training.scaling import replan

            cfg, self.rescaled = replan(cfg, world_size)
            self.cfg = cfg
        self.device_choice = device_mod.select_device(cfg.device if cfg.device != "auto" else None)
        self.device = self.device_choice.device_for_local_rank(local_rank)
        if self.device.type != "cpu":
            getattr(torch, self.device.type).set_device(self.device)
        if not dist.is_initialized():
            dist.init_process_group(self.device_choice.backend, rank=rank, world_size=world_size)
        self.default_group = dist.distributed_c10d._get_default_group() if world_size > 1 else None
        """The default process group, for whoever tears the run down last (``workers.training.run``: its last
        reference must not be the DDP module's)."""
        self._agree_on_restart()
        self.step_times = StepTimesWriter.from_env(rank, restart=self.restart)
        """Every rank's step time and collective wait, one line per step, for the supervisor's straggler watch
        (:mod:`workers.training.supervision.step_times`); None when no supervisor watches."""
        self.snapshot_requests = SnapshotRequests.from_env() if local_rank == 0 else None
        """Local rank 0 of each node: the node's supervisor may ask for a snapshot now (a prevention action,
        :mod:`workers.training.supervision.snapshot_now`); the step's packed all-reduce carries it to every rank."""
        if self.progress is not None:
            self.progress.event("start", t=process_start_unix())
        torch.manual_seed(cfg.seed)

        model = build_model(cfg)  # our init, or a Hugging Face checkpoint's weights (hf_model)
        # a watched DDP job without a hook of its own: torch's plain all-reduce hook, timed (the step's
        # collective wait; bitwise the same gradients as DDP's built-in reduction, see step_times)
        self.pm: ParallelModel = parallelize(
            model,
            cfg,
            self.device,
            world_size,
            rank,
            timed_allreduce=self.step_times is not None,
            load_weights=weights_loader(cfg),  # a Hugging Face checkpoint, read per stage
        )
        for st in self.pm.comm_states:  # schedules scaled to the job (topk_ef's default density warm-up)
            if hasattr(st, "plan_for_job"):
                st.plan_for_job(cfg.start_step + cfg.steps)
        self.optimizer = build_optimizer(
            list(self.pm.parameters()), cfg.training.optimizer, cfg.lr, cfg.weight_decay, self.device
        )
        self.step = cfg.start_step
        # a tokenizer's corpus: its cached token shards (tokenized by each node's local rank 0 first)
        corpus = corpus_for_run(cfg, local_rank=local_rank, barrier=dist.barrier, log=self.log_line)
        self.validation = Validation.for_run(self, corpus.val if corpus else None)
        self.loader = ShardedTokenLoader(
            TokenCorpus(corpus.train) if corpus else TokenCorpus.from_source(cfg.data),
            cfg.model.seq_length,
            cfg.training.global_batch_size,
            dp_rank=self.pm.coords["dp"],
            dp_size=self.pm.dims.dp,
            seed=cfg.seed,
            consumed_samples=cfg.start_step * cfg.training.global_batch_size,
        )
        self.moe_layer_ids = cfg.model.moe_layer_ids
        self.num_experts = cfg.model.moe.num_experts if cfg.model.moe else 0
        self.autocast = AUTOCAST_DTYPES.get(cfg.training.dtype)
        self.tokens_per_step = cfg.training.global_batch_size * cfg.model.seq_length
        self.flops_per_token = flops_per_token(cfg.model)
        publishing = cfg.publish and cfg.job_id is not None and cfg.redis_url and rank == 0
        self.publisher = EventPublisher(cfg.redis_url, cfg.job_id) if publishing else NullPublisher()
        self.energy = None
        if (cfg.energy or {}).get("enabled", True):
            local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
            count = max(1, self.device_choice.count) if self.device.type != "cpu" else 1
            self.energy = JobEnergy(
                cfg.energy,
                device_kind=self.device.type,
                device_indices=sorted({r % count for r in range(local_world)}),
                rank=rank,
                world_size=world_size,
                local_rank=local_rank,
                under_torchrun="TORCHELASTIC_RUN_ID" in os.environ,
                collective_wait=blocking_wait.timed,
            )
        self.last_split = None
        # communication wall time and the part of it hidden under compute, summed over the profiled steps
        # (the run's measured overlap ratio: hidden / total)
        self.comm_hidden_sums = [0.0, 0.0, 0]
        self.publish_seconds = 0.0
        """Training-thread time spent building and handing over ``train`` events (the overhead bench)."""
        self.history: list[StepResult] = []
        self.grad_sync = next((st for st in self.pm.comm_states if hasattr(st, "bind_optimizer")), None)
        """``comm_order`` priority|magnitude: the gradient sync that steps each stage in its next forward."""
        if self.grad_sync is not None:
            self.grad_sync.bind_optimizer(self.optimizer)
        self.resuming = cfg.resume or bool(
            (self.restart or self.regrouped) and (cfg.snapshot_every or cfg.snapshot_memory_every)
        )
        """Resume at the start of :meth:`train`: asked for, or a later group of a snapshotting run (a torchrun
        restart, or a group re-formed after a membership change)."""
        self.train_state = TrainState(self)
        """The snapshots (disk and in-memory tiers), this rank's state as they save and load it, the resume."""
        if self.rescaled is not None:
            d = self.rescaled
            self.log_line(
                f"layout for {d['to_world_size']} rank(s) (the strategy is for {d['from_world_size']}): "
                f"{d['how']} ({d['strategy_before']} -> {d['strategy_after']})"
            )
        if self.progress is not None:
            self.progress.event("ready")

    def _agree_on_restart(self) -> None:
        """Every rank takes the highest restart count any rank was started with, and is a re-formed group's
        when any rank is (:data:`workers.training.supervision.progress.GROUP_START_ENV`). torchrun counts failures
        only: a node whose agent re-joins after a membership change (its link was down while the others
        restarted) starts its rank with the old count, and that rank would take itself for a first start --
        not resume, and refuse the snapshot directory (seen with ``drop-link``, docs/elastic.md); a node
        joining a job that began without it is on its agent's first group, the others are not."""
        if self.world_size == 1:
            return
        count = torch.tensor([self.restart, int(self.regrouped)], dtype=torch.int64, device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        agreed = int(count[0].item())
        self.regrouped = bool(
            count[1].item()
        )  # a node that joins a running job: its first group is not the run's
        if agreed != self.restart:
            print(
                f"rank {self.rank}: restart count {self.restart} -> {agreed}, the group's highest (its agent "
                "re-joined after a membership change)",
                flush=True,
            )
            self.restart = agreed
            if self.progress is not None:
                self.progress.restart = agreed
                self.progress.update("starting")

    # ------------------------------------------------------------------------------------------- a step

    def _forward_backward(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        """Runs forward and backward over the micro-batches; returns this rank's mean loss (last pipeline
        stage only, else ``None``)."""
        pm, cfg = self.pm, self.cfg
        autocast = (
            torch.autocast(self.device.type, dtype=self.autocast)
            if self.autocast
            else contextlib.nullcontext()
        )
        if pm.schedule is not None:
            # torch.distributed.pipelining splits the local batch into micro-batches itself and scales
            # gradients by 1/num_microbatches; it also handles DDP no_sync / FSDP gradient sync.
            losses: list[torch.Tensor] = []
            args = (inputs,) if pm.has_first_stage else ()
            kwargs = {"target": labels, "losses": losses} if pm.has_last_stage else {}
            with autocast:
                pm.schedule.step(*args, **kwargs)
            return torch.stack(losses).mean().detach() if pm.has_last_stage else None
        part = pm.parts[0]
        micro_inputs = inputs.split(cfg.strategy.micro_batch_size)
        micro_labels = labels.split(cfg.strategy.micro_batch_size)
        n = len(micro_inputs)
        total = torch.zeros((), device=self.device)
        for i, (x, y) in enumerate(zip(micro_inputs, micro_labels, strict=True)):
            last = i == n - 1
            if isinstance(part, DistributedDataParallel) and not last:
                sync = part.no_sync()
            else:
                sync = contextlib.nullcontext()
            if isinstance(part, FSDPModule):
                part.set_requires_gradient_sync(last)
            with sync:
                with autocast:
                    loss = cross_entropy(part(x), y) / n
                loss.backward()
            total += loss.detach()
        return total

    def _grad_sq_local(self) -> torch.Tensor:
        """This rank's share of the squared global gradient norm (:meth:`ParallelModel.grad_sq_local`)."""
        if self.grad_sync is not None:  # gradients still in flight: the previous step's averaged norm
            sq = self.grad_sync.last_grad_sq() / self.pm.dims.replicas
            return torch.tensor(sq, dtype=torch.float64, device=self.device)
        return self.pm.grad_sq_local(self.device)

    def train_step(self, inputs: torch.Tensor, labels: torch.Tensor) -> StepResult:
        cfg, pm = self.cfg, self.pm
        lr = lr_at(self.step, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        inputs, labels = inputs.to(self.device), labels.to(self.device)
        inputs, labels = pm.shard_sequence(inputs), pm.shard_sequence(labels)
        local_loss = self._forward_backward(inputs, labels)
        pm.finish_grads()
        comm = self._comm_figures()  # after finish_grads: a tensor-parallel ZeRO-0 hook reduces there

        # One small all-reduce per step carries everything rank 0 reports and clipping needs:
        # [grad_norm^2, loss sum, loss count, snapshot-now requests, expert loads (moe layers x experts)].
        loads = self.pm.collect_expert_load(self.moe_layer_ids, self.num_experts, self.device)
        contributes_loss = local_loss is not None and pm.coords["tp"] == 0
        head = torch.stack(
            [
                self._grad_sq_local(),
                (local_loss.double() if contributes_loss else torch.zeros((), dtype=torch.float64)).to(
                    self.device
                ),
                torch.tensor(1.0 if contributes_loss else 0.0, dtype=torch.float64, device=self.device),
                torch.tensor(
                    1.0 if self.snapshot_requests is not None and self.snapshot_requests.pending() else 0.0,
                    dtype=torch.float64,
                    device=self.device,
                ),
            ]
        )
        packed = torch.cat([head, loads.flatten().double()])
        if self.world_size > 1:
            with blocking_wait.timed():
                dist.all_reduce(packed)
        grad_norm = float(packed[0].sqrt())
        loss = float(packed[1] / packed[2].clamp(min=1))
        # the same sum on every rank: all snapshot after this step
        self.train_state.snapshot_now = bool(packed[3] > 0)
        global_loads = packed[4:].view_as(loads).float()

        if cfg.grad_clip > 0 and grad_norm > cfg.grad_clip:
            scale_gradients(pm.parameters(), cfg.grad_clip / (grad_norm + 1e-6))
        recorded_s = self.train_state.before_optimizer_step()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.pm.update_expert_bias(global_loads, self.moe_layer_ids, self.cfg.expert_bias_update_rate)
        self.step += 1

        result = StepResult(self.step, loss, grad_norm, 0.0, lr, comm=comm)
        if recorded_s:
            result.snapshot_stall_s = recorded_s
        if self.moe_layer_ids:
            share = global_loads / global_loads.sum(dim=1, keepdim=True).clamp(min=1)
            result.expert_load = [round(v, 5) for v in share.mean(0).tolist()]
            result.expert_imbalance = float((share.max(1).values / share.mean(1)).mean())
        return result

    def _comm_figures(self) -> dict | None:
        """This rank's comm-hook figures of the step just back-propagated (:func:`step_comm_figures`)."""
        return step_comm_figures(self.pm.comm_states)

    def _comm_switches(self) -> list[dict]:
        """The comm hooks' method/density switches since the last step (``adaptive``), each with its
        reason; every rank drains them, rank 0 publishes them as ``comm_switch`` events."""
        return [sw for st in self.pm.comm_states if hasattr(st, "take_switches") for sw in st.take_switches()]

    # -------------------------------------------------------------------------------------------- loop

    def _profiled_step(self, inputs, labels) -> StepResult:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        with profile(activities=activities) as prof:
            result = self.train_step(inputs, labels)
            device_mod.synchronize(self.device.type)
        self.last_split = split_comm_compute(prof.events())
        self.comm_hidden_sums[0] += self.last_split.comm_s
        self.comm_hidden_sums[1] += self.last_split.overlap_s
        self.comm_hidden_sums[2] += 1
        return result

    def train(self) -> dict:
        cfg, pm = self.cfg, self.pm
        bubble = pipeline_bubble_fraction(pm.dims.pp, cfg.strategy.vpp, cfg.num_microbatches)
        if self.resuming:
            self.train_state.resume_and_report()
        if self.progress is not None:
            self.progress.update("training", self.step)
        first = self.step + 1
        if self.energy is not None:
            self.energy.start(self.device, restart=self.restart)
            self._energy_from_step = self.step  # where this attempt began (after any resume)
        started = self._started_values()
        self.publisher.submit("event", started, step=self.step)
        self.log_line(
            f"attempt {self.attempt}: {started['world_size']} rank(s) · {started['strategy']} · "
            f"{started['device']}/{started['backend']} · {started['model']} ({started['params']:,} parameters) · "
            f"steps {first}-{cfg.start_step + cfg.steps}"
        )
        last_print = 0.0
        try:
            end = cfg.start_step + cfg.steps
            while self.step < end:
                t0 = time.perf_counter()
                inputs, labels = self.loader.next_batch()
                profile_now = cfg.profile_every and (self.step + 1) % cfg.profile_every == 0
                result = (
                    self._profiled_step(inputs, labels) if profile_now else self.train_step(inputs, labels)
                )
                device_mod.synchronize(self.device.type)
                # a log snapshot's gradient copy inside the step is snapshot stall, not training
                result.step_time_s = time.perf_counter() - t0 - (result.snapshot_stall_s or 0.0)
                result.profiled = bool(profile_now)
                self.history.append(result)
                # every rank: a gather of memory / CPU figures every few steps (rank 0 gets {"ranks": [...]}):
                # the step's last collective, before anything that reports the step done (a snapshot of it,
                # its progress, its train event). With a collective between those, a peer killed once it
                # reported the step left this rank inside the collective: a snapshot of the step existed
                # (a resume went past it) while its timeline line or its train event was never written.
                val = self.validation.after(result.step, end) if self.validation else {}  # val_loss
                ranks = system_metrics.rank_values(result.step, self.device) | val
                if self.snapshots is not None:
                    self.train_state.snapshot_after(result)
                if self.progress is not None:
                    self.progress.update("training", result.step)
                    self.progress.event(
                        "step",
                        step=result.step,
                        loss=result.loss,
                        step_time_s=result.step_time_s,
                        stall_s=result.snapshot_stall_s or 0.0,
                    )
                if self.rank == 0 and not isinstance(self.publisher, NullPublisher):
                    t_pub = time.perf_counter()
                    values = self._train_values(result, bubble) | ranks
                    self.publisher.submit("train", values, step=result.step)
                    self.publish_seconds += time.perf_counter() - t_pub
                for switch in self._comm_switches():
                    if self.rank == 0:
                        self.publisher.submit("event", {"comm_switch": switch}, step=result.step)
                self._publish_energy(result.step)
                if self.step_times is not None:  # after the loop's last collective: the whole iteration
                    exposed = (result.comm or {}).get("comm_s_exposed")
                    self.step_times.record(result.step, wait_s=(exposed or 0.0) + blocking_wait.take())
                now = time.monotonic()
                if now - last_print >= LOG_EVERY_S or result.step in (first, end):
                    last_print = now
                    self.log_line(self._step_line(result, end))
        except Exception as exc:
            self.publisher.submit(
                "event",
                {"state": "failed", "attempt": self.attempt, "message": f"{type(exc).__name__}: {exc}"},
            )
            self.publisher.close()
            raise
        if self.grad_sync is not None:  # the last step's update, still waiting for a next forward
            self.grad_sync.flush()
        self._publish_energy(self.step, final=True)
        if self.progress is not None:
            self.progress.update("finishing")
        self.train_state.wait()  # the last snapshot published before the run says it finished
        if cfg.save_hf:  # every rank: the layout's pieces gathered, each stage's shard written
            export_parallel(pm, cfg, cfg.save_hf, self.rank)
        if self.progress is not None:
            self.progress.event("end", step=self.step)
        summary = self.summary()
        self.publisher.submit(
            "event", {"state": "finished", "attempt": self.attempt, **summary}, step=self.step
        )
        self.publisher.close()
        return summary

    def _publish_energy(self, step: int, *, final: bool = False) -> None:
        """Every rank after every step (a collective on sampling steps): rank 0 publishes an ``energy`` event
        with the job's running kWh and kgCO2e since this attempt started."""
        if self.energy is None:
            return
        # tokens trained by this attempt: a resumed one began at its snapshot's step, not at start_step (the
        # job's totals add the attempts up, so counting from start_step counted the earlier steps twice)
        tokens = self.tokens_per_step * (step - self._energy_from_step)
        if final:
            values = self.energy.finish(step, tokens, self.device)
        else:
            values = self.energy.sample(step, tokens, self.device)
        if values is not None and self.rank == 0:
            self.publisher.submit("energy", {"attempt": self.attempt, **values}, step=step)

    def log_line(self, line: str) -> None:
        """A line of the job's log (rank 0 only; the node supervisor streams it to the job page)."""
        if self.rank == 0:
            print(line, flush=True)

    def _step_line(self, r: StepResult, end: int) -> str:
        tokens_per_s = self.tokens_per_step / r.step_time_s if r.step_time_s else 0.0
        return (
            f"step {r.step}/{end} · loss {r.loss:.4f} · {r.step_time_s * 1000:.1f} ms · "
            f"{tokens_per_s:,.0f} tokens/s · grad norm {r.grad_norm:.3f}"
            + (" · profiled (slowed by the profiler)" if r.profiled else "")
        )

    def _started_values(self) -> dict:
        cfg = self.cfg
        return {
            "state": "started",
            "attempt": self.attempt,
            "restart": self.restart,
            "world_size": self.world_size,
            "strategy": cfg.strategy.short_name(),
            "device": self.device_choice.kind,
            "backend": self.device_choice.backend,
            "device_note": self.device_choice.explain(),
            "model": cfg.model.name,
            "params": num_params(cfg.model, active=False),
            "active_params": num_params(cfg.model, active=True),
            "corpus_tokens": self.loader.corpus.num_tokens,
            "start_step": cfg.start_step,
            "steps": cfg.steps,
        }

    def _train_values(self, r: StepResult, bubble: float) -> dict:
        tokens_per_s = self.tokens_per_step / r.step_time_s
        tflops = self.flops_per_token * tokens_per_s / self.world_size / 1e12
        values = {
            "attempt": self.attempt,
            "restart": self.restart,
            "loss": round(r.loss, 6),
            "tokens_per_s": round(tokens_per_s, 2),
            "step_time_s": round(r.step_time_s, 6),
            "bubble_fraction": round(bubble, 4),
            "memory_GiB": round(device_mod.max_memory_GiB(self.device.type), 4),
            "grad_norm": round(r.grad_norm, 6),
            "lr": r.lr,
            "tflops": round(tflops, 6),
        }
        if r.profiled:  # this step ran under the profiler: its step time is inflated, its tokens/s deflated
            values["profiled"] = True
        if self.cfg.peak_tflops:
            values["mfu"] = round(tflops / self.cfg.peak_tflops, 5)
        if self.last_split is not None:  # from the latest profiled step (profile_every)
            values["compute_s"] = round(self.last_split.compute_s, 6)
            values["comm_s"] = round(self.last_split.comm_s, 6)
            values["exposed_comm_s"] = round(self.last_split.exposed_comm_s, 6)
            if self.last_split.comm_s > 0:
                values["overlap_ratio"] = round(self.last_split.overlap_s / self.last_split.comm_s, 4)
        if r.expert_load is not None:
            values["expert_load"] = r.expert_load
            values["expert_imbalance"] = round(r.expert_imbalance, 4)
        if r.comm is not None:  # rank 0's own comm-hook figures of this step
            values["comm_s_total"] = round(r.comm["comm_s_total"], 6)
            values["comm_s_exposed"] = round(r.comm["comm_s_exposed"], 6)
            values["comm_bytes"] = r.comm["comm_bytes"]
            if "comm_density" in r.comm:
                values["comm_density"] = round(r.comm["comm_density"], 6)
        return values

    def summary(self) -> dict:
        h = self.history
        if not h:  # resumed at the last step (a run that died after its final snapshot): nothing to train
            return {
                "world_size": self.world_size,
                "strategy": self.cfg.strategy.short_name(),
                "model": self.cfg.model.name,
                "device": self.device_choice.kind,
                "steps": 0,
                "tokens_per_step": self.tokens_per_step,
                "losses": [],
                "note": f"nothing left to train: resumed at step {self.step} of {self.cfg.start_step + self.cfg.steps}",
                **self.train_state.summary(),
            }
        # Steady-state figures skip the first step (process-group warm-up, allocator growth) and the
        # profiled steps (the profiler slows them) when any other step is left.
        steady = [r for r in h[1:] if not r.profiled] or h[1:] or h
        step_time = sum(r.step_time_s for r in steady) / len(steady)
        out = {
            "world_size": self.world_size,
            "strategy": self.cfg.strategy.short_name(),
            "strategy_config": {
                k: getattr(self.cfg.strategy, k) for k in self.cfg.strategy.__dataclass_fields__
            },
            "groups": self.pm.dims.groups(self.rank),  # this rank's groups under strategy.order
            "model": self.cfg.model.name,
            "device": self.device_choice.kind,
            "steps": len(h),
            "tokens_per_step": self.tokens_per_step,
            "tokens_per_s": round(self.tokens_per_step / step_time, 2),
            "step_time_s": round(step_time, 6),
            "step_times_s": [round(r.step_time_s, 6) for r in h],
            "loss_first": h[0].loss,
            "loss_last": h[-1].loss,
            **({"val_loss": self.validation.last} if self.validation else {}),
            "losses": [r.loss for r in h],
            "grad_norm_last": h[-1].grad_norm,
            "bubble_fraction": pipeline_bubble_fraction(
                self.pm.dims.pp, self.cfg.strategy.vpp, self.cfg.num_microbatches
            ),
            "memory_GiB": round(device_mod.max_memory_GiB(self.device.type), 4),
            # the weights this rank holds (its TP/FSDP/EP pieces), against the model's total
            "parameters_rank0": sum(
                (p.to_local() if isinstance(p, DTensor) else p).numel() for p in self.pm.parameters()
            ),
            "parameters_total": num_params(self.cfg.model, active=False),
            # model FLOP/s per device at the steady step time (6N + attention per token, model.py)
            "tflops_per_device": round(
                self.flops_per_token * self.tokens_per_step / step_time / self.world_size / 1e12, 6
            ),
        }
        if self.cfg.peak_tflops:
            out["mfu"] = round(out["tflops_per_device"] / self.cfg.peak_tflops, 5)
        if self.last_split is not None:
            out["compute_s"], out["comm_s"] = self.last_split.compute_s, self.last_split.comm_s
        out.update(measured_overlap(self.comm_hidden_sums, [r.comm for r in steady if r.comm is not None]))
        if h[-1].expert_load is not None:
            out["expert_load"] = h[-1].expert_load
        if isinstance(self.publisher, EventPublisher):
            out["publish_s"] = self.publish_seconds
            out["events_submitted"] = self.publisher.submitted.to_dict()
        out["bucket_cap_mb"] = self.pm.bucket_cap_mb
        out.update(self.train_state.summary())
        if self.energy is not None and self.energy.summary() is not None:
            out["energy"] = self.energy.summary()
        if self.cfg.comm_hook:
            out["comm_hook"] = self.cfg.comm_hook
        if self.cfg.comm_order != "reverse":
            out["comm_order"] = self.cfg.comm_order
        out.update(run_comm_figures([r.comm for r in steady if r.comm is not None]))
        if any(hasattr(st, "switches") for st in self.pm.comm_states):  # adaptive: every switch and why
            out["comm_switches"] = [sw for st in self.pm.comm_states for sw in getattr(st, "switches", [])]
        return out

    # ---------------------------------------------------------------------------------- checkpoint seam
    # The state itself lives in :class:`~workers.training.train_state.TrainState` (``train_state``); these
    # are its entry points on the trainer.

    @property
    def snapshots(self) -> SnapshotManager | None:
        """The disk tier of the snapshots (``snapshot_every``), None when the run takes none."""
        return self.train_state.snapshots

    @snapshots.setter
    def snapshots(self, manager: SnapshotManager | None) -> None:
        self.train_state.snapshots = manager

    @property
    def memory(self) -> MemorySnapshots | None:
        """The in-memory tier (``snapshot_memory_every``), None when the run keeps none."""
        return self.train_state.memory

    @property
    def resumed(self) -> dict | None:
        """After :meth:`resume`: the snapshot continued from, the ones skipped and why, the seconds taken."""
        return self.train_state.resumed

    def state_dict(self) -> dict:
        """:meth:`TrainState.state_dict <workers.training.train_state.TrainState.state_dict>`."""
        return self.train_state.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """:meth:`TrainState.load_state_dict <workers.training.train_state.TrainState.load_state_dict>`."""
        self.train_state.load_state_dict(state)

    def layout(self) -> dict:
        """:meth:`TrainState.layout <workers.training.train_state.TrainState.layout>`."""
        return self.train_state.layout()

    def logged_parameters(self) -> dict[str, torch.Tensor]:
        """:meth:`TrainState.logged_parameters <workers.training.train_state.TrainState.logged_parameters>`."""
        return self.train_state.logged_parameters()

    def snapshot_state(self, *, rank_entries: bool = True) -> dict:
        """:meth:`TrainState.snapshot_state <workers.training.train_state.TrainState.snapshot_state>`."""
        return self.train_state.snapshot_state(rank_entries=rank_entries)

    def log_state(self, *, rank_entries: bool = True) -> dict:
        """:meth:`TrainState.log_state <workers.training.train_state.TrainState.log_state>`."""
        return self.train_state.log_state(rank_entries=rank_entries)

    def restore_state(self, state: dict) -> list[str]:
        """:meth:`TrainState.restore_state <workers.training.train_state.TrainState.restore_state>`."""
        return self.train_state.restore_state(state)

    def resume(self) -> dict:
        """:meth:`TrainState.resume <workers.training.train_state.TrainState.resume>`."""
        return self.train_state.resume()

    def restore_snapshot(self, info: SnapshotInfo, *, rank_entries: bool) -> tuple[list[str], list]:
        """:meth:`TrainState.restore_snapshot <workers.training.train_state.TrainState.restore_snapshot>`."""
        return self.train_state.restore_snapshot(info, rank_entries=rank_entries)

    def close(self, *, succeeded: bool = True) -> None:
        """Stop the publisher and hook threads and tear the process groups down -- after a failure only the
        threads: a rank that raised may leave others inside a collective, and destroying groups then
        deadlocks (torchtitan#1342); torchrun stops the other ranks anyway."""
        self.publisher.close()
        if self.energy is not None:
            self.energy.close()
        if self.step_times is not None:
            self.step_times.close()
        if self.progress is not None:
            self.progress.close()
        for st in self.pm.comm_states:
            close = getattr(st, "close", None)
            if close is not None:
                close()  # worker threads of powerSGD / hierarchical
        if succeeded:
            self.train_state.close()  # the write in flight uses the snapshot group: before any teardown
        if not (succeeded and dist.is_initialized()):
            return
        # Training is over and its results are out: a teardown that hangs must not hold the job forever.
        watchdog = threading.Timer(TEARDOWN_TIMEOUT_S, abandon_teardown, args=(self.rank,))
        watchdog.daemon = True
        watchdog.start()
        faulthandler.dump_traceback_later(TEARDOWN_TIMEOUT_S + 10, exit=True)  # if no Python thread can run
        try:
            store = dist.distributed_c10d._get_default_store() if self.world_size > 1 else None
            if store is not None:
                dist.barrier()  # every rank is done with its collectives before any group goes away
            dist.destroy_process_group()
            if store is not None:
                exit_barrier(store, self.rank, self.world_size)
        finally:
            watchdog.cancel()
            faulthandler.cancel_dump_traceback_later()


TEARDOWN_TIMEOUT_S = 60.0


def abandon_teardown(rank: int) -> None:
    """The watchdog of :meth:`Trainer.close`: say so, leave every thread's traceback in the log, exit 0."""
    print(
        f"rank {rank}: process-group teardown did not finish {TEARDOWN_TIMEOUT_S:.0f} s after training ended; "
        "exiting anyway (the run's results are already written). Where it hung:",
        file=sys.stderr,
        flush=True,
    )
    faulthandler.dump_traceback(all_threads=True)
    os._exit(0)


def exit_barrier(store, rank: int, world_size: int, timeout_s: float = TEARDOWN_TIMEOUT_S / 2) -> None:
    """Rank 0 leaves last. Its process hosts the TCPStore (torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)
    that every rank's groups were built on; a rank still tearing down when it vanishes can wait on it for
    good (a rare hang seen here: rank 0 had exited, rank 1 never did). Each rank counts itself out on the
    store (``_get_default_store`` is private, but it is the store init_process_group made) and rank 0
    waits for all of them, as Paddle's store barrier does (PaddlePaddle/Paddle#44964)."""
    key = "cann_train/exited"
    store.add(key, 1)
    if rank != 0:
        return
    deadline = time.monotonic() + timeout_s
    while store.add(key, 0) < world_size and time.monotonic() < deadline:
        time.sleep(0.02)


def env_rank() -> tuple[int, int, int]:
    return (
        int(os.environ.get("RANK", 0)),
        int(os.environ.get("WORLD_SIZE", 1)),
        int(os.environ.get("LOCAL_RANK", 0)),
    )
