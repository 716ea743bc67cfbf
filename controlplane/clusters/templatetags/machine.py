"""This machine's calibration on every page: ``{% calibration_banner %}`` says when plans here are predicted
from the shipped (uncalibrated) cpu profile, with a button to calibrate and its progress
(``frontend/static/js/calibration.js`` follows ``/api/calibration/``); ``{% calibration_card %}`` is the
planner page's fuller version, shown calibrated or not."""

from __future__ import annotations

from django import template

register = template.Library()


def _status() -> dict:
    from controlplane.clusters.calibration import calibration_status

    return calibration_status()


@register.inclusion_tag("clusters/_calibration.html", takes_context=True)
def calibration_banner(context) -> dict:
    user = context.get("user")
    signed_in = bool(user is not None and user.is_authenticated)
    status = _status() if signed_in else {}
    # once calibrated, the banner goes (the planner page's card and the hardware page still say so)
    return {"status": status, "show": signed_in and (not status.get("calibrated") or status.get("running")),
            "card": False}  # fmt: skip


@register.inclusion_tag("clusters/_calibration.html")
def calibration_card() -> dict:
    return {"status": _status(), "show": True, "card": True}
