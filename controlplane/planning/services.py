"""Writes of the knowledge base: model specs, searches (create, run, cancel, what-if), plans, and the
measurements real runs bring back."""

from __future__ import annotations

import json
import logging
import os
import time
import traceback
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from controlplane.clusters.models import Cluster
from controlplane.common.api import TooMuchQueuedWork
from controlplane.common.documents import checked
from controlplane.common.models import JobState
from controlplane.live.services import enqueue_after_commit, note_deferred, publish, publish_after_commit
from controlplane.planning import ports
from controlplane.planning.models import StoredModelSpec, StoredPlan, StrategySearch
from controlplane.planning.planner_adapters import checked_ranking, evaluated, plan_row_fields
from controlplane.planning.selectors import measured_expert_load, measured_runs, plan_document, similar_plans
from controlplane.planning.tasks import run_search
from workers import planner
from workers.planner.search import search_allowing_idle_nodes, without_nodes
from workers.planner.warmstart import Corrections, measurement_corrections

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.25  # at most this often a progress event (the planner reports per chunk)
CANCEL_POLL_S = 0.5


def search_create(
    *,
    team,
    created_by=None,
    cluster: Cluster | None = None,
    cluster_doc: dict | None = None,
    model: StoredModelSpec | None = None,
    model_doc: dict | None = None,
    training: dict,
    fixed: dict | None = None,
    top_k: int = 10,
    objective: str = "throughput",
    constraints: dict | None = None,
    parent: StrategySearch | None = None,
    what_if: dict | None = None,
    allow_fewer_nodes: bool = False,
) -> StrategySearch:
    """Validate the request with the planner, look up similar plans, and queue the search. ``objective``
    and ``constraints`` (``workers.planner.search.OBJECTIVES`` / ``CONSTRAINTS``) are stored with the
    request and passed to the planner."""

    active = StrategySearch.objects.filter(team=team, state__in=(JobState.QUEUED, JobState.RUNNING)).count()
    if active >= MAX_ACTIVE_SEARCHES_PER_TEAM:
        raise TooMuchQueuedWork(
            f"Your team has {active} searches queued or running, the most one team may have at once "
            f"({MAX_ACTIVE_SEARCHES_PER_TEAM}). Wait for some to finish, or cancel some."
        )
    cluster_doc = cluster_doc if cluster_doc is not None else (cluster.spec if cluster else None)
    model_doc = model_doc if model_doc is not None else (model.spec if model else None)
    errors = {}
    if cluster_doc is None:
        errors["cluster"] = ["give a cluster id or a cluster.json document"]
    if model_doc is None:
        errors["model"] = ["give a model id or a model.json document"]
    if errors:
        raise ValidationError(errors)
    cluster_spec = checked("cluster", cluster_doc, "cluster")
    model_spec = checked("model", model_doc, "model")
    checked("training", training, "training")
    objective, constraints = checked_ranking(objective, constraints, cluster_spec)
    if fixed:
        try:
            planner.Strategy.from_dict(fixed)
        except planner.SpecError as exc:
            raise ValidationError(exc.prefixed("strategy").errors) from exc
    similar = similar_plans(
        team=team,
        device_name=cluster_spec.device.name,
        device_count=cluster_spec.num_devices,
        params_billion=model_spec.parameter_count()["total"] / 1e9,
    )
    with transaction.atomic():
        search = StrategySearch.objects.create(
            team=team,
            created_by=created_by,
            cluster=cluster,
            model_spec=model,
            request={
                "cluster": cluster_doc,
                "model": model_doc,
                "training": training,
                "strategy": fixed or {},
                "top_k": top_k,
                "objective": objective,
                "constraints": constraints,
                "allow_fewer_nodes": allow_fewer_nodes,
            },
            parent=parent,
            what_if=what_if,
            similar_plans=[{**plan_document(p), "reevaluated": None} for p in similar],
        )
        publish_after_commit(search.stream, "event", {"state": "queued"})
        enqueue_after_commit(run_search, (search.pk,), queue="planning", on_deferred=note_deferred(search))
    return search


