"""Will a job fit on this node? The planner's one memory-fit rule (:mod:`workers.planner.fits`) for a job's
config: its model, training and strategy as the runtime reads them. A node's supervisor asks before it starts
any rank; the job API asks before it stores a CPU job."""

from __future__ import annotations

from workers.planner import fits
from workers.training.config import JobConfig


def specs_of(config: dict):
    """The job config's model, training and strategy, as the planner's specs."""
    job = JobConfig.from_dict(config)
    return job.model, job.training, job.strategy


def memory_per_rank_GiB(config: dict) -> float:
    """The planner's predicted memory of the heaviest rank for this job config (GiB)."""
    return fits.memory_per_rank_GiB(*specs_of(config))


def memory_problem(
    config: dict, ranks_per_node: int, *, device_kind: str, device_memory_GiB: float | None
) -> str:
    """Why the job's ranks would not fit in this node's memory ("" when they fit, or when the model
    cannot be costed: the run itself then names what is wrong)."""
    try:
        specs = specs_of(config)
        return fits.memory_problem(
            *specs, ranks_per_node, device_kind=device_kind, device_memory_GiB=device_memory_GiB
        )
    except Exception:  # noqa: BLE001 - a config the planner cannot cost is the runtime's to refuse
        return ""
