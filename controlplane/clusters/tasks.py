"""Cluster tasks: calibrating this machine (``controlplane.clusters.calibration``)."""

from __future__ import annotations

from celery import shared_task


@shared_task(acks_late=False)
def calibrate_machine(quick: bool = False, allreduce: bool = True) -> str:
    """Measure this machine for the cost model; its progress and outcome go to the status file."""
    from controlplane.clusters.calibration import calibration_run

    return str(calibration_run(quick=bool(quick), allreduce=bool(allreduce))["state"])
