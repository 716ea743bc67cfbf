"""Reads of the clusters app: a user's clusters and hardware profiles, and what a cluster's page shows
(its totals and drawing from ``workers.planner.topology``, its device's figures beside their sources, the
plans planned on it and the jobs run from those plans)."""

from __future__ import annotations

from django.db.models import F, Q, QuerySet

from controlplane.accounts.selectors import scoped
from controlplane.clusters.models import Cluster, HardwareProfile

DEVICE_FIGURES = ("peak_tflops", "memory_GiB", "memory_bandwidth_GBps", "tdp_watts")


def clusters_of(user) -> QuerySet[Cluster]:
    return scoped(Cluster.objects.all(), user).select_related("team")


def cluster_of(user, pk: int) -> Cluster | None:
    """The cluster when it belongs to one of the user's teams; None for another team's or none."""
    return clusters_of(user).filter(pk=pk).first()


def device_sources(cluster: Cluster) -> dict:
    """Where the cluster's device figures can be checked: the team's hardware profile of that name when it
    has one, else the shipped profile the planner matches (``workers.planner.hardware.find_profile``).
    ``{"profile", "origin", "confidence", "rows": [{"field", "value", "profile_value", "source"}]}``;
    ``value`` is the cluster document's (the planner uses it), ``profile_value`` the profile's."""
    from workers.planner.hardware import find_profile

    device = cluster.spec.get("device") or {}
    name = str(device.get("name", ""))
    team_profile = HardwareProfile.objects.filter(team_id=cluster.team_id, name__iexact=name).first()
    if team_profile is not None:
        profile, origin, confidence = (
            team_profile.spec,
            f"your team's profile {team_profile.name}",
            team_profile.confidence,
        )
        profile_name = team_profile.name
    else:
        profile_name, profile = find_profile(name) if name else ("generic", {})
        origin = "data/hardware_profiles.json" if profile_name not in ("generic", "cpu") else "none"
        confidence = profile.get("confidence", "") if origin != "none" else ""
    sources = profile.get("sources") or {}
    rows = []
    for figure in DEVICE_FIGURES:
        value = device.get(figure)
        if isinstance(value, dict):
            for dtype, v in value.items():
                rows.append(
                    {
                        "field": f"{figure}.{dtype}",
                        "value": v,
                        "profile_value": (profile.get(figure) or {}).get(dtype) if origin != "none" else None,
                        "source": sources.get(f"{figure}.{dtype}") or sources.get(figure) or "",
                    }
                )
        elif value is not None:
            rows.append(
                {
                    "field": figure,
                    "value": value,
                    "profile_value": profile.get(figure) if origin != "none" else None,
                    "source": sources.get(figure) or "",
                }
            )
    # the team's row of that profile (its page), when it has one: the device's own name or the matched one
    row = team_profile or HardwareProfile.objects.filter(team_id=cluster.team_id, name=profile_name).first()
    return {
        "profile": profile_name,
        "profile_id": row.pk if row is not None else None,
        "origin": origin,
        "confidence": confidence,
        "rows": rows,
    }


def plans_and_jobs(row, document: str) -> dict:
    """The plans of ``row``'s team planned on it (a cluster or a model: ``row.plans``), best first within
    each search (a search's ranked plans, and plans imported or measured; a search's other Pareto points are
    on its page), each marked ``planned_on_earlier`` when the row changed since (a plan keeps the document it
    was planned on, its ``document`` field: ``cluster_doc`` or ``model_doc``); the searches run on it and the
    jobs launched from those plans. Read through the rows' reverse relations (``StoredPlan.cluster`` /
    ``model_spec``, ``TrainingJob.source_plan``): the planning and jobs apps stand above this one."""
    shown = row.plans.filter(team_id=row.team_id).filter(Q(rank__isnull=False) | ~Q(source="search"))
    plans = list(
        shown.prefetch_related("jobs").order_by(F("search_id").desc(nulls_last=True), "rank", "-created_at")[
            :50
        ]
    )
    jobs = sorted(
        {job for plan in plans for job in plan.jobs.all() if job.team_id == row.team_id},
        key=lambda j: j.created_at,
        reverse=True,
    )
    return {
        "plans": [{"plan": p, "planned_on_earlier": getattr(p, document) != row.spec} for p in plans],
        "plan_count": shown.count(),
        "jobs": jobs[:50],
        "searches": row.searches.filter(team_id=row.team_id).order_by("-created_at")[:20],
    }


