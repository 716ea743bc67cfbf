"""Compare gradient-communication methods on the emulated two-tier network (``cann-train comm-opt``).

Every method trains the same model on the same data from the same seed with the real runtime: one
``torchrun`` agent per emulated node, started inside that node's network namespace (c10d rendezvous on
node 0's address, ``--local-addr`` = the node's address, gloo bound to the node's veth through
``GLOO_SOCKET_IFNAME``), running ``python -m workers.training.run``. Ranks of a node talk over the node's
own routes; only traffic between nodes crosses the shaped link. Rank 0 reports its own figures: comm
seconds (total and exposed, from the hook's timing), gradient bytes it sent, step time, tokens/s, loss.

Methods (``workers.training.comm_methods.COMPARE_METHODS``): ``dense`` is plain DDP through torch's all-reduce hook (wrapped only for timing),
so its bytes and comm times are measured the same way as the others'.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from workers.training import examples
from workers.training.comm import netem
from workers.training.comm_methods import COMPARE_DEFAULT_METHODS

EXAMPLES = examples.DIR
DEFAULT_MODEL = EXAMPLES / "comm-20m.json"


TOPK_CLIP_NORM = 0.25


def method_hook(method: str, *, ranks_per_node: int, density: float, warmup_steps: int = 0) -> str:
    """The ``JobConfig.comm_hook`` spec of a comparison method."""
    topk = f"density={density}" + (f",start_density=0.25,warmup_steps={warmup_steps}" if warmup_steps else "")
    specs = {
        "dense": "allreduce",
        "fp16": "fp16",
        "bf16": "bf16",
        "powersgd": "powerSGD",
        # DGC's local gradient clipping (Lin et al. 2018, sec. 3.3) at 0.25 per parameter (/ sqrt(W)):
        # measured on comm-tiny, 300 steps, AdamW: +6.4 % -> +1.3 % loss vs dense (docs/comm.md)
        "topk_ef": f"topk_ef:{topk},clip_norm={TOPK_CLIP_NORM}",
        "sign_ef": "sign_ef",
        "hierarchical": f"hierarchical:ranks_per_node={ranks_per_node}",
        "hierarchical_topk": f"hierarchical:ranks_per_node={ranks_per_node},inter_node=topk,{topk}",
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
        return {"network": self.network, "model": self.model, "setup": self.setup, "methods": self.methods}


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
):
    """Data-parallel-only ZeRO-0 config over ``world_size`` ranks (DDP, so comm hooks apply). The bucket
    size is the planner's choice for the emulated link (``inter_node_GBps``) unless given."""
    from workers.training.config import JobConfig

    config = {
        "model": model,
        "strategy": {"dp": world_size, "micro_batch_size": micro_batch_size, "zero_stage": 0},
        "training": {
            "global_batch_size": global_batch_size or world_size * micro_batch_size,
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


def run_on_network(
    net: netem.TwoTierNetwork, cfg, ranks_per_node: int, *, timeout: float = 900, log_path: Path | None = None
) -> dict:
    """Run ``cfg`` with ``ranks_per_node`` ranks in each node of ``net``; returns rank 0's summary. Raises
    ``RuntimeError`` with the log tail if a node fails or the run exceeds ``timeout`` seconds."""
    from workers.training.launch import render_torchrun_command, torchrun_env

    nnodes = len(net.node_list)
    with tempfile.TemporaryDirectory(prefix="comm-opt-") as tmp:
        config_path, summary_path = Path(tmp) / "job.json", Path(tmp) / "summary.json"
        cfg.save(config_path)
        endpoint = f"{net.node_list[0].address}:{29400 + os.getpid() % 500}"
        run_id = uuid.uuid4().hex[:12]
        procs, logs = [], []
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
                )
                # The agent's own address (MASTER_ADDR for the workers when it is group rank 0), and who hosts
                # the rendezvous store: torch recognises a host only by hostname, not by a namespace's IP.
                at = cmd.index("-m", 2)
                cmd[at:at] = [
                    f"--local-addr={node.address}",
                    f"--rdzv-conf=is_host={str(node.index == 0).lower()},join_timeout=120",
                ]
                env = torchrun_env()
                env["OMP_NUM_THREADS"] = "1"
                log = Path(tmp) / f"node{node.index}.log"
                logs.append(log)
                out = open(log, "w")  # noqa: SIM115 -- closed below, after the process ends
                procs.append((net.popen(node.index, cmd, env, stdout=out, stderr=subprocess.STDOUT), out))
            deadline = time.monotonic() + timeout
            failed = None
            for proc, _ in procs:
                try:
                    rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    failed = f"stopped after {timeout:.0f} s"
                    break
                if rc != 0:
                    failed = f"a node's torchrun exited with {rc}"
                    break
        finally:
            for proc, out in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=30)
                out.close()
            if log_path is not None:
                log_path.write_text("".join(f"== {p.name}\n{p.read_text(errors='replace')}" for p in logs))
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
    return {
        "hook": summary.get("comm_hook"),
        "bytes_per_rank_per_step": int(summary.get("comm_bytes_last", 0)),
        "dense_fp32_bytes": int(summary.get("dense_fp32_bytes", 0)),
        "comm_s_total": round(summary.get("comm_s_total", 0.0), 4),
        "comm_s_exposed": round(summary.get("comm_s_exposed", 0.0), 4),
        "step_time_s": round(step_time, 4),
        "step_time_mean_s": round(summary["step_time_s"], 4),
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
    net: netem.TwoTierNetwork | None = None,
) -> Comparison:
    """Train ``model`` under each method on an emulated ``nodes`` x ``ranks_per_node`` network (or the
    given ``net``) and collect rank 0's figures. ``progress(method, row)`` is called after each."""
    from workers.training.config import parse_model
    from workers.training.model import num_params

    for m in methods:
        method_hook(m, ranks_per_node=ranks_per_node, density=density)  # fail fast on a bad name
    params = num_params(parse_model(model), active=False)
    world = nodes * ranks_per_node
    own = net is None
    net = net or netem.TwoTierNetwork(nodes=nodes, inter_node_gbit=inter_node_gbit)
    if own:
        net.__enter__()
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
            },
        )
        for method in methods:
            hook = method_hook(
                method, ranks_per_node=ranks_per_node, density=density, warmup_steps=warmup_steps
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
            )
            t0 = time.monotonic()
            row = method_row(run_on_network(net, cfg, ranks_per_node, timeout=timeout))
            row["wall_s"] = round(time.monotonic() - t0, 1)
            result.methods[method] = row
            if progress is not None:
                progress(method, row)
        result.setup["bucket_cap_mb"] = next(iter(result.methods.values()), {}).get("bucket_cap_mb")
        add_ratios(result.methods)
        return result
    finally:
        if own:
            net.close()


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
    lines.append(
        "bytes: gradient payload rank 0 put into collectives in the last step (indices+values+scales); "
        "comm: sum over buckets of hook->done (total) and the part not hidden under backward (exposed); "
        "loss*: mean of the last 10 steps (hierarchical: bytes crossing nodes; intra-node via shared memory)."
    )
    return "\n".join(lines)
