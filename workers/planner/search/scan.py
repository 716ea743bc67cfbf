"""The scan of a layout grid: memory for every layout, time for those that fit, in chunks of base rows,
pruned by the device's memory and the user's limits (:func:`scan_grid`)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..costmodel import CostModel, GiB, Layouts
from ..specs import Strategy
from .plans import costed_plans
from .ranking import THROUGHPUT, Ranking

CHUNK_ROWS = 400_000


def _valid_mask(grid: Layouts, fixed: Strategy) -> np.ndarray:
    """Grid cells that are distinct layouts: sequence parallelism is the same layout as none when
    tp == 1, so unless the strategy pins it, keep only sp = 0 there."""
    if fixed.sequence_parallel is not None:
        return np.ones(grid.shape, dtype=bool)
    return np.broadcast_to(~((grid.sp == 1) & (grid.tp == 1)), grid.shape)


class Scan:
    """Feasible layouts of one grid as flat arrays, and the counts of the scan."""

    def __init__(self):
        self.parts: list[tuple[Layouts, dict[str, np.ndarray]]] = []
        self.evaluated = 0
        self.feasible = 0
        self.memory_rejected = 0
        self.lowest_rejected: float | None = None
        # layouts a user constraint rejected (name -> count) and the least each rejected one asked for
        self.constraint_rejected: Counter = Counter()
        self.constraint_lowest: dict[str, float] = {}
        self.cancelled = False
        self.best_key = (np.inf, np.inf)
        self.best_plan: dict | None = None

    def reject(self, name: str, values: np.ndarray) -> None:
        """Count layouts the user constraint ``name`` rejected (``values``: what each of them needs)."""
        self.constraint_rejected[name] += len(values)
        low = float(values.min())
        self.constraint_lowest[name] = min(self.constraint_lowest.get(name, low), low)

    def joined(self) -> tuple[Layouts, dict[str, np.ndarray]]:
        names = [name for name, _a in self.parts[0][0].arrays()]
        flat = Layouts(**{n: np.concatenate([getattr(p[0], n) for p in self.parts]) for n in names})
        vals = {k: np.concatenate([p[1][k] for p in self.parts]) for k in self.parts[0][1]}
        return flat, vals


def scan_grid(
    cm: CostModel,
    base: np.ndarray,
    extras: tuple[list, list, list],
    fixed: Strategy,
    progress=None,
    should_stop=None,
    memory_only: bool = False,
    ranking: Ranking = THROUGHPUT,
) -> Scan:
    """Memory for every layout of the grid, time for those that fit, in chunks of base rows; the
    ``ranking``'s limits reject layouts after the device's own memory (the memory limit before costing,
    the bubble limit after), and its key picks the best so far that ``progress`` reports."""
    scan = Scan()
    if not len(base):
        return scan
    per_row = len(extras[0]) * len(extras[1]) * len(extras[2])
    rows_per_chunk = max(1, CHUNK_ROWS // per_row)
    for start in range(0, len(base), rows_per_chunk):
        if should_stop is not None and should_stop():
            scan.cancelled = True
            break
        chunk = base[start : start + rows_per_chunk]
        grid = Layouts.grid(chunk, *extras)
        valid = _valid_mask(grid, fixed)
        total = np.broadcast_to(cm.memory(grid, parts=False)["total"], grid.shape)
        ok = valid & (total <= cm.memory_bytes)
        bad = valid & ~ok
        scan.evaluated += int(valid.sum())
        if bad.any():
            scan.memory_rejected += int(bad.sum())
            low = float(total[bad].min())
            scan.lowest_rejected = low if scan.lowest_rejected is None else min(scan.lowest_rejected, low)
        if ranking.max_memory_bytes is not None:
            over = ok & (total > ranking.max_memory_bytes)
            if over.any():
                scan.reject("max_memory_GiB_per_device", total[over] / GiB)
                ok = ok & ~over
        rows_ok = ok.reshape(len(chunk), -1).any(axis=1)
        if memory_only:
            scan.feasible += int(ok.sum())
        elif rows_ok.any():
            sub = Layouts.grid(chunk[rows_ok], *extras)
            ok_sub = ok[rows_ok]
            tm = cm.timing(sub)
            idx = np.nonzero(ok_sub)
            shape = ok_sub.shape
            vals = {
                k: np.broadcast_to(tm[k], shape)[idx] for k in ("step", "volume", "exposed", *ranking.needs)
            }
            vals["memory"] = total[rows_ok][idx]
            flat = sub.flat(idx)
            if ranking.max_bubble_fraction is not None:
                share = vals["bubble"] / vals["step"]
                over = share > ranking.max_bubble_fraction
                if over.any():
                    scan.reject("max_bubble_fraction", share[over])
                    keep = np.nonzero(~over)[0]
                    vals = {k: v[keep] for k, v in vals.items()}
                    flat = flat.take(keep)
            if len(vals["step"]):
                scan.parts.append((flat, vals))
                scan.feasible += len(vals["step"])
            if progress is not None and len(vals["step"]):
                key = ranking.key(vals, cm.memory_bytes - vals["memory"])
                i = int(np.argmin(key))
                if (key[i].real, key[i].imag) < scan.best_key:
                    scan.best_key = (float(key[i].real), float(key[i].imag))
                    best = costed_plans(cm, flat.take([i]), None, fixed.order, fixed.layers_per_stage)[0]
                    scan.best_plan = best.to_dict()
        if progress is not None:
            progress(
                scan.evaluated, scan.feasible, scan.best_plan, min(1.0, (start + len(chunk)) / len(base))
            )
    return scan
