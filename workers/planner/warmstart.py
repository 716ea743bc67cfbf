"""Warm start from measurements: how far the cost model's step time was from the step time real runs
measured, per hardware profile and layout family, as a factor a new prediction of that family on that
device is corrected by (shown beside the model's own figures, never in their place).

A **layout family** is the shape of a layout, not its degrees: which of tp / pp / dp / ep / cp are > 1,
whether ZeRO shards the parameters (stage 3) or not, and the recompute mode. Layouts of one family hit
the same cost-model terms (the same collectives, bubble, recompute), so a model error measured on one
of them is the best guess for another one of the same family on the same device.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

PARALLEL_DIMS = ("tp", "pp", "dp", "ep", "cp")
# a correction needs at least this many measured runs of its scope (family, or the whole profile)
MIN_RUNS = 1


def layout_family(strategy: Mapping[str, Any]) -> str:
    """The family of a ``strategy.json`` document, e.g. ``"tp+dp, zero<3, recompute none"``: the parallel
    dimensions above 1 (``"single device"`` for none), ZeRO stage 3 or not, and the recompute mode."""
    dims = [d for d in PARALLEL_DIMS if int(strategy.get(d) or 1) > 1]
    zero = "zero3" if int(strategy.get("zero_stage") or 0) >= 3 else "zero<3"
    recompute = strategy.get("recompute") or "none"
    return f"{'+'.join(dims) or 'single device'}, {zero}, recompute {recompute}"


@dataclass(frozen=True)
class MeasuredRun:
    """One run of a planned layout: the plan's strategy, the hardware profile (device name) it ran on, and
    the step time the cost model predicted beside the one the run measured."""

    strategy: Mapping[str, Any]
    profile: str
    predicted_step_time_s: float
    measured_step_time_s: float

    @property
    def usable(self) -> bool:
        values = (self.predicted_step_time_s, self.measured_step_time_s)
        return bool(self.profile) and all(
            isinstance(v, int | float) and math.isfinite(v) and v > 0 for v in values
        )


@dataclass(frozen=True)
class Correction:
    """measured / predicted step time, the geometric mean over ``runs`` runs of ``scope``: ``"layout
    family"`` (runs of ``family`` on ``profile``) or ``"profile"`` (every run on ``profile``: the family had
    none)."""

    factor: float
    runs: int
    family: str
    profile: str
    scope: str

    def applied(self, predicted: Mapping[str, Any]) -> dict[str, Any]:
        """The ``predicted.correction`` document of a plan whose model figures are ``predicted``."""
        step = predicted.get("step_time_s")
        tokens = predicted.get("tokens_per_s")
        corrected_step = step * self.factor if isinstance(step, int | float) else None
        corrected_tokens = tokens / self.factor if isinstance(tokens, int | float) else None
        return {
            "factor": round(self.factor, 4),
            "runs": self.runs,
            "family": self.family,
            "profile": self.profile,
            "scope": self.scope,
            "corrected_step_time_s": corrected_step,
            "corrected_tokens_per_s": corrected_tokens,
            "summary": correction_summary(self, corrected_step),
        }


def correction_summary(correction: Correction, corrected_step_time_s: float | None) -> str:
    """One sentence for pages: ``measured 1.23x slower in 2 runs of this layout family on this device:
    corrected 4.1 s/step``."""
    f = correction.factor
    how = f"{f:.2f}x slower" if f >= 1 else f"{1 / f:.2f}x faster"
    runs = f"{correction.runs} run{'s' if correction.runs != 1 else ''}"
    of = "of this layout family" if correction.scope == "layout family" else "of any layout"
    text = f"measured {how} in {runs} {of} on this device ({correction.profile})"
    if corrected_step_time_s is not None:
        text += f": corrected {corrected_step_time_s:.3g} s/step"
    return text


@dataclass(frozen=True)
class Corrections:
    """Correction factors per (profile, family) and per profile, from :func:`measurement_corrections`."""

    by_family: Mapping[tuple[str, str], tuple[float, int]]
    by_profile: Mapping[str, tuple[float, int]]

    @property
    def runs(self) -> int:
        return sum(n for _f, n in self.by_profile.values())

    def for_plan(self, strategy: Mapping[str, Any], profile: str) -> Correction | None:
        """The correction of a plan of ``strategy`` on ``profile``: its family's factor, else the profile's,
        else None. Never a factor measured on another device."""
        family = layout_family(strategy)
        if (found := self.by_family.get((profile, family))) is not None:
            return Correction(found[0], found[1], family, profile, "layout family")
        if (found := self.by_profile.get(profile)) is not None:
            return Correction(found[0], found[1], family, profile, "profile")
        return None


def _geometric_mean_ratio(runs: list[MeasuredRun]) -> tuple[float, int] | None:
    if len(runs) < MIN_RUNS:
        return None
    logs = [math.log(r.measured_step_time_s / r.predicted_step_time_s) for r in runs]
    return math.exp(sum(logs) / len(logs)), len(runs)


def measurement_corrections(runs: Iterable[MeasuredRun]) -> Corrections:
    """Geometric mean of measured / predicted step time per (profile, layout family) and per profile, with
    the number of runs behind each. Runs without a positive, finite prediction and measurement (or without
    a profile) are left out."""
    usable = [r for r in runs if r.usable]
    families: dict[tuple[str, str], list[MeasuredRun]] = {}
    profiles: dict[str, list[MeasuredRun]] = {}
    for r in usable:
        families.setdefault((r.profile, layout_family(r.strategy)), []).append(r)
        profiles.setdefault(r.profile, []).append(r)
    by_family = {k: m for k, v in families.items() if (m := _geometric_mean_ratio(v)) is not None}
    by_profile = {k: m for k, v in profiles.items() if (m := _geometric_mean_ratio(v)) is not None}
    return Corrections(by_family=by_family, by_profile=by_profile)