@transaction.atomic
def model_delete(model: StoredModelSpec) -> int:
    """Delete ``model``; returns how many plans referred to it. Those plans keep the document they were
    planned on (``StoredPlan.model_doc``) and lose only their link to the row."""
    used = model.plans.count()
    model.delete()
    return used


def search_what_if(*, search: StrategySearch, lose_nodes: int, created_by=None) -> StrategySearch:
    """Re-run a search on the cluster minus ``lose_nodes`` nodes (the planner's ``without_nodes``)."""
    cluster = checked("cluster", search.request["cluster"], "cluster")
    try:
        doc = without_nodes(cluster, lose_nodes).to_dict()
    except planner.SpecError as exc:
        raise ValidationError(exc.errors) from exc
    return search_create(
        team=search.team,
        created_by=created_by,
        cluster=None,
        cluster_doc=doc,
        model=search.model_spec,
        model_doc=search.request["model"],
        training=search.request["training"],
        fixed=search.request.get("strategy"),
        top_k=search.request.get("top_k", 10),
        objective=search.request.get("objective", "throughput"),
        constraints=search.request.get("constraints"),
        parent=search,
        what_if={"lose_nodes": lose_nodes},
        allow_fewer_nodes=True,
    )


def search_cancel(*, search: StrategySearch) -> StrategySearch:
    with transaction.atomic():
        search = StrategySearch.objects.select_for_update().get(pk=search.pk)
        if search.is_finished:
            raise ValidationError({"state": [f"the search already ended ({search.state})"]})
        search.cancel_requested = True
        if search.state == JobState.QUEUED:
            search.state = JobState.CANCELLED
            search.finished_at = timezone.now()
            publish_after_commit(search.stream, "event", {"state": "cancelled"})
        search.save()
    return search


def _plan_row(
    search: StrategySearch,
    plan: planner.Plan,
    *,
    rank: int | None,
    in_pareto: bool,
    model_spec: planner.ModelSpec,
    cluster_spec: planner.ClusterSpec,
) -> StoredPlan:
    return StoredPlan(
        team=search.team,
        source=StoredPlan.Source.SEARCH,
        search=search,
        rank=rank,
        in_pareto=in_pareto,
        cluster=search.cluster,
        model_spec=search.model_spec,
        model_doc=search.request["model"],
        cluster_doc=search.request["cluster"],
        training=search.request["training"],
        **plan_row_fields(plan, model_spec, cluster_spec),
    )


def _reevaluate_similar(search: StrategySearch, model, cluster, training, expert_load=None) -> dict | None:
    """Warm start: cost each similar stored plan's strategy on this scenario (where its degrees fit this
    cluster: all of its devices, or part of them with the rest idle, which the re-evaluated plan says).
    Returns the best of those that take every device as a first best-so-far. Costed without the scaling
    baseline: their ``scaling_efficiency`` is null ("not computed"), never a made-up 1.0."""
    best = None
    updated = []
    for entry in search.similar_plans:
        strategy = dict(entry["strategy"])
        entry = dict(entry)
        try:
            plan = planner.evaluate(
                model,
                cluster,
                training,
                planner.Strategy.from_dict(strategy),
                scaling=False,
                expert_load=expert_load,
            )
            entry["reevaluated"] = plan.to_dict()
            # the first best-so-far of a search over every device: not a plan that leaves some idle
            uses_all = "devices_used" not in plan.predicted
            if (
                plan.feasible
                and uses_all
                and (best is None or plan.step_time_s < best["predicted"]["step_time_s"])
            ):
                best = plan.to_dict()
        except planner.SpecError as exc:
            entry["reevaluated"] = None
            entry["not_applicable"] = str(exc)
        updated.append(entry)
    search.similar_plans = updated
    return best


# searches one team may have queued or running at once (a runaway script cannot fill the planning queue)
MAX_ACTIVE_SEARCHES_PER_TEAM = int(os.environ.get("CANN_TRAIN_MAX_ACTIVE_SEARCHES", "10"))
# a running search touches its row at least every few seconds (progress per chunk); one silent this long
# lost its worker and runs again
SEARCH_HEARTBEAT_TIMEOUT_S = float(os.environ.get("CANN_TRAIN_SEARCH_TIMEOUT_S", "60"))


