"""The scaling baseline: the best tokens/s per device of a model on the smallest device count where it
fits, the denominator of a plan's ``scaling_efficiency`` (cached)."""

from __future__ import annotations

import json

from ..costmodel import CostModel
from ..hardware import Efficiency
from ..moe import MeasuredExpertLoad
from ..specs import ClusterSpec, ModelSpec, Strategy, TrainingConfig
from .enumeration import enumerate_layouts
from .rules import divisors
from .scan import scan_grid

_BASELINE_CACHE: dict[str, float | None] = {}


def clear_caches() -> None:
    """Forget cached scaling baselines (benchmarks measure cold searches)."""
    _BASELINE_CACHE.clear()


def _device_counts(cluster: ClusterSpec) -> list[ClusterSpec]:
    """Smaller clusters of the same kind, ascending: part of one node, then whole nodes
    (powers of two and divisors of the node count)."""
    out = []
    dpn = cluster.devices_per_node
    for d in divisors(dpn)[:-1]:
        out.append(
            ClusterSpec(
                name=f"{cluster.name}[{d} devices]",
                num_nodes=1,
                devices_per_node=d,
                device=cluster.device,
                intra_node=cluster.intra_node,
                inter_node=cluster.inter_node,
                tiers=cluster.tiers,
            )
        )
    nodes = set(divisors(cluster.num_nodes))
    k = 1
    while k < cluster.num_nodes:
        nodes.add(k)
        k *= 2
    out.extend(cluster.with_nodes(n) for n in sorted(nodes))
    return out


def baseline_tokens_per_device(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingConfig,
    eff: Efficiency,
    known_best: float | None = None,
    expert_load: MeasuredExpertLoad | None = None,
) -> float | None:
    """Best tokens/s per device of the same model and global batch on the smallest device count where
    any layout fits: the denominator of ``scaling_efficiency`` (per-device throughput at this size over
    this). ``known_best``: the best tokens/s per device of a free search on ``cluster`` itself, if
    already known. Cached per (model, training, device, links, efficiency)."""
    cdict = cluster.to_dict()
    cdict.pop("name")
    key = json.dumps(
        [model.to_dict(), training.to_dict(), cdict, repr(eff), repr(expert_load)], sort_keys=True
    )
    if key in _BASELINE_CACHE:
        return _BASELINE_CACHE[key]
    result = None
    for small in _device_counts(cluster):
        cm = CostModel(model, small, training, eff, expert_load=expert_load)
        base, (rcs, _zeros, _sps), _ = enumerate_layouts(model, small, training, Strategy())
        # the least memory of a base row is at ZeRO-3 with sequence parallelism (both only ever shrink
        # memory), so checking those first finds the smallest size that fits at a fraction of the cost
        probe = scan_grid(cm, base, (rcs, [3], [0, 1]), Strategy(), memory_only=True)
        if not probe.feasible:
            continue
        if small.num_devices == cluster.num_devices and known_best is not None:
            result = known_best
            break
        scan = scan_grid(cm, base, (rcs, [0, 1, 2, 3], [0, 1]), Strategy())
        _flat, vals = scan.joined()
        tokens = training.global_batch_size * model.seq_length / vals["step"]
        result = float(tokens.max()) / small.num_devices
        break
    _BASELINE_CACHE[key] = result
    return result
