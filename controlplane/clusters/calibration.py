"""Calibrating this machine from the app: the cost model's cpu profile measured by the training runtime's
``calibrate`` (``workers.training.calibrate``) in a Celery task, with its progress, so that plans for
``this-machine-cpu`` predict what a job here measures (the shipped cpu profile is a placeholder, many times
off). ``make run`` starts one on a machine that has none (``demo_setup``); the planner page offers it; every
page says when predictions here are uncalibrated.

State lives beside the profile it produces, in ``calibration_dir()/status.json`` (the web process, the worker
and the CLI share that directory on one machine): ``{"state": "queued" | "running" | "done" | "failed",
"stage", "what", "fraction", "requested_at", "started_at", "finished_at", "error", "quick", "by"}``.
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

_busy = None  # the app above's count of the jobs training now (controlplane.jobs plugs it: clusters is below)


def plug(*, busy) -> None:
    """``busy() -> int``: the jobs training on this machine now (their load would slow the measuring)."""
    global _busy
    _busy = busy


STALE_AFTER_S = 30 * 60
"""A calibration that has said nothing for this long died with its worker: another may start."""


def _dir() -> Path:
    from workers.planner.hardware import calibration_dir

    return calibration_dir()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _write(status: dict) -> None:
    """The status file, replaced whole (a reader never sees half of it)."""
    path = _dir() / "status.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(status))
    os.replace(tmp, path)


def _read() -> dict:
    try:
        doc = json.loads((_dir() / "status.json").read_text())
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def calibration_status() -> dict:
    """Whether this machine's cpu profile is measured (``calibrated``, ``measured_at``), and the newest
    calibration's state and progress (``state`` None when none ran from the app); ``running`` True while one
    is queued or running and has said something within :data:`STALE_AFTER_S`."""
    from workers.planner.hardware import cpu_profile

    profile, origin = cpu_profile()
    measured = profile.get("confidence") == "measured"
    status = _read()
    state = status.get("state")
    running = state in ("queued", "running")
    if running:
        try:
            age = time.time() - (_dir() / "status.json").stat().st_mtime
        except OSError:
            age = 0.0
        if age > STALE_AFTER_S:
            running, state = False, "failed"
            status["error"] = f"it said nothing for {age / 60:.0f} minutes: its worker died"
    return {
        "calibrated": measured,
        "measured_at": (profile.get("measured") or {}).get("at") if measured else None,
        "origin": origin,
        "state": state,
        "running": running,
        "stage": status.get("stage"),
        "what": status.get("what"),
        "fraction": status.get("fraction"),
        "requested_at": status.get("requested_at"),
        "started_at": status.get("started_at"),
        "finished_at": status.get("finished_at"),
        "error": status.get("error"),
        "quick": status.get("quick"),
        "note": status.get("note"),
    }


class CalibrationRunning(Exception):
    """A calibration is queued or running already."""


def calibration_start(*, by: str, quick: bool = False, allreduce: bool = True, enqueue=None) -> dict:
    """Queue a calibration of this machine (``CalibrationRunning`` while one is under way); the status.
    ``enqueue(quick, allreduce)`` sends the task (default: the Celery task through the outbox)."""
    if calibration_status()["running"]:
        raise CalibrationRunning("this machine is being calibrated already: wait for it to finish")
    _write({"state": "queued", "requested_at": _now(), "quick": quick, "allreduce": allreduce, "by": by,
            "fraction": 0.0})  # fmt: skip
    if enqueue is None:
        from controlplane.clusters.tasks import calibrate_machine
        from controlplane.live.services import enqueue_after_commit

        enqueue_after_commit(calibrate_machine, (quick, allreduce), queue="planning")
    else:
        enqueue(quick, allreduce)
    return calibration_status()


def calibration_run(*, quick: bool, allreduce: bool) -> dict:
    """Measure (the task's body): progress into the status file, then every team's ``this-machine-cpu``
    cluster updated to the measured figures. The final status."""
    from workers.training.calibrate import calibrate

    status = {**_read(), "state": "running", "started_at": _now(), "error": None, "quick": quick}

    def progress(stage: str, what: str, fraction: float) -> None:
        status.update(stage=stage, what=what, fraction=fraction)
        _write(status)

    waited = _wait_for_idle(status, progress)
    if waited:
        status["waited_s"] = waited
    progress("starting", "importing torch", 0.0)
    try:
        calibrate(quick=quick, allreduce=allreduce, progress=progress)
    except Exception as exc:  # noqa: BLE001 - any failure is the calibration's outcome, shown on the pages
        status.update(state="failed", finished_at=_now(), error=f"{type(exc).__name__}: {exc}")
        _write(status)
        return calibration_status()
    refresh_machine_clusters()
    status.update(state="done", finished_at=_now(), fraction=1.0)
    _write(status)
    return calibration_status()


IDLE_WAIT_S = 30 * 60
"""How long a calibration waits for running jobs to end before it measures anyway (saying so)."""


def _wait_for_idle(status: dict, progress, *, wait_s: float = IDLE_WAIT_S, every_s: float = 2.0) -> float:
    """Wait while jobs train here (they would slow every measurement: `make run` queues its demo job and
    this calibration together); the seconds waited. After ``wait_s`` it measures anyway, noting how many ran."""
    started = time.monotonic()
    while True:
        running = _busy() if _busy is not None else 0
        if not running:
            return round(time.monotonic() - started, 1)
        if time.monotonic() - started > wait_s:
            status["note"] = f"measured while {running} job(s) trained here: figures may be pessimistic"
            return round(time.monotonic() - started, 1)
        progress("waiting", f"for {running} running job(s) to finish (they would slow the measurement)", 0.0)
        time.sleep(every_s)


def refresh_machine_clusters() -> int:
    """Every team's ``this-machine-cpu`` cluster given this machine's measured figures (the seed stored the
    figures it had then; plans made since read them). The number updated."""
    from controlplane.clusters.models import Cluster
    from workers.planner.examples import this_machine_cluster

    doc, _origin = this_machine_cluster()
    return Cluster.objects.filter(name=doc["name"]).update(spec=doc)