def requeue_stalled_searches(*, now=None) -> list[int]:
    """Run again the searches whose worker died mid-search (the relay calls this every few seconds): the
    request is kept, the search goes back to queued and a worker picks it up. A late finish of the lost
    run (if it was only slow) is discarded, so plans are stored once."""
    now = now or timezone.now()
    stalled = StrategySearch.objects.filter(
        state=JobState.RUNNING, updated_at__lt=now - timedelta(seconds=SEARCH_HEARTBEAT_TIMEOUT_S)
    )
    requeued = []
    for search in stalled:
        with transaction.atomic():
            row = StrategySearch.objects.select_for_update().get(pk=search.pk)
            if row.state != JobState.RUNNING or row.updated_at >= now - timedelta(
                seconds=SEARCH_HEARTBEAT_TIMEOUT_S
            ):
                continue
            row.state = JobState.QUEUED
            row.progress = 0.0
            row.save(update_fields=["state", "progress", "updated_at"])
            publish_after_commit(
                row.stream, "event", {"state": "queued", "message": "its worker was lost; running it again"}
            )
            enqueue_after_commit(run_search, (row.pk,), queue="planning")
        log.warning(
            "search %s: no sign of life for %.0f s, queued again", search.pk, SEARCH_HEARTBEAT_TIMEOUT_S
        )
        requeued.append(search.pk)
    return requeued


def search_run(*, search_id: int) -> str:
    """Run a queued search (inside a Celery worker) and store its plans; never loses a failure."""
    search = StrategySearch.objects.get(pk=search_id)
    if search.state != JobState.QUEUED:
        return "skipped"
    search.state = JobState.RUNNING
    search.started_at = timezone.now()
    search.save(update_fields=["state", "started_at", "updated_at"])
    publish(search.stream, "event", {"state": "running"})
    try:
        return _search_run(search)
    except Exception as exc:  # noqa: BLE001 - stored for the user, never lost
        log.exception("search %s failed", search_id)
        StrategySearch.objects.filter(pk=search_id).update(
            state=JobState.FAILED,
            finished_at=timezone.now(),
            error=traceback.format_exc()[-4000:],
            human_readable_error=f"The search failed unexpectedly ({type(exc).__name__}: {exc}). The request is kept; retry or report it.",
        )
        publish(search.stream, "event", {"state": "failed", "message": str(exc)})
        return "failed"


