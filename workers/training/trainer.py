"""The training loop. Built from small components (device, model, data, parallelize, metrics) like
torchtitan's ``Trainer``; ``train()`` is: maybe resume -> ``train_step`` per step -> publish figures.

Snapshots (``snapshot_every``, ``resume``): :meth:`Trainer.snapshot_state` is everything needed to continue
bit for bit, in the layout this rank holds it (model and optimizer through DCP's ``get_state_dict``, so
FSDP2/TP DTensors stay sharded; step, data position and LR schedule; this rank's RNG streams and comm-hook
residuals), and :meth:`Trainer.restore_state` puts it back; ``workers.training.checkpoint`` stages, writes,
verifies and reshards it. With ``snapshot_delta: log`` the snapshots between full ones are logs: each step's
gradients, as ``optimizer.step()`` consumed them, are copied (``record_gradients``), a log holds them plus
:meth:`Trainer.log_state`, and a resume replays them on the chain's full snapshot. :meth:`Trainer.state_dict`
is the same state for an in-memory copy."""

from __future__ import annotations

import contextlib
import faulthandler
import math
import os
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from workers.devices import backend as device_mod
from workers.green.job import JobEnergy
from workers.training import system_metrics
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
from workers.training.config import JobConfig
from workers.training.data import ShardedTokenLoader, TokenCorpus
from workers.training.metrics import EventPublisher, NullPublisher, split_comm_compute
from workers.training.model import Transformer, flops_per_token, num_params
from workers.training.parallelize import (
    ParallelModel,
    cross_entropy,
    is_expert_param,
    parallelize,
    pipeline_bubble_fraction,
    tp_shard_count,
)
from workers.training.supervision.progress import (
    ProgressWriter,
    group_start,
    process_start_unix,
    restart_count,
)
from workers.training.supervision.snapshot_now import SnapshotRequests
from workers.training.supervision.step_times import StepTimesWriter, blocking_wait

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
LOG_EVERY_S = 2.0
"""Rank 0 prints a progress line at most this often (and for the first and last step): the job's log."""
SNAPSHOT_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
"""Optimizer state keyed ``state.<fqn>.<name>`` / ``param_groups.<fqn>.<name>``: pipeline stages' entries
never collide, and a snapshot loads on another layout by parameter name."""
BUFFERS_OPTIONS = StateDictOptions(strict=False)
"""Putting back a log's model entries: its buffers only (the parameters come from the replay)."""
SNAPSHOT_GROUP_TIMEOUT = timedelta(minutes=10)
"""Timeout of the snapshot process group's collectives (planning, the final gather of write results)."""


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
        self._agree_on_restart()
        self.step_times = StepTimesWriter.from_env(rank, restart=self.restart)
        """Every rank's step time and collective wait, one line per step, for the supervisor's straggler watch
        (:mod:`workers.training.supervision.step_times`); None when no supervisor watches."""
        self.snapshot_requests = SnapshotRequests.from_env() if local_rank == 0 else None
        """Local rank 0 of each node: the node's supervisor may ask for a snapshot now (a prevention action,
        :mod:`workers.training.supervision.snapshot_now`); the step's packed all-reduce carries it to every rank."""
        self._snapshot_now = False
        if self.progress is not None:
            self.progress.event("start", t=process_start_unix())
        torch.manual_seed(cfg.seed)

        model = Transformer.build(cfg.model, cfg.seed)
        # a watched DDP job without a hook of its own: torch's plain all-reduce hook, timed (the step's
        # collective wait; bitwise the same gradients as DDP's built-in reduction, see step_times)
        self.pm: ParallelModel = parallelize(
            model, cfg, self.device, world_size, rank, timed_allreduce=self.step_times is not None
        )
        for st in self.pm.comm_states:  # schedules scaled to the job (topk_ef's default density warm-up)
            if hasattr(st, "plan_for_job"):
                st.plan_for_job(cfg.start_step + cfg.steps)
        params = list(self.pm.parameters())
        # Expert weights in a group of their own: sharded on another mesh (edp) than the rest, or plain
        # tensors beside DTensors; a foreach step cannot mix either. Each group is homogeneous.
        groups = [
            {"params": group, "foreach": not _mixes_dtensors(group)}
            for group in (
                [p for p in params if not is_expert_param(p)],
                [p for p in params if is_expert_param(p)],
            )
            if group
        ]
        if cfg.training.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(groups, lr=cfg.lr, momentum=0.9)
        else:  # adam / adamw: torch's AdamW (decoupled weight decay; identical to Adam when it is 0)
            # torch's fused kernel (CPU and CUDA) where every parameter is a plain tensor: one pass over the
            # parameters instead of ~10 foreach ops, which matters where ranks share few CPU cores
            fused = self.device.type in ("cpu", "cuda") and not any(isinstance(p, DTensor) for p in params)
            if fused:
                groups = [{"params": g["params"]} for g in groups]
            self.optimizer = torch.optim.AdamW(
                groups,
                lr=cfg.lr,
                betas=(0.9, 0.95),
                weight_decay=cfg.weight_decay,
                **({"fused": True} if fused else {}),
            )
        self.step = cfg.start_step
        self.loader = ShardedTokenLoader(
            TokenCorpus.from_source(cfg.data),
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
        self._state_module = state_module(self.pm.raw_parts)
        self._expert_fqns, self._expert_suffix = self._per_rank_chunks()
        self._param_fqns, self._log_params = self._parameter_keys()
        self._group_of = {id(p): i for i, g in enumerate(self.optimizer.param_groups) for p in g["params"]}
        self.grad_sync = next((st for st in self.pm.comm_states if hasattr(st, "bind_optimizer")), None)
        """``comm_order`` priority|magnitude: the gradient sync that steps each stage in its next forward."""
        if self.grad_sync is not None:
            self.grad_sync.bind_optimizer(self.optimizer)
        self.resumed: dict | None = None
        """After :meth:`resume`: the snapshot continued from, the ones skipped and why, the seconds taken."""
        self._snapshot_buffers_started = False
        self.snapshots: SnapshotManager | None = None
        self.resuming = cfg.resume or bool(
            (self.restart or self.regrouped) and (cfg.snapshot_every or cfg.snapshot_memory_every)
        )
        """Resume at the start of :meth:`train`: asked for, or a later group of a snapshotting run (a torchrun
        restart, or a group re-formed after a membership change)."""
        if cfg.snapshot_every or cfg.snapshot_memory_every or self.resuming:
            # a gloo group of its own: DCP's planning collectives run in the writer thread, on CPU tensors,
            # and never queue behind (or between) the training collectives of the default group
            group = dist.new_group(backend="gloo", timeout=SNAPSHOT_GROUP_TIMEOUT)
            self.snapshots = SnapshotManager(
                cfg.snapshot_dir,
                rank=rank,
                world_size=world_size,
                process_group=group,
                full_every=cfg.snapshot_full_every,
                keep=cfg.snapshot_keep,
                layout=self.layout(),
                log=self._print,
                fresh=not self.resuming,
                delta=cfg.snapshot_delta,
            )
        self.memory: MemorySnapshots | None = None
        """The in-memory tier (``snapshot_memory_every``): this rank's newest state in the node's RAM."""
        if cfg.snapshot_memory_every:
            self.memory = MemorySnapshots(cfg.snapshot_dir, rank, self.layout())
            if not self.resuming:
                self.memory.clear()  # another run's state under the same directory is not ours
        if self.rescaled is not None:
            d = self.rescaled
            self._print(
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
        """This rank's share of the squared global gradient norm: each gradient piece divided by the number
        of ranks holding an identical copy, so that one SUM all-reduce over the world gives the total."""
        dp, tp = self.pm.dims.replicas, self.pm.dims.tp  # dp * cp ranks hold the same parameters
        if self.grad_sync is not None:  # gradients still in flight: the previous step's averaged norm
            return torch.tensor(self.grad_sync.last_grad_sq() / dp, dtype=torch.float64, device=self.device)
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in self.pm.parameters():
            if p.grad is None:
                continue
            g = p.grad
            # ranks holding this exact piece: experts are whole on the dp*cp/ep ranks of an EP slot (x tp),
            # everything else on all dp*cp (x tp); FSDP/TP shards divide that by their piece count
            copies = ((dp // self.pm.dims.ep) if is_expert_param(p) else dp) * tp
            if isinstance(g, DTensor):
                copies //= tp_shard_count(g)
                g = g.to_local()
            # the norm in float64 without materialising a float64 copy of the gradient
            total += torch.linalg.vector_norm(g.detach(), dtype=torch.float64).square() / copies
        return total

    def _collect_expert_load(self) -> torch.Tensor:
        loads = torch.zeros(len(self.moe_layer_ids), max(self.num_experts, 1), device=self.device)
        for layer_id, moe in self.pm.moe_layers():
            if self.pm.coords["tp"] == 0:  # TP ranks route the same tokens: count once
                loads[self.moe_layer_ids.index(layer_id)] = moe.tokens_per_expert
            moe.tokens_per_expert.zero_()
        return loads

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
        loads = self._collect_expert_load()
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
        self._snapshot_now = bool(packed[3] > 0)  # the same sum on every rank: all snapshot after this step
        global_loads = packed[4:].view_as(loads).float()

        if cfg.grad_clip > 0 and grad_norm > cfg.grad_clip:
            coef = cfg.grad_clip / (grad_norm + 1e-6)
            for p in pm.parameters():
                if p.grad is not None:
                    p.grad.mul_(coef)
        recorded_s = self._record_gradients() if self.snapshots is not None else 0.0
        if self.memory is not None:  # the in-memory copy of the last state must be done before it changes
            recorded_s += self.memory.wait()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._update_expert_bias(global_loads)
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
        """This rank's comm-hook figures of the step just back-propagated, summed over its DDP parts:
        total and exposed communication seconds (see ``workers.training.comm.stats``) and the gradient
        bytes this rank put into collectives. Reads counters only: no communication, no sync."""
        states = self.pm.comm_states
        if not states:
            return None
        out = {"comm_s_total": 0.0, "comm_s_exposed": 0.0, "comm_bytes": 0, "dense_fp32_bytes": 0}
        for st in states:
            figures = st.comm_stats()
            out["comm_s_total"] += figures["comm_s_total"]
            out["comm_s_exposed"] += figures["comm_s_exposed"]
            out["comm_bytes"] += int(figures["bytes_sent"])
            out["dense_fp32_bytes"] += int(figures["dense_fp32_bytes"])
            if "inter_node_bytes" in figures:
                out["inter_node_bytes"] = out.get("inter_node_bytes", 0) + int(figures["inter_node_bytes"])
            if "density" in figures:  # share of the gradient elements selected (top-k warm-up, adaptive)
                out["density_elements"] = out.get("density_elements", 0.0) + figures.get(
                    "density_elements", 0.0
                )
        if "density_elements" in out:
            elements = out["dense_fp32_bytes"] / 4
            out["comm_density"] = out.pop("density_elements") / elements if elements else 1.0
        return out

    def _comm_switches(self) -> list[dict]:
        """The comm hooks' method/density switches since the last step (``adaptive``), each with its
        reason; every rank drains them, rank 0 publishes them as ``comm_switch`` events."""
        return [sw for st in self.pm.comm_states if hasattr(st, "take_switches") for sw in st.take_switches()]

    def _update_expert_bias(self, global_loads: torch.Tensor) -> None:
        """DeepSeek-V3 auxiliary-loss-free balancing: b_i += gamma * sign(mean load - load_i)."""
        rate = self.cfg.expert_bias_update_rate
        with torch.no_grad():
            for layer_id, moe in self.pm.moe_layers():
                load = global_loads[self.moe_layer_ids.index(layer_id)]
                moe.expert_bias.add_(rate * torch.sign(load.mean() - load))

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
            if self.progress is not None:
                self.progress.update("resuming")
            resumed = self.resume()
            if self.progress is not None:
                self.progress.event(
                    "resumed",
                    from_step=self.step if resumed["from"] else None,
                    snapshot=resumed["from"],
                    tier=resumed.get("tier", "disk"),
                    seconds=resumed["seconds"],
                    skipped=resumed["skipped"],
                )
        if self.progress is not None:
            self.progress.update("training", self.step)
        first = self.step + 1
        if self.energy is not None:
            self.energy.start(self.device)
            self._energy_from_step = self.step  # where this attempt began (after any resume)
        started = self._started_values()
        self.publisher.submit("event", started, step=self.step)
        self._print(
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
                ranks = system_metrics.rank_values(result.step, self.device)
                if self.snapshots is not None:
                    self._snapshot_after(result)
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
                    self._print(self._step_line(result, end))
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
        if self.snapshots is not None:
            self.snapshots.wait()  # the last snapshot published before the run says it finished
        if self.memory is not None:
            self.memory.wait()
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

    def _print(self, line: str) -> None:
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
                **self._snapshot_summary(),
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
        out.update(self._overlap_summary(steady))
        if h[-1].expert_load is not None:
            out["expert_load"] = h[-1].expert_load
        if isinstance(self.publisher, EventPublisher):
            out["publish_s"] = self.publish_seconds
        out["bucket_cap_mb"] = self.pm.bucket_cap_mb
        out.update(self._snapshot_summary())
        if self.energy is not None and self.energy.summary() is not None:
            out["energy"] = self.energy.summary()
        if self.cfg.comm_hook:
            out["comm_hook"] = self.cfg.comm_hook
        if self.cfg.comm_order != "reverse":
            out["comm_order"] = self.cfg.comm_order
        measured = [r.comm for r in steady if r.comm is not None]
        if measured:  # rank 0's comm-hook figures, averaged like the step time
            for key in (
                "comm_s_total",
                "comm_s_exposed",
                "comm_bytes",
                "dense_fp32_bytes",
                "inter_node_bytes",
                "comm_density",
            ):
                if key in measured[-1]:
                    out[key] = sum(m.get(key, 0) for m in measured) / len(measured)
            # bytes of the last step: the steady state after any density / PowerSGD warm-up
            out["comm_bytes_last"] = measured[-1]["comm_bytes"]
            if "comm_density" in measured[-1]:
                out["comm_density_last"] = measured[-1]["comm_density"]
        if any(hasattr(st, "switches") for st in self.pm.comm_states):  # adaptive: every switch and why
            out["comm_switches"] = [sw for st in self.pm.comm_states for sw in getattr(st, "switches", [])]
        return out

    def _overlap_summary(self, steady: list[StepResult]) -> dict:
        """The measured overlap ratio: communication hidden under compute / all communication. From the
        profiled steps where there are any (every collective and p2p op, as wall-time intervals: what the
        planner's ratio counts too), else from the DP comm hook's own timing (1 - exposed / total; its
        total sums the buckets, which overlap each other, so it reads high)."""
        comm, hidden, n = self.comm_hidden_sums
        if n and comm > 0:
            return {
                "overlap_ratio": round(hidden / comm, 4),
                "overlap_source": f"profiler, {n} profiled step(s), every collective",
            }
        hooked = [r.comm for r in steady if r.comm is not None and r.comm.get("comm_s_total")]
        if hooked:
            total = sum(c["comm_s_total"] for c in hooked)
            exposed = sum(min(c["comm_s_exposed"], c["comm_s_total"]) for c in hooked)
            return {
                "overlap_ratio": round(max(0.0, 1.0 - exposed / total), 4),
                "overlap_source": "comm hook timing, data-parallel buckets only (run with profile_every for all)",
            }
        return {}

    # ---------------------------------------------------------------------------------- checkpoint seam

    def state_dict(self) -> dict:
        """Everything a snapshot needs: model parts (sharded where FSDP/TP shard them), optimizer, data
        position, step. ``torch.distributed.checkpoint`` can save it as is."""
        state = {
            "step": self.step,
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
        self.step = int(state["step"])
        hook_states = state.get("comm_hook")
        if hook_states is None and self.pm.comm_states:
            raise ValueError(
                "the snapshot has no comm-hook state but this run uses " + str(self.cfg.comm_hook)
            )
        for st, hook_state in zip(self.pm.comm_states, hook_states or [], strict=True):
            st.load_state_dict(hook_state)

    # ------------------------------------------------------------------------------------------ snapshots

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

    def _record_gradients(self) -> float:
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
        self.snapshots.record_gradients(self.step + 1, grads, meta)
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
                "step": self.step,
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
        self.step = int(progress["step"])
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

    def resume(self) -> dict:
        """Continue from the newest snapshot in ``snapshot_dir`` that verifies; newer ones that do not are
        skipped (and said so). Loads on any layout (DCP reshards); this rank's own entries only when the
        layout is the one the snapshot was taken on. Returns (and keeps in ``resumed``) what happened."""
        assert self.snapshots is not None
        t0 = time.perf_counter()
        # a chosen snapshot (a restore) on the first start only: a torchrun restart continues from the newest
        exactly = self.cfg.resume_from if self.restart == 0 and not self.regrouped else None
        if exactly is None and self.memory is not None:
            in_memory = self._resume_from_memory(t0)
            if in_memory is not None:
                return in_memory
        info, skipped = self.snapshots.latest_good(exactly)
        for s in skipped:
            self._print(f"resume: skipped snapshot {s.name}: {s.reason}")
        out: dict = {"from": None, "skipped": [{"name": s.name, "reason": s.reason} for s in skipped]}
        if info is None:
            self._print(
                f"resume: no usable snapshot in {self.cfg.snapshot_dir}; starting at step {self.step}"
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
                    "step": self.step,
                    "kind": info.kind,
                    "same_layout": same_layout,
                    "taken_on": info.manifest.get("layout"),
                    "notes": notes,
                }
            )
            if len(chain) > 1:
                out["chain"] = [link.name for link in chain]
                out["replayed_steps"] = self.step - chain[0].step
            layout = (
                ""
                if same_layout
                else f" (taken on {info.manifest['layout']['world_size']} rank(s), resharded)"
            )
            how = (
                f"log: {chain[0].name} + {len(chain) - 1} log(s), {self.step - chain[0].step} step(s) replayed"
                if len(chain) > 1
                else info.kind
            )
            self._print(
                f"resume: continuing from {info.name} ({how}) at step {self.step}{layout} "
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
        if self.rescaled is not None:
            d["how"] = self.rescaled["how"]
        before, after = d["predicted_before"] or {}, d["predicted_after"] or {}
        self._print(
            f"{d['action']}: {d['from_world_size']} -> {d['to_world_size']} rank(s), {d['strategy_before']} -> "
            f"{d['strategy_after']}, global batch {d['global_batch_size']} kept; planner's prediction "
            f"{before.get('tokens_per_s', '?')} -> {after.get('tokens_per_s', '?')} tokens/s"
        )
        if self.progress is not None:
            self.progress.event("rescaled", **d)

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
            "step": self.step,
            "kind": "memory",
            "same_layout": True,
            "skipped": [],
            "notes": notes,
            "seconds": round(time.perf_counter() - t0, 4),
        }
        self._print(
            f"resume: continuing from the in-memory snapshot of step {step} in {out['seconds']:.2f} s"
        )
        self.resumed = out
        return out

    def _snapshot_after(self, result: StepResult) -> None:
        """Called after every step: completes a finished background write's bookkeeping and, every
        ``snapshot_every`` steps, snapshots (the stall lands in ``result.snapshot_stall_s``); every
        ``snapshot_memory_every`` steps copies the state into the in-memory tier (in the background where
        nothing but the optimizer step changes it; what the next step waits for it is stall too)."""
        assert self.snapshots is not None
        self.snapshots.poll()
        if self.memory is not None and self.step % self.cfg.snapshot_memory_every == 0:
            t_mem = time.perf_counter()
            if self.pm.comm_states:  # comm-hook residuals change in the next backward: copied now
                self.memory.save(self.step, self.snapshot_state())
            else:  # in the background, beside the next step's forward and backward (waited on before
                self.memory.save_async(self.step, self.snapshot_state())  # its optimizer step)
            result.snapshot_stall_s = (result.snapshot_stall_s or 0.0) + time.perf_counter() - t_mem
        every = self.cfg.snapshot_every
        if every and not self._snapshot_buffers_started:
            # after the first step (the optimizer state exists then), in the background: a restarted rank
            # trains on while its staging buffers are allocated; the first snapshot waits for them (stall)
            self._snapshot_buffers_started = True
            like = self.logged_parameters() if self.snapshots.delta == "log" else None
            self.snapshots.prepare_async(self.snapshot_state(), like)
        forced, self._snapshot_now = self._snapshot_now, False
        if not forced and (not every or self.step % every):
            return
        previous = self.snapshots.records[-1].step if self.snapshots.records else None
        record: SnapshotRecord = self.snapshots.save(
            self.step,
            self.snapshot_state,
            info={"loss": result.loss, "attempt": self.attempt, **({"requested": True} if forced else {})},
            log_state=self.log_state,
        )
        # a log's gradient copies were counted at the steps that paid for them (train_step)
        result.snapshot_stall_s = (result.snapshot_stall_s or 0.0) + record.stall_s - record.record_s
        if forced:  # a node's supervisor asked for it (a prevention action): say when it was taken
            if self.snapshot_requests is not None:
                self.snapshot_requests.answer(
                    step=self.step, name=record.name, stall_s=record.stall_s, previous_step=previous
                )
            if self.progress is not None:
                self.progress.event("snapshot-now", step=self.step, name=record.name, stall_s=record.stall_s)
            self._print(
                f"snapshot {record.name} now, as the node's supervisor asked (stall {record.stall_s:.3f} s)"
            )

    def _snapshot_summary(self) -> dict:
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
        if self.snapshots is not None and succeeded:
            self.snapshots.close()  # the write in flight uses the snapshot group: before any teardown
        if self.memory is not None and succeeded:
            self.memory.clear()  # the run is over: the disk holds its last snapshot
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


def _mixes_dtensors(params: list[torch.Tensor]) -> bool:
    kinds = {isinstance(p, DTensor) for p in params}
    return len(kinds) > 1


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
