"""Compare gradient-communication methods on the emulated two-tier network (``cann-train comm-opt``).

Every method trains the same model on the same data from the same seed with the real runtime: one
``torchrun`` agent per emulated node, started inside that node's network namespace (c10d rendezvous on
node 0's address, ``--local-addr`` = the node's address, gloo bound to the node's veth through
``GLOO_SOCKET_IFNAME``), running ``python -m workers.training.run``. Ranks of a node talk over the node's
own routes; only traffic between nodes crosses the shaped link. Rank 0 reports its own figures: comm
seconds (total and exposed, from the hook's timing), gradient bytes it sent, step time, tokens/s, loss.

Methods (``workers.training.comm_methods.COMPARE_METHODS``): ``dense`` is plain DDP through torch's all-reduce hook (wrapped only for timing),
so its bytes and comm times are measured the same way as the others'.

Progress and cancel: each rank runs ``python -m workers.training.comm.compare`` (this module's
:func:`rank_main`, the runtime's entry point plus one thing): rank 0 appends each step's ``train`` figures
to a JSON-lines file (:class:`StepFile`), which :func:`run_on_network` reads while it waits, so
``compare_methods(step_progress=...)`` reports which method runs, its step k of n and an ETA from the
measured step times; ``should_stop()`` is polled between reads and stops the running method's process
groups (SIGTERM, then SIGKILL) before the network namespaces are torn down (:class:`ComparisonCancelled`
carries the rows measured so far). :func:`recommend` picks the method for the link from the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from workers.training import examples
from workers.training.comm import netem
from workers.training.comm_methods import COMPARE_DEFAULT_METHODS

EXAMPLES = examples.DIR
DEFAULT_MODEL = EXAMPLES / "comm-20m.json"


TOPK_CLIP_NORM = 0.25
# how often the parent reads rank 0's step file and asks whether to stop
POLL_S = 0.5
# the loss a method may add over dense and still be recommended (relative, on the mean of the last 10 steps)
LOSS_TOLERANCE = 0.02


class ComparisonCancelled(Exception):  # noqa: N818 - an outcome the caller asked for, not an error
    """``should_stop()`` said stop: the running method's processes were stopped. ``partial`` holds the
    comparison with the methods that finished before."""

    def __init__(self, partial: Comparison | None = None, method: str | None = None):
        super().__init__(f"cancelled{f' during {method}' if method else ''}")
        self.partial = partial
        self.method = method


class StepFile:
    """Rank 0's per-step ``train`` figures as JSON lines in a file, in place of the runtime's Redis
    publisher (a comparison run is no job: its parent process reads the file). Same interface as
    ``workers.training.metrics.EventPublisher``; one short line per step, flushed."""

    submit_seconds = 0.0
    published = 0
    errors = 0

    def __init__(self, path: str | Path):
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 -- closed by close()

    def submit(self, kind: str, values: dict, step: int | None = None) -> None:
        if kind != "train" or self._file.closed:
            return
        keep = ("loss", "step_time_s", "comm_s_total", "comm_s_exposed", "comm_bytes")
        self._file.write(json.dumps({"step": step, **{k: values[k] for k in keep if k in values}}) + "\n")
        self.published += 1

    def close(self, timeout: float = 0.0) -> None:
        self._file.close()


def read_steps(path: Path, offset: int) -> tuple[list[dict], int]:
    """The whole lines a step file gained after byte ``offset``, parsed, and the new offset."""
    if not path.exists():
        return [], offset
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    rows = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
    return rows, offset + end


def method_hook(
    method: str, *, ranks_per_node: int, density: float, warmup_steps: int = 0, fsdp: bool = False
) -> str:
    """The ``JobConfig.comm_hook`` spec of a comparison method (``fsdp``: the FSDP2 reduce-scatter form,
    where DGC's per-parameter clipping has no parameters to clip: the shards are flat)."""
    # warmup_steps=0 said outright: a comparison measures the method at its density from the first step (a
    # job's topk_ef otherwise warms up by default over half its steps, which would blur a short run)
    topk = f"density={density}" + (
        f",start_density=0.25,warmup_steps={warmup_steps}" if warmup_steps else ",warmup_steps=0"
    )
    clip = "" if fsdp else f",clip_norm={TOPK_CLIP_NORM}"
    specs = {
        "dense": "allreduce",
        "fp16": "fp16",
        "bf16": "bf16",
        "powersgd": "powerSGD",
        # DGC's local gradient clipping (Lin et al. 2018, sec. 3.3) at 0.25 per parameter (/ sqrt(W)):
        # measured on comm-tiny, 300 steps, AdamW: +6.4 % -> +1.3 % loss vs dense (docs/comm.md)
        "topk_ef": f"topk_ef:{topk}{clip}",
        "sign_ef": "sign_ef",
        "hierarchical": f"hierarchical:ranks_per_node={ranks_per_node}",
        "hierarchical_topk": f"hierarchical:ranks_per_node={ranks_per_node},inter_node=topk,{topk}",
        # per bucket dense / fp16 / top-k 10 or 1 %, flat or through the node hierarchy, from what each step
        # measured (comm/adaptive.py); flat top-k levels clip like topk_ef
        "adaptive": f"adaptive:ranks_per_node={ranks_per_node},clip_norm={TOPK_CLIP_NORM}",
    }
    if method not in specs:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(specs)}")
    return specs[method]