def _search_run(search: StrategySearch) -> str:
    req = search.request
    model = planner.ModelSpec.from_dict(req["model"])
    cluster = planner.ClusterSpec.from_dict(req["cluster"])
    training = planner.TrainingConfig.from_dict(req["training"])
    # an MoE model this team trained before: the expert load its runs measured replaces uniform routing
    expert_load = measured_expert_load(teams=search.team, model_doc=req["model"])
    warm = _reevaluate_similar(search, model, cluster, training, expert_load)
    similar = search.similar_plans
    if warm is not None:
        publish(
            search.stream,
            "progress",
            {"evaluated": 0, "feasible": 0, "fraction": 0.0, "best": warm, "best_from": "similar plan"},
        )
    last = {"t": 0.0, "poll": 0.0, "stop": False}
    # searches stored before objectives existed ranked by throughput with no limits
    objective = req.get("objective", "throughput")
    by_step_time = objective == "throughput"  # the similar plan was picked as the fastest
    # what the team's runs of stored plans on this device measured against their prediction
    corrections = measurement_corrections(measured_runs(team=search.team, profile=cluster.device.name))

    def progress(evaluated: int, feasible: int, best: dict | None, fraction: float) -> None:
        now = time.monotonic()
        if fraction < 1.0 and now - last["t"] < PROGRESS_EVERY_S:
            return
        last["t"] = now
        values = {"evaluated": evaluated, "feasible": feasible, "fraction": round(fraction, 4), "best": best}
        if warm is not None and by_step_time and fraction < 1.0 and _slower(best, warm):
            # the scan has not yet beaten the similar plan: the best so far is still that one
            values.update(best=warm, best_from="similar plan")
        # updated_at is the search's heartbeat: a running search that stops touching it lost its worker
        StrategySearch.objects.filter(pk=search.pk).update(progress=fraction, updated_at=timezone.now())
        publish(search.stream, "progress", values)

    def should_stop() -> bool:
        now = time.monotonic()
        if now - last["poll"] >= CANCEL_POLL_S:
            last["poll"] = now
            last["stop"] = StrategySearch.objects.filter(pk=search.pk, cancel_requested=True).exists()
        return last["stop"]

    options = {
        "fixed": req.get("strategy") or None,
        "top_k": req.get("top_k", 10),
        "objective": objective,
        "constraints": req.get("constraints") or None,
        "progress": progress,
        "should_stop": should_stop,
        "expert_load": expert_load,
    }
    if req.get("allow_fewer_nodes"):
        result, cluster = search_allowing_idle_nodes(model, cluster, training, **options)
    else:
        result = planner.search(model, cluster, training, **options)
    with transaction.atomic():
        search = StrategySearch.objects.select_for_update().get(pk=search.pk)
        if search.state != JobState.RUNNING:  # requeued as stalled (another run stores the plans) or ended
            return "superseded"
        top, correction_stats = _corrected_top(result.top, corrections, cluster.device.name, by_step_time)
        search.stats = {**result.stats, **correction_stats}
        if cluster.num_nodes != req["cluster"]["num_nodes"]:
            req = search.request = {**req, "cluster": cluster.to_dict()}
        search.candidates = result.candidates
        search.similar_plans = similar  # with each similar plan re-evaluated on this scenario
        pareto_ids = {id(p) for p in result.pareto}
        ranked = [*enumerate(top, start=1), *((None, p) for p in result.pareto)]
        rows, seen = [], set()
        for rank, plan in ranked:  # the top plans, then the Pareto plans not among them
            key = json.dumps(plan.strategy.to_dict(), sort_keys=True)  # (layers_per_stage is a list)
            if key in seen:
                continue
            seen.add(key)
            row = _plan_row(
                search,
                plan,
                rank=rank,
                in_pareto=id(plan) in pareto_ids,
                model_spec=model,
                cluster_spec=cluster,
            )
            correction = corrections.for_plan(row.strategy, cluster.device.name) if plan.feasible else None
            if correction is not None:  # beside the model's own figures, which stay as they are
                row.predicted = {**row.predicted, "correction": correction.applied(row.predicted)}
            rows.append(row)
        StoredPlan.objects.bulk_create(rows)
        search.finished_at = timezone.now()
        search.progress = 1.0
        if result.stats.get("cancelled"):
            search.state = JobState.CANCELLED
        elif result.best is None:
            search.state = JobState.FAILED
            search.human_readable_error = (
                f"No layout fits: {result.stats.get('tightest', 'every candidate was rejected')}"
            )
        else:
            search.state = JobState.SUCCEEDED
        search.save()
        values = {"state": search.state, "stats": {k: v for k, v in result.stats.items() if k != "rejected"}}
        if search.human_readable_error:
            values["message"] = search.human_readable_error
        publish_after_commit(search.stream, "event", values)
    return search.state


def _slower(best: dict | None, than: dict) -> bool:
    """``best`` (a plan.json dict, or None: nothing yet) is slower than ``than``."""
    if best is None:
        return True
    return best["predicted"]["step_time_s"] > than["predicted"]["step_time_s"]


