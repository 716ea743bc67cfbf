"""Why nothing fits: the message a search gives when no layout is left, naming the tightest constraint
(device memory, the global batch, the divisibility rules or the user's limits) and what to change."""

from __future__ import annotations

import math
from collections import Counter

from ..costmodel import CostModel, GiB
from ..specs import ClusterSpec, ModelSpec, Strategy, TrainingConfig
from .enumeration import dp_degrees_allowed
from .scan import Scan


def _batch_message(model: ModelSpec, cluster: ClusterSpec, training: TrainingConfig, fixed: Strategy) -> str:
    """When the global batch is what blocks every layout: the degrees the device count leaves to dp (none
    of which divides the batch) and the nearest batches that would work; "" when the batch is not it."""
    gbs = training.global_batch_size
    dps = dp_degrees_allowed(model, cluster, fixed)
    if not dps or any(gbs % dp == 0 for dp in dps):
        return ""
    below = max((gbs // dp * dp for dp in dps if gbs // dp), default=0)
    above = min(-(-gbs // dp) * dp for dp in dps)
    shown = ", ".join(map(str, dps[:6])) + (", …" if len(dps) > 6 else "")
    return (
        f"global_batch_size {gbs} is not divisible by any data-parallel degree these {cluster.num_devices} "
        f"devices leave (dp ∈ {{{shown}}} once tp, cp and pp fit the model) — use a global batch one of them "
        f"divides, e.g. {' or '.join(str(b) for b in (below, above) if b)}"
    )


def constraint_message(scan: Scan, constraints: dict[str, float]) -> str:
    """When the user's limits rejected every layout that fits the device: which limit rejected how many,
    the least a layout needs, and what to relax (one " — " before the change, as ``nothing_fits_message``)."""
    whys, changes = [], []
    if n := scan.constraint_rejected.get("max_memory_GiB_per_device"):
        limit, low = (
            constraints["max_memory_GiB_per_device"],
            scan.constraint_lowest["max_memory_GiB_per_device"],
        )
        whys.append(
            f"max_memory_GiB_per_device = {limit:g} rejected {n:,} layouts that fit the device "
            f"(the leanest needs {low:.2f} GiB per device)"
        )
        changes.append(
            f"raise max_memory_GiB_per_device to at least {math.ceil(low * 100) / 100:g} GiB (or add nodes)"
        )
    if n := scan.constraint_rejected.get("max_bubble_fraction"):
        limit, low = constraints["max_bubble_fraction"], scan.constraint_lowest["max_bubble_fraction"]
        whys.append(
            f"max_bubble_fraction = {limit:g} rejected {n:,} layouts that fit in memory "
            f"(the smallest predicted bubble is {low:.3f})"
        )
        changes.append(
            f"raise max_bubble_fraction to at least {math.ceil(low * 1000) / 1000:g}, or pin pp to fewer "
            "stages"
        )
    return "; ".join(whys) + " — " + ", or ".join(changes)


def nothing_fits_message(cm: CostModel, lowest: float | None, rejected: Counter, fixed: Strategy) -> str:
    """The message a user gets when nothing fits."""
    if lowest is not None:
        free = [k.upper() for k in ("tp", "pp") if getattr(fixed, k) is None]
        hint = "add nodes" + (f" or raise {'/'.join(free)}" if free else " or unpin fields of the strategy")
        return (
            f"needs ≥ {lowest / GiB:.1f} GiB per device at best; the device has "
            f"{cm.cluster.device.memory_GiB:g} GiB — {hint}"
        )
    if batch := _batch_message(cm.model, cm.cluster, cm.training, fixed):
        return batch
    if rejected:
        reason, n = rejected.most_common(1)[0]
        return f"no layout obeys the divisibility rules; most rejections: {reason} ({n})"
    return "no layout matches the fixed strategy fields"
