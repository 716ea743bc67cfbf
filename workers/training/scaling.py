"""Shrink and regrow: the job's layout for the number of ranks it has now, chosen with the planner.

When a node is gone for good, torchrun's elastic rendezvous (``--nnodes MIN:MAX``) re-forms the group on the
nodes that are left, and when one comes back it re-forms it again with it; each time the ranks start with a
world size the job's strategy was not made for. :func:`replan` gives the job for that world size:

1. Keep everything but data parallelism (``tp pp cp ep``, ZeRO, recompute, micro-batch): ``dp`` = ranks /
   (tp*pp*cp), the global batch kept (more or fewer micro-batches per rank). This keeps the snapshot's
   per-rank layout wherever possible and is what the planner's cost model ranks first when it fits.
2. When that does not divide or does not fit, the planner's best plan for that many devices
   (:func:`workers.planner.search.search` on the job's cluster cut to the devices present).

Every decision carries the planner's predicted throughput before and after (its cost model on the same
cluster spec: the job's own, or this machine's, ``workers.planner.examples.this_machine_cluster``), so a
scaling decision is logged with what it is expected to cost. The state follows through DCP resharding (a
snapshot of N ranks loads on M). Pure engine: no Django, no Celery; every rank computes the same decision
from the same inputs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from workers.training.config import ConfigError, JobConfig


def _cluster_for(cluster_doc: dict | None, world_size: int):
    from workers.planner.examples import this_machine_cluster
    from workers.planner.specs import ClusterSpec

    doc = dict(cluster_doc or this_machine_cluster()[0])
    spec = ClusterSpec.from_dict(doc)
    per_node = spec.devices_per_node
    if world_size % per_node == 0:
        return spec.with_nodes(world_size // per_node)
    return dataclasses.replace(
        spec.with_nodes(1), devices_per_node=world_size, name=f"{spec.name}[{world_size} devices]"
    )


def predicted(cfg: JobConfig, world_size: int, cluster_doc: dict | None = None) -> dict[str, Any] | None:
    """The planner's figures for ``cfg``'s strategy on ``world_size`` devices (``None`` when it cannot cost
    it, e.g. the model breaks one of its stricter rules)."""
    from workers.planner.search import evaluate
    from workers.planner.specs import SpecError

    try:
        plan = evaluate(cfg.model, _cluster_for(cluster_doc, world_size), cfg.training, cfg.strategy)
    except (SpecError, ValueError):
        return None
    figures = plan.predicted
    keys = ("tokens_per_s", "step_time_s", "scaling_efficiency")
    out = {k: figures[k] for k in keys if k in figures} | {"feasible": plan.feasible}
    memory = figures.get("memory_GiB_per_device")
    if isinstance(memory, dict) and "total" in memory:
        out["memory_GiB_per_device"] = memory["total"]
    return out


def replan(cfg: JobConfig, world_size: int, cluster_doc: dict | None = None) -> tuple[JobConfig, dict]:
    """``cfg`` for ``world_size`` ranks and the decision (``ConfigError`` when no layout fits)."""
    s = cfg.strategy
    before_world = s.world_size
    fixed = s.tp * s.pp * s.cp
    problems: list[str] = []
    new_cfg = None
    how = ""
    if world_size % fixed == 0:
        try:
            new_cfg = _with_strategy(cfg, {**s.to_dict(), "dp": world_size // fixed})
            how = f"dp {s.dp} -> {world_size // fixed}, everything else kept"
        except ConfigError as exc:
            problems.append(f"dp {world_size // fixed}: {exc}")
    else:
        problems.append(f"{world_size} ranks are not a multiple of tp*pp*cp = {fixed}")
    if new_cfg is None:
        new_cfg, how = _planner_choice(cfg, world_size, cluster_doc, problems)
    return new_cfg, {
        "from_world_size": before_world,
        "to_world_size": world_size,
        "action": "shrink" if world_size < before_world else "grow",
        "how": how,
        "strategy_before": s.short_name(),
        "strategy_after": new_cfg.strategy.short_name(),
        "global_batch_size": cfg.training.global_batch_size,
        "predicted_before": predicted(cfg, before_world, cluster_doc),
        "predicted_after": predicted(new_cfg, world_size, cluster_doc),
        "rejected": problems,
    }


def between(cfg: JobConfig, before_strategy: dict) -> dict:
    """The scaling decision a run took by continuing, on ``cfg``'s layout, from a snapshot written with
    ``before_strategy`` (what ran before): shrink or grow, both layouts, the planner's figures for each."""
    try:
        before = _with_strategy(cfg, before_strategy)
    except ConfigError:
        before = None
    before_world = before.strategy.world_size if before else None
    after_world = cfg.strategy.world_size
    return {
        "from_world_size": before_world,
        "to_world_size": after_world,
        "action": "shrink" if before_world and after_world < before_world else "grow",
        "strategy_before": before.strategy.short_name() if before else None,
        "strategy_after": cfg.strategy.short_name(),
        "global_batch_size": cfg.training.global_batch_size,
        "predicted_before": predicted(before, before_world) if before else None,
        "predicted_after": predicted(cfg, after_world),
    }


def _with_strategy(cfg: JobConfig, strategy: dict) -> JobConfig:
    return JobConfig.from_dict({**cfg.to_dict(), "strategy": strategy})


def _planner_choice(cfg: JobConfig, world_size: int, cluster_doc: dict | None, problems: list[str]):
    from workers.planner.search import search

    result = search(cfg.model, _cluster_for(cluster_doc, world_size), cfg.training, top_k=20)
    for plan in result.top:  # fastest first; the first the runtime can run
        strategy = plan.strategy.to_dict()
        try:
            return _with_strategy(cfg, strategy), f"the planner's best layout for {world_size} ranks"
        except ConfigError as exc:
            problems.append(f"planner layout {plan.strategy.short_name()}: {exc}")
    raise ConfigError(
        "strategy",
        f"no layout runs this job on {world_size} rank(s): "
        + "; ".join(problems or ["the planner found none"]),
    )
