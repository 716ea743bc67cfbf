"""What the knowledge base needs from the app above it, plugged in by that app: planning sits below jobs on
the apps' ladder (``.importlinter``) and imports none of it; the jobs app fills these in from its
``AppConfig.ready`` (:mod:`controlplane.jobs.apps`).

- ``measured_runs(team=, profile=)``: what the team's succeeded runs of stored plans measured beside the plan's
  prediction (``workers.planner.warmstart.MeasuredRun``), for a search's correction factors;
- ``measured_expert_load(teams=, model_doc=)``: the per-expert load runs of this MoE model measured;
- ``launch(plan=, user=, steps=, name=, options=)``: launch a stored plan as a job on this machine's CPU ranks,
  with the run options of a job request (``POST /api/jobs/``) a person set;
- ``launch_form(user=, plan=)``: the options a launch of the plan may set, as the plan page's form shows them
  (``controlplane.jobs.launch_form``).

Unplugged (planning alone, as in a test of it), there is nothing measured and nothing can be launched (the plan
page offers no launch options).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_plugged: dict[str, Callable[..., Any]] = {}


def plug(**adapters: Callable[..., Any]) -> None:
    """The app above says how to do each of ``measured_runs``, ``measured_expert_load``, ``launch``,
    ``launch_form``."""
    unknown = set(adapters) - {"measured_runs", "measured_expert_load", "launch", "launch_form"}
    if unknown:
        raise TypeError(f"planning has no port named {', '.join(sorted(unknown))}")
    _plugged.update(adapters)


def measured_runs(*, team, profile: str) -> list:
    fn = _plugged.get("measured_runs")
    return fn(team=team, profile=profile) if fn else []


def measured_expert_load(*, teams, model_doc: dict | None):
    fn = _plugged.get("measured_expert_load")
    return fn(teams=teams, model_doc=model_doc) if fn else None


def launch(*, plan, user, steps: int, name: str, options: dict | None = None):
    fn = _plugged.get("launch")
    if fn is None:
        raise RuntimeError("no app that runs jobs is installed: a plan cannot be launched")
    return fn(plan=plan, user=user, steps=steps, name=name, options=options or {})


def launch_form(*, user, plan) -> dict | None:
    fn = _plugged.get("launch_form")
    return fn(user=user, plan=plan) if fn else None
