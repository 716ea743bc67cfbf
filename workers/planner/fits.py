"""Will a run fit in one machine's memory? The planner's memory model (weights, gradients, optimizer states
and activations: Korthikanti et al. 2022 for activations, Rajbhandari et al. 2020 for ZeRO) costed for the
run's own model, training and strategy, against the memory the node really has.

The one memory-fit rule: the job API asks it before it stores a CPU job, a node's supervisor before it starts
any rank (``workers.training.fits`` reads the job's config into these specs), and the knowledge base when it
says whether a plan runs here; so a ``seq_length`` of 10^6 is refused with the figures instead of ranks
growing until the machine swaps.
"""

from __future__ import annotations

from workers.planner import ClusterSpec, ModelSpec, Strategy, TrainingConfig, evaluate
from workers.planner.examples import this_machine_cluster

# what the ranks may use of a CPU node's memory (the OS, the worker and the page cache need the rest)
CPU_MEMORY_SHARE = 0.8


def memory_per_rank_GiB(model: ModelSpec, training: TrainingConfig, strategy: Strategy) -> float:
    """The predicted memory of the heaviest rank (GiB), with the ranks of one ``strategy`` on one node."""
    s = strategy
    doc = dict(this_machine_cluster()[0])
    doc.update(num_nodes=1, devices_per_node=s.tp * s.pp * s.dp * s.cp)
    plan = evaluate(model, ClusterSpec.from_dict(doc), training, s, scaling=False)
    return float(plan.predicted["memory_GiB_per_device"]["total"])


def memory_problem(
    model: ModelSpec,
    training: TrainingConfig,
    strategy: Strategy,
    ranks_per_node: int,
    *,
    device_kind: str,
    device_memory_GiB: float | None,
) -> str:
    """Why the run's ranks would not fit in this node's memory ("" when they fit): on a CPU node all
    ``ranks_per_node`` ranks share the machine's memory; on an accelerator each rank has its device's."""
    per_rank = memory_per_rank_GiB(model, training, strategy)
    name = model.name or "this model"
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