def _corrected_top(
    top: list[planner.Plan], corrections: Corrections, profile: str, by_step_time: bool
) -> tuple[list[planner.Plan], dict]:
    """The search's top plans ranked by their corrected step time (throughput objective, where measured
    runs on ``profile`` correct some of them), and what the search's stats say about it."""
    if not corrections.by_profile.get(profile):
        return top, {}
    factors = [corrections.for_plan(p.strategy.to_dict(), profile) for p in top]
    stats = {
        "measured_correction": {
            "profile": profile,
            "runs": corrections.by_profile[profile][1],
            "plans_corrected": sum(f is not None for f in factors),
            "ranked_by": "corrected step time"
            if by_step_time
            else "the objective (a correction scales time only)",
        }
    }
    if not by_step_time:
        return top, stats
    # stable: plans of equal corrected time keep the engine's order
    order = sorted(
        range(len(top)), key=lambda i: top[i].step_time_s * (factors[i].factor if factors[i] else 1.0)
    )
    return [top[i] for i in order], stats


def plan_record_measurement(*, plan: StoredPlan, measured: dict, source: str) -> StoredPlan:
    """Put measured figures beside the prediction (from a finished job or a publication)."""
    plan.measured = measured
    plan.measured_source = source
    plan.save(update_fields=["measured", "measured_source", "updated_at"])
    return plan


def plan_save_from_search(*, search: StrategySearch, strategy: dict) -> tuple[StoredPlan, bool]:
    """Keep one strategy of a search's scenario as a plan of the search's team (a point of the Pareto view
    the page costed, which the search did not store): costed again by the planner, linked to the search.
    Returns ``(plan, created)``; a strategy the search already stored comes back as it is."""
    model = checked("model", search.request["model"], "model")
    cluster = checked("cluster", search.request["cluster"], "cluster")
    training = checked("training", search.request["training"], "training")
    expert_load = measured_expert_load(teams=search.team, model_doc=search.request["model"])
    plan = evaluated(model, cluster, training, strategy, expert_load=expert_load)
    wanted = plan.strategy.to_dict()
    for stored in search.plans.all():
        if stored.strategy == wanted:
            return stored, False
    row = _plan_row(search, plan, rank=None, in_pareto=False, model_spec=model, cluster_spec=cluster)
    row.save()
    return row, True


def _this_machine():
    """This machine as a planner cluster, and how many ranks a job may use on it."""
    from workers.planner.examples import this_machine_cluster

    return planner.ClusterSpec.from_dict(this_machine_cluster()[0]), settings.MAX_CPU_RANKS_PER_NODE


def plan_scaled_down(*, plan: StoredPlan):
    """The plan scaled down to this machine (``workers.planner.scale.scale_down``): same layout family,
    at most ``CANN_TRAIN_MAX_CPU_RANKS`` ranks, a small model; costed on ``this-machine-cpu``."""
    from workers.planner.scale import scale_down

    target, max_ranks = _this_machine()
    try:
        model = planner.ModelSpec.from_dict(plan.model_doc)
        training = planner.TrainingConfig.from_dict(plan.training)
        return scale_down(plan.strategy, model, training, max_devices=max_ranks, target=target)
    except planner.SpecError as exc:
        raise ValidationError({"plan": [f"this plan cannot be scaled down: {exc}"]}) from exc


def plan_scale_down_launch(
    *, plan: StoredPlan, user, steps: int, name: str | None = None, options: dict | None = None
):
    """Store the scaled-down plan in the knowledge base (named "scaled-down from plan #N") and launch it as
    a job on this machine's CPU ranks with the run options given (those of a job request); the job's measured
    figures land beside the scaled plan's prediction, never beside the original's. Returns ``(scaled plan row,
    job, ScaledDown)``; a job the job API refuses (ranks, memory, an option's value) is a 400 and stores
    nothing."""
    scaled = plan_scaled_down(plan=plan)
    label = f"scaled-down from plan #{plan.pk}"
    with transaction.atomic():
        row = StoredPlan.objects.create(
            team=plan.team,
            name=label,
            source=StoredPlan.Source.IMPORTED,
            model_doc=scaled.model.to_dict(),
            cluster_doc=scaled.cluster.to_dict(),
            training=scaled.training.to_dict(),
            **plan_row_fields(scaled.plan, scaled.model, scaled.cluster),
        )
        job = ports.launch(plan=row, user=user, steps=steps, name=name or label, options=options)
    return row, job, scaled
