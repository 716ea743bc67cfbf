"""Collectives in the alpha-beta model: the seconds of an all-reduce, reduce-scatter / all-gather,
all-to-all or point-to-point send of a buffer over the links of a group (:class:`~.placement.GroupLinks`)."""

from __future__ import annotations

import numpy as np

from .placement import GroupLinks


def all_reduce_time(g: GroupLinks, nbytes) -> np.ndarray:
    """All-reduce of ``nbytes`` per rank: best of flat ring, hierarchical and double-binary tree."""
    p = g.size.astype(np.float64)
    k = g.per_node.astype(np.float64)
    nodes = np.maximum(1.0, p / k)
    lat = np.where(g.inter, g.lat_inter, g.lat_intra)
    # ring: 2(p-1) alpha + 2(p-1)/p n/B (Thakur, Rabenseifner & Gropp 2005, eq. for ring allreduce);
    # across nodes the k rings of a node use k NICs, so the inter-node edges carry n/k each
    ring_bw = np.where(g.inter, np.minimum(g.bw_intra, k * g.bw_inter), g.bw_intra)
    ring = 2 * (p - 1) * lat + 2 * (p - 1) / p * nbytes / ring_bw
    # hierarchical: intra reduce-scatter, inter all-reduce on n/k, intra all-gather (Jia et al. 2018, 2D ring)
    hier = (
        2 * (k - 1) * g.lat_intra
        + 2 * (k - 1) / k * nbytes / g.bw_intra
        + 2 * (nodes - 1) * g.lat_inter
        + 2 * (nodes - 1) / nodes * (nbytes / k) / g.bw_inter
    )
    # double binary tree: 2 log2(p) alpha + 2 n / B at full pipelining (Sanders et al. 2009)
    tree = 2 * np.log2(np.maximum(p, 2)) * lat + 2 * nbytes / ring_bw
    best = np.minimum(ring, np.where(g.inter, np.minimum(hier, tree), tree))
    return np.where(p > 1, best, 0.0)


def reduce_scatter_time(g: GroupLinks, nbytes) -> np.ndarray:
    """Reduce-scatter (or all-gather) of an ``nbytes`` buffer: half an all-reduce (Thakur et al. 2005)."""
    return 0.5 * all_reduce_time(g, nbytes)


def shard_collective_time(g: GroupLinks, nbytes, calls=1.0, per_device_link: bool = False) -> np.ndarray:
    """All-gather (or reduce-scatter) of a buffer that is ``nbytes`` per rank once gathered, issued as
    ``calls`` collectives (one per FSDP block or DeepSpeed bucket). NCCL runs these as rings only (no tree:
    NCCL documentation, collective operations): ``p - 1`` latency steps per call and ``(p-1)/p`` of the
    buffer through the ring, whose node-boundary edges share the node's ``k`` NICs (Thakur et al. 2005,
    ring all-gather). ``per_device_link`` (:class:`~.hardware.FrameworkCollectives`): instead each rank's
    off-node share crosses its own NIC while its on-node share moves over the node's links."""
    p = g.size.astype(np.float64)
    k = g.per_node.astype(np.float64)
    lat = np.where(g.inter, g.lat_inter, g.lat_intra)
    ring_bw = np.where(g.inter, np.minimum(g.bw_intra, k * g.bw_inter), g.bw_intra)
    transfer = (p - 1) / np.maximum(p, 1.0) * nbytes / ring_bw
    if per_device_link:
        own = np.maximum((k - 1) / p * nbytes / g.bw_intra, (p - k) / p * nbytes / g.bw_inter)
        transfer = np.where(g.inter, own, transfer)
    return np.where(p > 1, calls * (p - 1) * lat + transfer, 0.0)


def all_to_all_time(g: GroupLinks, nbytes) -> np.ndarray:
    """All-to-all where each rank holds ``nbytes`` destined evenly to all ranks: (p-1) alpha, with the
    intra-node and inter-node shares moving concurrently (pairwise exchange, Thakur et al. 2005)."""
    p = g.size.astype(np.float64)
    k = g.per_node.astype(np.float64)
    intra = (k - 1) / p * nbytes / g.bw_intra
    inter = (p - k) / p * nbytes / g.bw_inter
    lat = np.where(g.inter, g.lat_inter, g.lat_intra)
    return np.where(p > 1, (p - 1) * lat + np.maximum(intra, inter), 0.0)


def p2p_time(g: GroupLinks, nbytes) -> np.ndarray:
    """Point-to-point send of ``nbytes`` between neighbours of the group: alpha + n / B."""
    lat = np.where(g.inter, g.lat_inter, g.lat_intra)
    bw = np.where(g.inter, g.bw_inter, g.bw_intra)
    return np.where(g.size > 1, lat + nbytes / bw, 0.0)
