"""Fill a team's knowledge base with the shipped examples: hardware profiles, clusters (incl. this
machine's, from `cann-train calibrate`), models (among them ``tiny-gpt``, which trains here: a search of it on
``this-machine-cpu`` gives a plan the job API launches), and the published reference runs as measured plans."""

from __future__ import annotations

import json

from django.db import transaction

from controlplane.clusters.models import Cluster, HardwareProfile
from controlplane.planning.models import StoredModelSpec, StoredPlan
from controlplane.planning.planner_adapters import params_billion, plan_row_fields
from workers import planner
from workers.planner.examples import DATA, contract, reference_runs, small_example, this_machine_cluster
from workers.planner.hardware import load_profiles


def local_cpu_cluster() -> tuple[dict, str]:
    """This machine as a cluster (``this-machine-cpu``: one node, two CPU ranks): measured by
    `cann-train calibrate` when it ran, else the default (unmeasured) cpu profile — the origin says which."""
    return this_machine_cluster()


def _upsert(model, team, name: str, **fields):
    obj, _ = model.objects.update_or_create(team=team, name=name, defaults=fields)
    return obj


@transaction.atomic
def seed_knowledge_base(*, team) -> dict[str, int]:
    counts = {"hardware_profiles": 0, "clusters": 0, "models": 0, "measured_plans": 0}
    for name, profile in load_profiles()["profiles"].items():
        confidence = profile.get("confidence", "published")
        if confidence not in HardwareProfile.Confidence.values:  # e.g. "default": an unmeasured placeholder
            confidence = HardwareProfile.Confidence.SOFT
        _upsert(HardwareProfile, team, name, confidence=confidence, spec={"name": name, **profile})
        counts["hardware_profiles"] += 1
    examples = json.loads((DATA / "example_models.json").read_text())
    for entry in examples["clusters"]:
        doc = entry.get("cluster") or contract(entry["contract"])
        _upsert(Cluster, team, doc["name"], spec=doc)
        counts["clusters"] += 1
    cpu_doc, _origin = local_cpu_cluster()
    _upsert(Cluster, team, cpu_doc["name"], spec=cpu_doc)
    counts["clusters"] += 1
    small = small_example()["model"]
    for entry in [*examples["models"], {"model": small}]:
        doc = entry.get("model") or contract(entry["contract"])
        _upsert(StoredModelSpec, team, doc["name"], spec=doc, params_billion=params_billion(doc))
        counts["models"] += 1
    for run in reference_runs():
        counts["measured_plans"] += seed_reference_run(team, run)
    return counts


def seed_reference_run(team, run: dict) -> int:
    """A published run as a measured plan: the planner completes the unpublished fields (vpp, micro-batch)
    and predicts; the measured figures sit beside the prediction."""
    if StoredPlan.objects.filter(
        team=team, source=StoredPlan.Source.MEASURED, measured_source=run["source"], name=run["id"]
    ).exists():
        return 0
    model = planner.ModelSpec.from_dict(run["model"])
    cluster = planner.ClusterSpec.from_dict(run["cluster"])
    training = planner.TrainingConfig.from_dict(run["training"])
    fixed = {k: v for k, v in run["strategy"].items() if v is not None}
    result = planner.search(model, cluster, training, fixed=fixed, top_k=1, scaling=False)
    if result.best is None:
        return 0
    StoredPlan.objects.create(
        team=team,
        name=run["id"],
        source=StoredPlan.Source.MEASURED,
        model_doc=run["model"],
        cluster_doc=run["cluster"],
        training=run["training"],
        measured=run["measured"],
        measured_source=run["source"],
        **plan_row_fields(result.best, model, cluster),
    )
    return 1
