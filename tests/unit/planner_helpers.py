"""Small planner inputs the planner unit tests share: an A100 cluster of any shape and a complete strategy."""

from __future__ import annotations

from workers.planner import Strategy


def a100_cluster(
    num_nodes: int,
    devices_per_node: int = 8,
    *,
    memory_GiB: float = 80,
    tiers: tuple[tuple[str, int], ...] = (),
    oversubscription: float = 1.0,
    name: str = "toy",
) -> dict:
    """``cluster.json`` of A100-SXM4-80GB nodes (NVSwitch 300 GB/s inside, 25 GB/s InfiniBand between);
    ``tiers`` = ((name, nodes), ...) innermost first, the first one ``oversubscription``:1."""
    return {
        "name": name,
        "num_nodes": num_nodes,
        "devices_per_node": devices_per_node,
        "device": {
            "name": "A100-SXM4-80GB",
            "peak_tflops": {"bf16": 312},
            "memory_GiB": memory_GiB,
            "memory_bandwidth_GBps": 2039,
        },
        "intra_node": {"kind": "nvswitch", "bandwidth_GBps": 300, "latency_us": 3},
        "inter_node": {"kind": "ib", "bandwidth_GBps": 25, "latency_us": 5},
        "tiers": [
            {"name": tier, "nodes": nodes, "oversubscription": oversubscription if i == 0 else 1.0}
            for i, (tier, nodes) in enumerate(tiers)
        ],
    }


def full_strategy(**fields) -> Strategy:
    """A complete strategy: one device, no recompute, no ZeRO, unless ``fields`` say otherwise."""
    base = dict(
        tp=1,
        pp=1,
        dp=1,
        ep=1,
        cp=1,
        vpp=1,
        micro_batch_size=1,
        recompute="none",
        zero_stage=0,
        sequence_parallel=False,
    )
    return Strategy(**{**base, **fields})
