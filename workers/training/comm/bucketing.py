"""DDP bucket size from the topology: ``choose_bucket_cap_mb``.

A bucket's all-reduce costs ``alpha + beta * S`` (Hockney's alpha-beta model): a ring all-reduce over W
ranks takes 2(W-1) latency-bound steps and moves 2(W-1)/W * S bytes per rank (Thakur, Rabenseifner &
Gropp 2005; Patarasuk & Yuan 2009). Latency is amortised (<= ``latency_share`` of the bucket's time) when

    2(W-1) * latency <= latency_share * 2(W-1)/W * S / B   <=>   S >= W * latency * B / latency_share.

Buckets should still be small next to the whole gradient: communication overlaps backward one bucket at a
time and the last bucket is always exposed (Li et al. 2020, "PyTorch Distributed", VLDB, sec. 3.2.3 and
fig. 7: 25 MB default, smaller buckets overlap better until per-bucket overhead dominates). So the cap is
the latency floor, raised towards DDP's 25 MB default only while that still leaves ``min_buckets``
buckets, and clamped to ``[min_mb, max_mb]``.
"""

from __future__ import annotations

DDP_DEFAULT_BUCKET_MB = 25.0


def choose_bucket_cap_mb(
    inter_node_GBps: float,
    latency_us: float,
    *,
    world_size: int = 2,
    grad_MB: float | None = None,
    latency_share: float = 0.1,
    min_buckets: int = 4,
    min_mb: float = 1.0,
    max_mb: float = 256.0,
) -> float:
    """``bucket_cap_mb`` for DDP. ``inter_node_GBps`` is GB/s per device per direction (cluster.json);
    ``latency_us`` the per-message link latency; ``grad_MB`` the model's gradient size, if known."""
    if inter_node_GBps <= 0 or latency_us < 0 or world_size < 1:
        raise ValueError("bandwidth must be > 0, latency >= 0, world_size >= 1")
    bandwidth_bytes_per_s = inter_node_GBps * 1e9
    latency_floor_mb = world_size * latency_us * 1e-6 * bandwidth_bytes_per_s / latency_share / 1e6
    preferred = DDP_DEFAULT_BUCKET_MB
    if grad_MB is not None and grad_MB > 0:
        preferred = min(preferred, grad_MB / min_buckets)
    cap = max(latency_floor_mb, preferred)
    return round(min(max_mb, max(min_mb, cap)), 2)
