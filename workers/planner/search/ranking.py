"""Ranking and pruning: the objectives a search may rank by and the limits a user may set (checked by
:func:`checked_ranking`), the sort key of each objective (:class:`Ranking`) and the Pareto front of the
feasible layouts (:func:`pareto_indices`)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..costmodel import GiB
from ..energy import device_power_profile
from ..specs import ClusterSpec, SpecError

# what a search may rank by (``objective``) and the limits a user may set (``constraints``)
OBJECTIVES = {
    "throughput": "most tokens/s first",
    "memory_headroom": "most free memory per device first",
    "communication_volume": "fewest bytes communicated per device per step first",
    "energy": "most tokens per kWh of predicted board energy first",
}
CONSTRAINTS = {
    "max_memory_GiB_per_device": "predicted peak memory per device, GiB (> 0)",
    "max_bubble_fraction": "predicted pipeline bubble share of a step (0..1)",
}
MAX_MEMORY_LIMIT_GiB = 1e6  # a typo or a hostile 1e300 is an error, not a limit (1,000x the largest device)


def constraint_reason(name: str, limit: float) -> str:
    """The ``stats["rejected"]`` reason of a user constraint."""
    if name == "max_memory_GiB_per_device":
        return f"predicted peak memory above max_memory_GiB_per_device ({limit:g} GiB)"
    return f"predicted pipeline bubble above max_bubble_fraction ({limit:g})"


def checked_ranking(
    objective: str | None = "throughput", constraints: dict | None = None, cluster: ClusterSpec | None = None
) -> tuple[str, dict[str, float]]:
    """``(objective, constraints)`` of a search, checked: a :class:`SpecError` (a ValueError) naming the
    field (``objective``, ``constraints.<name>``), what is wrong and what is allowed. ``None`` values are
    dropped (no limit). With ``cluster``, ``energy`` also needs the device's power (its ``tdp_watts``)."""
    objective = "throughput" if objective is None else objective
    if objective not in OBJECTIVES:
        allowed = "; ".join(f"{k} ({v})" for k, v in OBJECTIVES.items())
        raise SpecError("objective", f"must be one of: {allowed}; got {objective!r}")
    if constraints is None:
        constraints = {}
    if not isinstance(constraints, dict):
        raise SpecError(
            "constraints", f"must be an object with any of {', '.join(CONSTRAINTS)}, got {constraints!r}"
        )
    errors: dict[str, list[str]] = {}
    out: dict[str, float] = {}
    for name, value in constraints.items():
        field = f"constraints.{name}"
        if name not in CONSTRAINTS:
            errors[field] = [f"is not a constraint; allowed: {', '.join(CONSTRAINTS)}"]
            continue
        if value is None:
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if name == "max_memory_GiB_per_device" and not (number and 0 < value <= MAX_MEMORY_LIMIT_GiB):
            errors[field] = [f"must be a number of GiB > 0 (and <= {MAX_MEMORY_LIMIT_GiB:g}), got {value!r}"]
        elif name == "max_bubble_fraction" and not (number and 0 <= value <= 1):
            errors[field] = [f"must be a fraction of the step between 0 and 1, got {value!r}"]
        else:
            out[name] = float(value)
    if errors:
        raise SpecError(errors)
    if objective == "energy" and cluster is not None and device_power_profile(cluster) is None:
        raise SpecError(
            "objective",
            f"energy needs the device's power: {cluster.device.name!r} has no tdp_watts here; set the "
            "cluster's device.tdp_watts (board power in W, from its datasheet) or rank by another objective",
        )
    return objective, out


@dataclasses.dataclass(frozen=True)
class Ranking:
    """How a search orders and filters its feasible layouts: the objective and the user's limits."""

    objective: str = "throughput"
    max_memory_bytes: float | None = None
    max_bubble_fraction: float | None = None
    power: tuple[float, float] | None = None
    """(idle, board) watts per device, for ``energy``."""

    @classmethod
    def of(cls, objective: str, constraints: dict[str, float], cluster: ClusterSpec) -> Ranking:
        power = None
        if objective == "energy":
            profile = device_power_profile(cluster)
            power = (float(profile.get("idle_watts") or 0.0), float(profile["tdp_watts"]))
        memory = constraints.get("max_memory_GiB_per_device")
        return cls(
            objective,
            None if memory is None else memory * GiB,
            constraints.get("max_bubble_fraction"),
            power,
        )

    @property
    def needs(self) -> tuple[str, ...]:
        """The timing arrays (beyond step, volume and exposed) this ranking reads."""
        return (("bubble",) if self.max_bubble_fraction is not None else ()) + (
            ("compute", "optimizer") if self.objective == "energy" else ()
        )

    def key(self, vals: dict[str, np.ndarray], headroom: np.ndarray) -> np.ndarray:
        """One complex sort key per layout, smallest best: the objective, then (its ties) throughput; for
        ``throughput`` itself the ties go to the larger memory headroom."""
        step = np.round(vals["step"], 9)  # equally fast to 1 ns
        if self.objective == "throughput":
            return step - 1j * headroom
        if self.objective == "memory_headroom":
            return -np.round(headroom) + 1j * step  # to the byte
        if self.objective == "communication_volume":
            return np.round(vals["volume"]) + 1j * step
        # energy: tokens per kWh = tokens per step / (devices x joules per device per step), and the tokens
        # per step and the devices are the same for every layout, so the least joules per device per step
        # wins: W x step = idle x step + (tdp - idle) x busy (energy.py, W = idle + (tdp - idle) x u)
        idle, tdp = self.power
        busy = np.clip(vals["compute"] + vals["optimizer"], 0.0, vals["step"])
        return np.round(idle * vals["step"] + (tdp - idle) * busy, 6) + 1j * step