def cluster_page_data(cluster: Cluster) -> dict:
    """Everything the cluster page shows; a document the planner no longer reads shows its error."""
    from workers.planner import ClusterSpec, SpecError
    from workers.planner.topology import cluster_figures, topology_drawing

    try:
        spec = ClusterSpec.from_dict(cluster.spec)
    except SpecError as exc:
        return {"cluster": cluster, "error": str(exc), **plans_and_jobs(cluster, "cluster_doc")}
    return {
        "cluster": cluster,
        "spec": spec,
        "figures": cluster_figures(spec),
        "drawing": topology_drawing(spec),
        "device": device_sources(cluster),
        **plans_and_jobs(cluster, "cluster_doc"),
    }


# --- hardware profiles (/hardware/) -------------------------------------------------------------------
PROFILE_FIGURES = (
    ("memory_GiB", "memory", "GiB"),
    ("memory_bandwidth_GBps", "memory bandwidth", "GB/s"),
    ("scale_up_GBps_per_direction", "scale-up link", "GB/s per direction"),
    ("devices_per_node", "devices per node", ""),
    ("tdp_watts", "board power", "W"),
)


def profiles_of(user) -> QuerySet[HardwareProfile]:
    return scoped(HardwareProfile.objects.all(), user).select_related("team")


def profile_of(user, pk: int) -> HardwareProfile | None:
    return profiles_of(user).filter(pk=pk).first()


def _source(sources: dict, field: str) -> str:
    """A figure's citation: its own key, else its family's (``peak_tflops.bf16`` -> ``peak_tflops``,
    ``scale_up_GBps_per_direction`` -> ``scale_up``)."""
    for key in (field, field.split(".")[0], field.removesuffix("_GBps_per_direction")):
        if sources.get(key):
            return str(sources[key])
    return ""


def profile_rows(profile: HardwareProfile) -> list[dict]:
    """Every figure of a profile with its unit and source: the peak per dtype, then memory, bandwidths,
    node size and power (``{"field", "label", "value", "unit", "source"}``)."""
    spec, sources = profile.spec, profile.spec.get("sources") or {}
    rows = [
        {
            "field": f"peak_tflops.{dtype}",
            "label": f"peak {dtype}",
            "value": v,
            "unit": "TFLOP/s",
            "source": _source(sources, f"peak_tflops.{dtype}"),
        }  # fmt: skip
        for dtype, v in (spec.get("peak_tflops") or {}).items()
    ]
    for field, label, unit in PROFILE_FIGURES:
        if spec.get(field) is not None:
            rows.append(
                {
                    "field": field,
                    "label": label,
                    "value": spec[field],
                    "unit": unit,
                    "source": _source(sources, field),
                }
            )
    return rows


def profile_page_data(profile: HardwareProfile) -> dict:
    """A profile's page: its figures and sources, how they were measured (``confidence``; "calibrated here"
    when ``cann-train calibrate`` measured this kind of device on this machine), the cost model's calibrated
    constants with theirs, and the team's clusters of this device."""
    from workers.planner.hardware import profile_origin

    origin = profile_origin(profile.name)
    spec = profile.spec
    names = {profile.name.lower(), *(a.lower() for a in spec.get("aliases", []))}
    clusters = [c for c in Cluster.objects.filter(team_id=profile.team_id) if c.device_name.lower() in names]
    return {
        "profile": profile,
        "rows": profile_rows(profile),
        "efficiency": sorted((spec.get("efficiency") or {}).items()),
        "achievable": origin.get("achievable_compute") if origin.get("name") != "generic" else None,
        "calibrated_here": origin.get("confidence") == "measured"
        or "device-" in str(origin.get("origin", "")),
        "origin": origin,
        "aliases": spec.get("aliases", []),
        "clusters": clusters,
    }


def profile_comparison(a: HardwareProfile, b: HardwareProfile) -> list[dict]:
    """Two profiles side by side: every figure either has, with b / a where both have it."""
    ra = {r["field"]: r for r in profile_rows(a)}
    rb = {r["field"]: r for r in profile_rows(b)}
    out = []
    for field in [*ra, *(f for f in rb if f not in ra)]:
        x, y = ra.get(field), rb.get(field)
        row = x or y
        ratio = y["value"] / x["value"] if x and y and x["value"] else None
        out.append({"label": row["label"], "unit": row["unit"], "a": x, "b": y, "ratio": ratio})
    return out
