"""Will a job fit on this node? The planner's memory model (weights, gradients, optimizer states and
activations: Korthikanti et al. 2022 for activations, Rajbhandari et al. 2020 for ZeRO) costed for the job's
own model, strategy and training, against the memory this node really has. A node's supervisor asks before
it starts any rank, so a ``seq_length`` of 10^6 is refused with the figures instead of ranks growing until
the machine swaps."""

from __future__ import annotations

# what the ranks may use of a CPU node's memory (the OS, the worker and the page cache need the rest)
CPU_MEMORY_SHARE = 0.8


def memory_per_rank_GiB(config: dict) -> float:
    """The planner's predicted memory of the heaviest rank for this job config (GiB)."""
    from workers.planner import ClusterSpec, evaluate
    from workers.planner.examples import this_machine_cluster
    from workers.training.config import JobConfig

    job = JobConfig.from_dict(config)
    s = job.strategy
    doc = dict(this_machine_cluster()[0])
    doc.update(num_nodes=1, devices_per_node=s.tp * s.pp * s.dp * s.cp)
    plan = evaluate(job.model, ClusterSpec.from_dict(doc), job.training, s, scaling=False)
    return float(plan.predicted["memory_GiB_per_device"]["total"])


def memory_problem(
    config: dict, ranks_per_node: int, *, device_kind: str, device_memory_GiB: float | None
) -> str:
    """Why the job's ranks would not fit in this node's memory ("" when they fit, or when the model
    cannot be costed: the run itself then names what is wrong)."""
    try:
        per_rank = memory_per_rank_GiB(config)
    except Exception:  # noqa: BLE001 - a config the planner cannot cost is the runtime's to refuse
        return ""
    name = (config.get("model") or {}).get("name", "this model")
    if device_kind == "cpu":
        import psutil

        have = psutil.virtual_memory().total / 2**30
        need = per_rank * ranks_per_node
        if need > CPU_MEMORY_SHARE * have:
            return (
                f"{name} needs about {per_rank:,.1f} GiB per rank by the planner's memory model (weights, "
                f"gradients, optimizer, activations): {need:,.1f} GiB for {ranks_per_node} rank(s), more than "
                f"{CPU_MEMORY_SHARE:.0%} of this node's {have:,.1f} GiB. Use a shorter sequence, a smaller "
                "micro-batch, recomputation or ZeRO, or a bigger machine."
            )
    elif device_memory_GiB and per_rank > device_memory_GiB:
        return (
            f"{name} needs about {per_rank:,.1f} GiB per device by the planner's memory model; this node's "
            f"{device_kind} devices have {device_memory_GiB:,.1f} GiB. Raise tp/pp, use recomputation or ZeRO."
        )
    return ""