THROUGHPUT = Ranking()


def _dominated_by(ax, ah, ac, x, h, c) -> np.ndarray:
    """Which of (x, h, c) some anchor (ax, ah, ac) is at least as good as on all three objectives."""
    out = np.zeros(len(x), dtype=bool)
    step = max(1, 2_000_000 // max(1, len(ax)))
    for s in range(0, len(x), step):
        bx, bh, bc = x[s : s + step, None], h[s : s + step, None], c[s : s + step, None]
        out[s : s + step] = ((ax[None, :] >= bx) & (ah[None, :] >= bh) & (ac[None, :] <= bc)).any(axis=1)
    return out


def _pareto_sweep(x, h, c) -> np.ndarray:
    """Exact front of points already sorted best-throughput-first: a point can only be dominated by one
    that sorts before it, so each block is checked against the front so far, then within itself."""
    front_x = front_h = front_c = np.empty(0)
    keep: list[np.ndarray] = []
    block = 512
    for start in range(0, len(x), block):
        bx, bh, bc = x[start : start + block], h[start : start + block], c[start : start + block]
        idx = np.arange(start, start + len(bx))
        if len(front_x):
            alive = ~_dominated_by(front_x, front_h, front_c, bx, bh, bc)
            bx, bh, bc, idx = bx[alive], bh[alive], bc[alive], idx[alive]
        # an earlier point of the block at least as good everywhere dominates (or duplicates) it
        geq = (bx[None, :] >= bx[:, None]) & (bh[None, :] >= bh[:, None]) & (bc[None, :] <= bc[:, None])
        sel = ~(geq & np.tri(len(bx), k=-1, dtype=bool)).any(axis=1)
        keep.append(idx[sel])
        front_x = np.concatenate([front_x, bx[sel]])
        front_h = np.concatenate([front_h, bh[sel]])
        front_c = np.concatenate([front_c, bc[sel]])
    return np.concatenate(keep) if keep else np.zeros(0, dtype=np.int64)


def pareto_indices(tokens: np.ndarray, headroom: np.ndarray, volume: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on all of (tokens max, headroom max, volume min),
    best throughput first, exact duplicates kept once.

    numpy has no skyline routine, so: sort by throughput, take the exact front of the fastest few
    thousand, drop every later point it dominates (a point dominated by a front point is dominated, so
    no front point is lost), and repeat on the survivors."""
    # one complex argsort sorts by (-tokens, -headroom) lexicographically, ~3x faster than lexsort;
    # fall back to the 3-key lexsort only if equal (tokens, headroom) pairs differ in volume
    order = np.argsort(-tokens - 1j * headroom)
    x, h, c = tokens[order], headroom[order], volume[order]
    if ((x[1:] == x[:-1]) & (h[1:] == h[:-1]) & (c[1:] != c[:-1])).any():
        order = np.lexsort((volume, -headroom, -tokens))
        x, h, c = tokens[order], headroom[order], volume[order]
    front = np.zeros(0, dtype=np.int64)
    remaining = np.arange(len(x))
    while len(remaining):
        head, rest = remaining[:4096], remaining[4096:]
        if len(front):
            head = head[~_dominated_by(x[front], h[front], c[front], x[head], h[head], c[head])]
        front = np.concatenate([front, head[_pareto_sweep(x[head], h[head], c[head])]])
        # a few spread-out front points remove most of the rest cheaply, the whole front the others
        for a in (front[:: max(1, len(front) // 24)], front):
            if len(rest):
                rest = rest[~_dominated_by(x[a], h[a], c[a], x[rest], h[rest], c[rest])]
        remaining = rest
    return order[front]