@dataclass
class Comparison:
    """What ``compare_methods`` measured; ``to_dict()`` is the ``--json`` document."""

    network: dict
    model: dict
    setup: dict
    methods: dict[str, dict] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The ``--json`` document, with the :func:`recommend`-ation for the link when a method ran."""
        out = {"network": self.network, "model": self.model, "setup": self.setup, "methods": self.methods}
        if self.methods:
            out["recommendation"] = recommend(self.methods)
        return out


def job_config(
    model: dict,
    *,
    world_size: int,
    hook: str,
    steps: int,
    micro_batch_size: int = 1,
    global_batch_size: int | None = None,
    inter_node_gbit: float,
    bucket_cap_mb: float | None = None,
    lr: float | None = None,
    seed: int = 0,
    strategy: dict | None = None,
):
    """The comparison's job config over ``world_size`` ranks: data parallel only, ZeRO-0 (DDP) by default;
    with ``strategy`` (any subset of the strategy fields) that layout, ``dp`` following from the world size
    (:func:`layout_strategy`). The bucket size is the planner's choice for the emulated link
    (``inter_node_GBps``) unless given. Raises ``ConfigError`` (the runtime's own validation)."""
    from workers.training.config import JobConfig

    layout = layout_strategy(strategy or {}, world_size, micro_batch_size)
    dp, pp = layout["dp"], layout.get("pp", 1)
    config = {
        "model": model,
        "strategy": layout,
        "training": {
            "global_batch_size": global_batch_size or dp * micro_batch_size * pp_micro_batches(pp),
            "dtype": "fp32",
            "optimizer": "adamw",
        },
        "steps": steps,
        "device": "cpu",
        "seed": seed,
        "comm_hook": hook,
        "profile_every": 0,
        "inter_node_GBps": inter_node_gbit / 8,  # Gbit/s -> GB/s per direction
        "bucket_cap_mb": bucket_cap_mb,
    }
    if lr is not None:
        config["lr"] = lr
    return JobConfig.from_dict(config)


def pp_micro_batches(pp: int) -> int:
    """Micro-batches per rank per step: 1, or ``2 * pp`` with a pipeline (it needs at least ``pp``; with 2
    micro-batches per stage, torch 2.13's DDP asserts in its bucket rebuild)."""
    return 2 * pp if pp > 1 else 1


def layout_strategy(strategy: dict, world_size: int, micro_batch_size: int = 1) -> dict:
    """A full strategy from any subset of its fields (``tp pp cp ep zero_stage sequence_parallel vpp
    recompute order ...``) over ``world_size`` ranks: ``dp = world_size / (tp * pp * cp)``. A ``dp`` that
    is given must agree. Raises ``ConfigError`` naming the field."""
    from workers.training.config import ConfigError

    if not isinstance(strategy, dict):
        raise ConfigError(
            "strategy", "must be a JSON object of strategy fields (tp, pp, cp, zero_stage, ...)"
        )
    out = dict(strategy)
    degrees = {}
    for name in ("tp", "pp", "cp"):
        value = out.get(name, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"strategy.{name}", f"must be an integer >= 1, got {value!r}")
        degrees[name] = value
    model_parallel = degrees["tp"] * degrees["pp"] * degrees["cp"]
    if world_size % model_parallel:
        raise ConfigError(
            "strategy",
            f"tp*pp*cp = {model_parallel} does not divide the {world_size} ranks (nodes x ranks-per-node); "
            "dp = ranks / (tp*pp*cp) must be whole",
        )
    dp = world_size // model_parallel
    if "dp" in out and out["dp"] != dp:
        raise ConfigError(
            "strategy.dp",
            f"follows from the ranks: {world_size} / (tp*pp*cp = {model_parallel}) = {dp}, got {out['dp']!r}",
        )
    out["dp"] = dp
    out.setdefault("micro_batch_size", micro_batch_size)
    out.setdefault("zero_stage", 0)
    return out


def method_layout(method: str, strategy: dict) -> tuple[dict, str]:
    """The strategy ``method`` runs under, and a note when it is not ``strategy`` itself: powerSGD and
    adaptive have no FSDP2 reduce-scatter form (``workers.training.comm_methods.FSDP_REFUSED``), so under
    ZeRO-1/2/3 each is refused and its closest alternative runs: the method under ZeRO-0 with the same
    tp/pp/cp."""
    from workers.training.comm_methods import FSDP_HOOK_NAMES, FSDP_REFUSED

    hook = method_hook(method, ranks_per_node=1, density=0.01).partition(":")[0]
    if strategy.get("zero_stage", 0) and hook not in FSDP_HOOK_NAMES:
        why = FSDP_REFUSED.get(hook, "it has no FSDP2 reduce-scatter form")
        return {**strategy, "zero_stage": 0}, (
            f"{method} refused under zero_stage {strategy['zero_stage']} ({why}); ran its closest alternative, "
            f"{method} under zero_stage 0 with the same tp/pp/cp"
        )
    return strategy, ""


def check_layouts(
    model: dict,
    methods,
    *,
    world_size: int,
    ranks_per_node: int,
    density: float,
    steps: int,
    micro_batch_size: int,
    inter_node_gbit: float,
    strategy: dict | None,
) -> dict:
    """The full layout of ``strategy`` over ``world_size`` ranks, after the runtime's own validation of the
    job config of every method under it (before any network is built). Raises ``ConfigError``."""
    layout = layout_strategy(strategy or {}, world_size, micro_batch_size)
    for m in methods:
        run_layout, _ = method_layout(m, layout)
        hook = method_hook(
            m, ranks_per_node=ranks_per_node, density=density, fsdp=bool(run_layout.get("zero_stage"))
        )
        job_config(
            model,
            world_size=world_size,
            hook=hook,
            steps=steps,
            micro_batch_size=micro_batch_size,
            inter_node_gbit=inter_node_gbit,
            strategy=run_layout,
        )
    return layout


def dp_ranks_per_node(strategy: dict, ranks_per_node: int) -> int:
    """Ranks of one data-parallel group on one node, under the default order (tp, cp innermost, then dp):
    the node's ranks divided by the tp*cp block each DP rank takes, at least 1."""
    block = strategy.get("tp", 1) * strategy.get("cp", 1)
    return max(1, ranks_per_node // block) if strategy.get("order") is None else 0


def run_on_network(
    net: netem.TwoTierNetwork,
    cfg,
    ranks_per_node: int,
    *,
    timeout: float = 900,
    log_path: Path | None = None,
    on_step: Callable[[dict], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> dict:
    """Run ``cfg`` with ``ranks_per_node`` ranks in each node of ``net``; returns rank 0's summary. Raises
    ``RuntimeError`` with the log tail if a node fails or the run exceeds ``timeout`` seconds.

    ``on_step(figures)`` gets rank 0's figures of each step as it ends (``step``, ``step_time_s``, ``loss``,
    ...); ``should_stop()`` is asked every ``POLL_S``: when it says so, every node's process group is
    stopped (SIGTERM, then SIGKILL after a grace period) and :class:`ComparisonCancelled` is raised."""
    from workers.training.launch import render_torchrun_command, torchrun_env
    from workers.training.supervision.supervisor import stop_groups

    nnodes = len(net.node_list)
    with tempfile.TemporaryDirectory(prefix="comm-opt-") as tmp:
        config_path, summary_path = Path(tmp) / "job.json", Path(tmp) / "summary.json"
        steps_path = Path(tmp) / "steps.jsonl"
        cfg.save(config_path)
        endpoint = f"{net.node_list[0].address}:{29400 + os.getpid() % 500}"
        run_id = uuid.uuid4().hex[:12]
        procs, logs = [], []
        failed, cancelled, offset = None, False, 0

        def report_steps() -> None:
            nonlocal offset
            rows, offset = read_steps(steps_path, offset)
            for row in rows if on_step is not None else ():
                on_step(row)

        try:
            for node in net.node_list:
                cmd = render_torchrun_command(
                    str(config_path),
                    nnodes=nnodes,
                    nproc_per_node=ranks_per_node,
                    node_rank=node.index,
                    rdzv_endpoint=endpoint,
                    run_id=run_id,
                    summary_path=str(summary_path),
                    warm=True,  # the ranks fork from the agent's import of the runtime (agent.RUNTIMES)
                )
                # The agent's own address (MASTER_ADDR for the workers when it is group rank 0), and who hosts
                # the rendezvous store: torch recognises a host only by hostname, not by a namespace's IP.
                at = cmd.index("-m", 2)
                cmd[at:at] = [
                    f"--local-addr={node.address}",
                    f"--rdzv-conf=is_host={str(node.index == 0).lower()},join_timeout=120",
                ]
                # every rank runs this module's rank_main: the runtime, plus rank 0's step file (global rank 0
                # may land on any node's agent, so every node is told where it goes)
                cmd[cmd.index("workers.training.run")] = "workers.training.comm.compare"
                cmd += ["--steps-file", str(steps_path)]
                env = torchrun_env()
                env["OMP_NUM_THREADS"] = "1"
                log = Path(tmp) / f"node{node.index}.log"
                logs.append(log)
                out = open(log, "w")  # noqa: SIM115 -- closed below, after the process ends
                # its own session: a cancel or a failure stops the agent and its ranks as one process group
                proc = net.popen(
                    node.index, cmd, env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
                procs.append((proc, out))
            deadline = time.monotonic() + timeout
            while True:
                codes = [proc.poll() for proc, _ in procs]
                report_steps()
                if any(c not in (None, 0) for c in codes):
                    failed = f"a node's torchrun exited with {next(c for c in codes if c not in (None, 0))}"
                    break
                if all(c == 0 for c in codes):
                    break
                if should_stop is not None and should_stop():
                    cancelled = True
                    break
                if time.monotonic() > deadline:
                    failed = f"stopped after {timeout:.0f} s"
                    break
                time.sleep(POLL_S)
        finally:
            stop_groups([proc for proc, _ in procs], grace_s=5.0)
            for _, out in procs:
                out.close()
            if log_path is not None:
                log_path.write_text("".join(f"== {p.name}\n{p.read_text(errors='replace')}" for p in logs))
        if cancelled:
            raise ComparisonCancelled()
        if failed or not summary_path.exists():
            tails = "\n".join(_tail(p) for p in logs)
            raise RuntimeError(f"{failed or 'no summary written'}\n{tails}")
        return json.loads(summary_path.read_text())


def _tail(path: Path, lines: int = 15) -> str:
    text = [ln for ln in path.read_text(errors="replace").splitlines() if "Warning" not in ln]
    return f"-- {path.name}:\n" + "\n".join(text[-lines:])


def method_row(summary: dict) -> dict:
    """The per-method figures of the comparison (rank 0's). Step time is the median of the steps after
    the first: robust to other load on a shared machine (the mean is kept beside it)."""
    step_time = statistics.median(summary["step_times_s"][1:] or summary["step_times_s"])
    times = summary["step_times_s"]
    return {
        "hook": summary.get("comm_hook"),
        "bytes_per_rank_per_step": int(summary.get("comm_bytes_last", 0)),
        "dense_fp32_bytes": int(summary.get("dense_fp32_bytes", 0)),
        "comm_s_total": round(summary.get("comm_s_total", 0.0), 4),
        "comm_s_exposed": round(summary.get("comm_s_exposed", 0.0), 4),
        "step_time_s": round(step_time, 4),
        "step_time_mean_s": round(summary["step_time_s"], 4),
        # the second half of the steps: a method that measures before it settles (adaptive) in its steady
        # state, the first steps' exploration left out
        "step_time_steady_s": round(statistics.median(times[len(times) // 2 :] or times), 4),
        "tokens_per_s": round(summary["tokens_per_step"] / step_time, 1),
        "loss_first": round(summary["loss_first"], 4),
        "loss_last": round(summary["loss_last"], 4),
        # one step's loss is one batch's: the comparison uses the mean of the last 10 steps
        "loss_avg_last10": round(sum(summary["losses"][-10:]) / len(summary["losses"][-10:]), 4),
        "steps": summary["steps"],
        "bucket_cap_mb": summary.get("bucket_cap_mb"),
        **({"inter_node_bytes": int(summary["inter_node_bytes"])} if "inter_node_bytes" in summary else {}),
    }


def compare_methods(
    model: dict,
    *,
    nodes: int = 2,
    ranks_per_node: int = 2,
    inter_node_gbit: float = 1.0,
    methods: tuple[str, ...] = COMPARE_DEFAULT_METHODS,
    steps: int = 20,
    density: float = 0.01,
    warmup_steps: int = 0,
    micro_batch_size: int = 1,
    bucket_cap_mb: float | None = None,
    lr: float | None = None,
    timeout: float = 900,
    measure_link: bool = True,
    progress=None,
    step_progress: Callable[[dict], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    net: netem.TwoTierNetwork | None = None,
    strategy: dict | None = None,
) -> Comparison:
    """Train ``model`` under each method on an emulated ``nodes`` x ``ranks_per_node`` network (or the
    given ``net``) and collect rank 0's figures. ``progress(method, row)`` is called after each method;
    ``step_progress(state)`` when a method starts (step 0) and after each of its steps, with
    ``{method, index, methods, step, steps, step_time_s, elapsed_s, eta_s}`` (:class:`Eta`);
    ``should_stop()`` cancels (:class:`ComparisonCancelled`, with the methods done so far).

    ``strategy``: any subset of the strategy fields (tp, pp, cp, ep, zero_stage, ...); ``dp`` follows from
    ``nodes * ranks_per_node`` (:func:`layout_strategy`). Every method runs under it: DDP hooks on the DP
    sub-group (ZeRO-0, tp = 1), the hook on local gradients (ZeRO-0, tp > 1), FSDP2's reduce-scatter
    (ZeRO-1/2/3; powerSGD there is refused and runs under ZeRO-0, :func:`method_layout`)."""
    from workers.training.config import parse_model
    from workers.training.model import num_params

    for m in methods:
        method_hook(m, ranks_per_node=ranks_per_node, density=density)  # fail fast on a bad name
    params = num_params(parse_model(model), active=False)
    world = nodes * ranks_per_node
    layout = check_layouts(
        model,
        methods,
        world_size=world,
        ranks_per_node=ranks_per_node,
        density=density,
        steps=steps,
        micro_batch_size=micro_batch_size,
        inter_node_gbit=inter_node_gbit,
        strategy=strategy,
    )
    own = net is None
    net = net or netem.TwoTierNetwork(nodes=nodes, inter_node_gbit=inter_node_gbit)
    if own:
        net.__enter__()
    eta = Eta(methods=list(methods), steps=steps)
    result = None
    method = None
    try:
        goodput = net.measure_gbit(0, 1, megabytes=16) if measure_link and nodes > 1 else None
        result = Comparison(
            network={
                "nodes": nodes,
                "ranks_per_node": ranks_per_node,
                "inter_node_gbit": net.inter_node_gbit,
                "measured_goodput_gbit": round(goodput, 3) if goodput else None,
                "qdisc": net.qdisc,
                "latency_emulated": net.latency_emulated,
                "note": ""
                if net.latency_emulated
                else "rate limit only (tbf): this kernel has no netem qdisc, so no latency is added",
            },
            model={"name": model.get("name"), "params": params, "seq_length": model.get("seq_length")},
            setup={
                "steps": steps,
                "density": density,
                "micro_batch_size": micro_batch_size,
                "world_size": world,
                "strategy": layout,
            },
        )
        per_node = dp_ranks_per_node(layout, ranks_per_node)
        if per_node == 1 and nodes > 1 and any(m.startswith("hierarchical") for m in methods):
            result.setup["hierarchical_note"] = (
                f"each data-parallel group has one rank per node (tp*cp = {layout.get('tp', 1) * layout.get('cp', 1)} "
                f"of the {ranks_per_node} ranks of a node): hierarchical has no intra-node stage here, it is the "
                "plain inter-node all-reduce / reduce-scatter of the data-parallel group"
            )
        for method in methods:
            if should_stop is not None and should_stop():
                raise ComparisonCancelled()
            run_layout, note = method_layout(method, layout)
            hook = method_hook(
                method,
                ranks_per_node=ranks_per_node,
                density=density,
                warmup_steps=warmup_steps,
                fsdp=bool(run_layout.get("zero_stage")),
            )
            cfg = job_config(
                model,
                world_size=world,
                hook=hook,
                steps=steps,
                micro_batch_size=micro_batch_size,
                inter_node_gbit=net.inter_node_gbit,
                bucket_cap_mb=bucket_cap_mb,
                lr=lr,
                strategy=run_layout,
            )
            eta.start(method)
            if step_progress is not None:
                step_progress(eta.state())

            def on_step(figures: dict) -> None:
                eta.step(figures)
                if step_progress is not None:
                    step_progress(eta.state())

            t0 = time.monotonic()
            summary = run_on_network(
                net, cfg, ranks_per_node, timeout=timeout, on_step=on_step, should_stop=should_stop
            )
            row = method_row(summary)
            row["wall_s"] = round(time.monotonic() - t0, 1)
            row["zero_stage"] = run_layout.get("zero_stage", 0)
            if note:
                row["note"] = note
            eta.finish(row)
            result.methods[method] = row
            if progress is not None:
                progress(method, row)
        result.setup["bucket_cap_mb"] = next(iter(result.methods.values()), {}).get("bucket_cap_mb")
        add_ratios(result.methods)
        return result
    except ComparisonCancelled as exc:
        if result is not None:
            add_ratios(result.methods)
        exc.partial, exc.method = result, method
        raise
    finally:
        if own:
            net.close()


class Eta:
    """How far a comparison is and how long it will still take, from what it measured so far.

    A method's remaining steps take its own median step time once it has one (else the median over every
    step measured so far); a method not started yet takes ``steps`` times that median plus the overhead of
    a method run measured so far (its wall time minus its steps: process start, rendezvous, model build,
    teardown; before any method finished, the time to the first step). No estimate (``eta_s`` None) before
    the first step of the comparison."""

    def __init__(self, methods: list[str], steps: int, clock: Callable[[], float] = time.monotonic):
        self.methods, self.steps, self.clock = methods, steps, clock
        self.started = clock()
        self.method: str | None = None
        self.index = -1
        self.method_started = self.started
        self.step_no = 0
        self.current: list[float] = []
        self.all_steps: list[float] = []
        self.startups: list[float] = []  # time from a method's start to the end of its first step's setup
        self.overheads: list[float] = []  # wall time minus step times, per finished method

    def start(self, method: str) -> None:
        self.method, self.index = method, self.methods.index(method)
        self.method_started, self.step_no, self.current = self.clock(), 0, []

    def step(self, figures: dict) -> None:
        t = float(figures.get("step_time_s") or 0.0)
        if not self.current:
            self.startups.append(max(0.0, self.clock() - self.method_started - t))
        self.step_no = int(figures.get("step") or self.step_no + 1)
        self.current.append(t)
        self.all_steps.append(t)

    def finish(self, row: dict | None = None) -> None:
        self.step_no = self.steps
        self.overheads.append(max(0.0, self.clock() - self.method_started - sum(self.current)))

    def eta_s(self) -> float | None:
        if not self.all_steps:
            return None
        typical = statistics.median(self.all_steps)
        own = statistics.median(self.current) if self.current else typical
        startup = statistics.mean(self.startups)
        overhead = statistics.mean(self.overheads) if self.overheads else startup
        in_method = self.clock() - self.method_started
        if self.current:  # what is left of this method: its steps, then its teardown
            left_here = max(0, self.steps - self.step_no) * own + max(0.0, overhead - startup)
        else:
            left_here = max(0.0, overhead - in_method) + self.steps * own
        later = len(self.methods) - self.index - 1
        return round(left_here + later * (overhead + self.steps * typical), 1)

    def state(self) -> dict:
        done = (self.index + self.step_no / max(1, self.steps)) / max(1, len(self.methods))
        return {
            "method": self.method,
            "index": self.index,
            "methods": self.methods,
            "step": self.step_no,
            "steps": self.steps,
            "step_time_s": round(self.current[-1], 4) if self.current else None,
            "elapsed_s": round(self.clock() - self.started, 1),
            "eta_s": self.eta_s(),
            "fraction": round(done, 4),
        }


def recommend(rows: dict[str, dict], *, loss_tolerance: float = LOSS_TOLERANCE) -> dict:
    """Which method to use on this link, and why, from the measured rows: the fastest step time among the
    methods whose loss (mean of the last 10 steps) is at most ``loss_tolerance`` above dense's. Dense is
    the baseline and always qualifies; without a dense row nothing can be judged.

    Returns ``{"method", "reason", "loss_tolerance", "excluded": {method: why}}`` (``method`` None when
    there is no dense row)."""
    dense = rows.get("dense")
    out: dict = {"method": None, "reason": "", "loss_tolerance": loss_tolerance, "excluded": {}}
    if not dense:
        out["reason"] = "no dense run to compare against: include dense in the methods"
        return out
    base_loss, base_step = dense["loss_avg_last10"], dense["step_time_s"]
    ok = {}
    for name, row in rows.items():
        rel = (row["loss_avg_last10"] - base_loss) / base_loss
        if rel > loss_tolerance:
            out["excluded"][name] = f"loss {rel:+.1%} vs dense (over the {loss_tolerance:.0%} tolerance)"
        else:
            ok[name] = rel
    best = min(ok, key=lambda m: rows[m]["step_time_s"])
    row = rows[best]
    speedup = round(base_step / row["step_time_s"], 3)  # as add_ratios rounds it: the table says the same
    if best == "dense":
        out["reason"] = (
            f"no method within {loss_tolerance:.0%} of dense's loss steps faster than dense "
            f"({base_step:.3f} s/step) on this link: compression does not pay here"
        )
    else:
        reduction = dense["bytes_per_rank_per_step"] / max(1, row["bytes_per_rank_per_step"])
        out["reason"] = (
            f"fastest step within {loss_tolerance:.0%} of dense's loss: {row['step_time_s']:.3f} s vs "
            f"{base_step:.3f} s ({speedup:.2f}× dense), {reduction:.1f}× fewer bytes per step, "
            f"loss {ok[best]:+.1%} vs dense"
        )
    out["method"] = best
    out["speedup_vs_dense"] = speedup
    return out


def add_ratios(rows: dict[str, dict]) -> None:
    """Ratios against ``dense`` (when it ran): byte reduction, speed-up, relative loss difference."""
    dense = rows.get("dense")
    if not dense:
        return
    for row in rows.values():
        row["bytes_reduction_vs_dense"] = round(
            dense["bytes_per_rank_per_step"] / max(1, row["bytes_per_rank_per_step"]), 2
        )
        row["speedup_vs_dense"] = round(dense["step_time_s"] / row["step_time_s"], 3)
        row["loss_rel_diff_vs_dense"] = round(
            (row["loss_avg_last10"] - dense["loss_avg_last10"]) / dense["loss_avg_last10"], 4
        )


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.2f} MB" if nbytes >= 1e5 else f"{nbytes / 1e3:.1f} kB"


def _layout_text(strategy: dict) -> str:
    degrees = " x ".join(
        f"{k}{strategy[k]}" for k in ("tp", "pp", "cp", "ep", "dp") if strategy.get(k, 1) > 1 or k == "dp"
    )
    zero = strategy.get("zero_stage", 0)
    how = "DDP" if not zero else f"ZeRO-{zero} (FSDP2 reduce-scatter)"
    if not zero and strategy.get("tp", 1) > 1:
        how = "ZeRO-0, hook on the local gradients after backward"
    return f"{degrees}, {how}"


def format_table(c: Comparison) -> str:
    net, model, setup = c.network, c.model, c.setup
    goodput = (
        f", measured {net['measured_goodput_gbit']:.2f} Gbit/s goodput"
        if net["measured_goodput_gbit"]
        else ""
    )
    lines = [
        f"comm-opt: {model['name']} ({model['params'] / 1e6:.1f}M params, seq {model['seq_length']}), "
        f"{net['nodes']} nodes x {net['ranks_per_node']} ranks (gloo, cpu), {setup['steps']} steps, "
        f"DDP buckets {setup.get('bucket_cap_mb') or 25} MB",
        f"network: {net['inter_node_gbit']:g} Gbit/s per node uplink ({net['qdisc']}{goodput}); "
        f"latency emulated: {'yes' if net['latency_emulated'] else 'no'}"
        + (f" -- {net['note']}" if net["note"] else ""),
        f"layout: {_layout_text(setup.get('strategy') or {'dp': setup['world_size']})}"
        + (f" -- {setup['hierarchical_note']}" if setup.get("hierarchical_note") else ""),
        "",
        f"{'method':<18} {'bytes/rank/step':>15} {'vs dense':>9} {'comm exposed/total s':>21} "
        f"{'step s':>7} {'speed-up':>8} {'tokens/s':>9} {'loss*':>7} {'vs dense':>9}",
    ]
    for name, r in c.methods.items():
        lines.append(
            f"{name:<18} {_mb(r['bytes_per_rank_per_step']):>15} "
            f"{r.get('bytes_reduction_vs_dense', float('nan')):>8.1f}x "
            f"{r['comm_s_exposed']:>10.3f} / {r['comm_s_total']:<8.3f} "
            f"{r['step_time_s']:>7.3f} {r.get('speedup_vs_dense', float('nan')):>7.2f}x "
            f"{r['tokens_per_s']:>9.0f} {r['loss_avg_last10']:>7.4f} {r.get('loss_rel_diff_vs_dense', float('nan')):>+9.2%}"
        )
    for name, r in c.methods.items():
        if r.get("note"):
            lines.append(f"{name}: {r['note']}")
    for name, r in c.methods.items():
        if "inter_node_bytes" in r:
            lines.append(
                f"{name}: {_mb(r['inter_node_bytes'])} per rank per step cross nodes (mean of the timed steps)"
            )
    lines.append(
        "bytes: gradient payload rank 0 put into collectives in the last step (indices+values+scales; "
        "a hierarchical stage inside a node counts unless it runs in shared memory: DDP buckets on CPU); "
        "comm: sum over buckets of hook->done (total) and the part not hidden under backward (exposed); "
        "loss*: mean of the last 10 steps."
    )
    if c.methods:
        rec = recommend(c.methods)
        lines.append(
            f"recommended for this link: {rec['method']} — {rec['reason']}"
            if rec["method"]
            else f"no recommendation: {rec['reason']}"
        )
    return "\n".join(lines)


def rank_main(argv: list[str] | None = None) -> int:
    """One rank of a comparison run (started by torchrun): the runtime's ``workers.training.run``, with rank
    0's per-step figures appended to ``--steps-file`` for the parent to follow."""
    from workers.devices import backend as device_mod

    device_mod.prepare_environment()  # before torch is imported, as workers.training.run does
    parser = argparse.ArgumentParser(prog="python -m workers.training.comm.compare")
    parser.add_argument("--config", required=True)
    parser.add_argument("--summary")
    parser.add_argument("--steps-file")
    args = parser.parse_args(argv)

    from workers.training.config import JobConfig
    from workers.training.trainer import Trainer, env_rank

    cfg = JobConfig.load(args.config)
    rank, world_size, local_rank = env_rank()
    trainer = Trainer(cfg, rank=rank, world_size=world_size, local_rank=local_rank)
    if rank == 0 and args.steps_file:
        trainer.publisher = StepFile(args.steps_file)
    try:
        summary = trainer.train()
    except BaseException:
        trainer.close(succeeded=False)
        raise
    if rank == 0 and args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f)
    trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(rank_main())
