"""Placement: where each parallel group's ranks sit for a placement ``order`` (:func:`group_strides`),
how many share a node, and which links and switch tiers the group crosses (:func:`group_links`,
:func:`cross_tier_fraction`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..hardware import Efficiency
from ..specs import ClusterSpec
from .layouts import Layouts


@dataclass
class GroupLinks:
    """Per candidate: size of a group, members per node, and the bandwidth/latency it sees."""

    size: np.ndarray
    per_node: np.ndarray  # members of the group inside one node
    inter: np.ndarray  # bool: crosses nodes
    bw_intra: np.ndarray  # achieved bytes/s per device inside the node
    bw_inter: np.ndarray  # achieved bytes/s per device across nodes, after oversubscription
    lat_intra: float
    lat_inter: float
    oversubscription_factor: np.ndarray | float = 1.0  # inter-node bandwidth divided by it (the uplinks)


def cp_dp_block(layouts: Layouts, stride: dict[str, np.ndarray], order: str):
    """The cp x dp block of a stage in ``order``: ``(inner size, inner stride, outer stride)``, the inner
    being the one of cp / dp placed first. The block's member j sits at ``(j % I) * s_in + (j // I) *
    s_out``; an outer dimension of size 1 is taken as contiguous (its stride never matters)."""
    dense = [p for p in order.split("-") if p != "ep"]
    inner, outer = ("cp", "dp") if dense.index("cp") < dense.index("dp") else ("dp", "cp")
    sizes = {"cp": layouts.cp, "dp": layouts.dp}
    size_in = sizes[inner].astype(np.float64)
    s_in = stride[inner].astype(np.float64)
    s_out = np.where(sizes[outer] == 1, size_in * s_in, stride[outer]).astype(np.float64)
    return size_in, s_in, s_out


def group_strides(layouts: Layouts, order: str) -> dict[str, np.ndarray]:
    """Rank stride of each group kind for a placement ``order`` (innermost first), e.g. tp-cp-ep-dp-pp.

    Dense groups ignore ``ep``; the EP group takes ``ep`` consecutive members of the combined cp*dp
    dimension starting at its innermost part (Megatron-Core RankGenerator, expert decomposition), and
    the expert-data-parallel group the remaining ``cp*dp/ep`` members (every ``ep``-th). A group that
    straddles both parts of a block that is not contiguous (another dimension placed between cp and dp)
    gets the stride of the same span: ``span / size`` (``ep`` members past the inner part span
    ``ep / I`` outer steps, so stride ``s_out / I``; the EDP group ``s_out * ep / I``), which is what
    ``group_links`` needs to tell whether the group leaves a node and how many members share one. The
    runtime places ranks exactly so (``workers/training/parallel/dims.py``, ``tests/unit/test_rank_order.py``).
    """
    dense = [p for p in order.split("-") if p != "ep"]
    sizes = {"tp": layouts.tp, "cp": layouts.cp, "dp": layouts.dp, "pp": layouts.pp}
    stride = {}
    acc = np.ones_like(layouts.tp)
    for name in dense:
        stride[name] = acc
        acc = acc * sizes[name]
    size_in, s_in, s_out = cp_dp_block(layouts, stride, order)
    ep = layouts.ep.astype(np.float64)
    stride["ep"] = np.where(ep <= size_in, s_in, np.maximum(s_in, s_out / size_in))
    stride["edp"] = np.maximum(ep * s_in, s_out * ep / size_in)
    return stride


def gradient_group_stride(layouts: Layouts, strides: dict[str, np.ndarray], order: str) -> np.ndarray:
    """Stride of the gradient (dp x cp) group: the whole cp x dp block, ``s_out / I`` (the inner one's
    stride when cp and dp are adjacent in the order; the span-preserving stride when another dimension
    sits between them); with cp = 1 it is the dp group itself (and vice versa)."""
    size_in, s_in, s_out = cp_dp_block(layouts, strides, order)
    return np.maximum(s_in, s_out / size_in)


DEFAULT_ORDER = "tp-cp-ep-dp-pp"
"""The topology-blind placement (Megatron-Core's default ``order``): the runtime places ranks so."""

# Placements the search tries for its best layouts (innermost first): which of tp / cp / dp is innermost,
# whether pipeline stages sit inside the data-parallel replicas, and where the EP group sits. Under
# ``group_strides`` the EP group is carved from the cp x dp block (Megatron-Core RankGenerator), so orders
# that differ only in the position of ``ep`` cost the same and the search times one of each.
CANDIDATE_ORDERS = (
    DEFAULT_ORDER,
    "tp-ep-cp-dp-pp",
    "tp-cp-dp-ep-pp",
    "tp-dp-cp-ep-pp",
    "cp-tp-ep-dp-pp",
    "tp-cp-ep-pp-dp",
)


def dense_order(order: str) -> str:
    """The placement of the dense dimensions (``order`` without ``ep``): two orders with the same one
    place every group alike (see :func:`group_strides`)."""
    return "-".join(p for p in order.split("-") if p != "ep")


def cross_tier_fraction(
    cluster: ClusterSpec, size: np.ndarray, stride: np.ndarray, tier_nodes: int, pattern: str
) -> np.ndarray:
    """Share of the bytes a group of ``size`` ranks spaced ``stride`` apart communicates per device that
    leaves a switch holding ``tier_nodes`` nodes, its members ordered by rank (groups aligned to switches).

    ``ring`` (ring all-reduce / reduce-scatter / all-gather, the cp ring): a ring over ``k`` switches
    crosses switch boundaries on ``k`` of its ``size`` edges; ``all_to_all`` (EP dispatch): each rank
    sends equal shares to the others, ``(size - m) / (size - 1)`` of them to the other switches (``m``
    members under one switch); ``p2p`` (pipeline sends): ``k - 1`` of the ``size - 1`` stage boundaries."""
    domain = cluster.devices_per_node * tier_nodes  # ranks under one switch
    size = np.asarray(size, dtype=np.int64)
    stride = np.maximum(np.asarray(stride, dtype=np.int64), 1)
    members = np.where(size * stride <= domain, size, np.maximum(1, domain // stride))
    members = np.minimum(members, size)
    switches = np.ceil(size / members)
    g = size.astype(np.float64)
    if pattern == "ring":
        return np.where(switches > 1, switches / g, 0.0)
    if pattern == "all_to_all":
        return np.where(g > 1, (g - members) / np.maximum(g - 1, 1), 0.0)
    return np.where(g > 1, (switches - 1) / np.maximum(g - 1, 1), 0.0)


def block_per_node(n: int, c_in, s_in, c_out, s_out) -> np.ndarray:
    """Members per node of a two-level group: ``c_in`` members ``s_in`` apart, repeated ``c_out`` times
    ``s_out`` apart (a group carved from a cp x dp block with another dimension between them); ranks fill
    nodes of ``n`` in order, groups aligned."""
    c_in, s_in = np.asarray(c_in, dtype=np.int64), np.maximum(np.asarray(s_in, dtype=np.int64), 1)
    c_out, s_out = np.asarray(c_out, dtype=np.int64), np.maximum(np.asarray(s_out, dtype=np.int64), 1)
    fits = c_in * s_in <= n
    inner = np.where(fits, c_in, np.maximum(1, n // s_in))
    outer = np.where(fits, np.minimum(c_out, np.maximum(1, n // s_out)), 1)
    return np.minimum(inner * outer, c_in * c_out)


def uplink_share(
    cluster: ClusterSpec, size, stride, per_node, tier_nodes: int, pattern: str = "ring"
) -> np.ndarray:
    """Share of a group's inter-node traffic that leaves a switch holding ``tier_nodes`` nodes, when every
    rank under the switch runs such a group (its members ordered by rank, groups aligned to switches): what
    the switch's uplinks must carry, as a fraction of what its nodes' NICs send.

    ``ring``: a ring crosses the switch on one of the edges between its consecutive nodes under it (``k``
    switches of its ``size / per_node`` node edges); ``all_to_all``: ``(size - m) / (size - per_node)`` of
    the off-node shares go to other switches (``m`` members under one); ``p2p`` (pipeline sends): ``k - 1``
    of the ``nodes - 1`` boundaries between stages on different nodes."""
    domain = cluster.devices_per_node * tier_nodes  # ranks under one switch
    size = np.asarray(size, dtype=np.int64)
    stride = np.maximum(np.asarray(stride, dtype=np.int64), 1)
    per_node = np.maximum(np.asarray(per_node, dtype=np.int64), 1)
    members = np.where(size * stride <= domain, size, np.maximum(1, domain // stride))
    members = np.minimum(members, size)
    switches = np.ceil(size / members)
    nodes = np.maximum(np.ceil(size / per_node), 1.0)
    g = size.astype(np.float64)
    if pattern == "ring":
        share = switches / nodes
    elif pattern == "all_to_all":
        share = (g - members) / np.maximum(g - per_node, 1.0)
    else:
        share = (switches - 1) / np.maximum(nodes - 1, 1.0)
    return np.where(switches > 1, np.minimum(share, 1.0), 0.0)


def group_links(
    cluster: ClusterSpec,
    eff: Efficiency,
    size: np.ndarray,
    stride: np.ndarray,
    per_node=None,
    pattern: str = "ring",
) -> GroupLinks:
    """Links crossed by groups of ``size`` ranks spaced ``stride`` apart, ranks filling nodes in order;
    ``per_node`` (from :func:`block_per_node`) where the members cluster unevenly; ``pattern`` (``ring``,
    ``all_to_all``, ``p2p``) says how much of their traffic leaves each switch (:func:`uplink_share`)."""
    n = cluster.devices_per_node
    size = np.asarray(size, dtype=np.int64)
    stride = np.asarray(stride, dtype=np.int64)
    span = size * stride  # ranks from the first member to one past the last
    inter = span > n
    spread = np.maximum(1, n // np.maximum(stride, 1)) if per_node is None else per_node
    per_node = np.minimum(np.where(inter, spread, size), size)
    # switch tiers: a tier-i switch with s:1 oversubscription has 1/s of its nodes' NIC bandwidth as uplinks
    # (fat-tree taper, Leiserson 1985; 1/(s1*s2) past the next tier). Only the share of the groups' traffic
    # that leaves the switch uses them (uplink_share): when the uplinks carry all that share at NIC speed
    # the group runs at NIC speed, else at (uplinks / demand) of it. A ring whose members under one switch
    # are many leaves it on few of its edges: the data-parallel rings of Llama 3 405B (24 members per
    # 3,072-GPU pod, pods joined 1:7; Dubey et al. 2024 §3.3.1) are not slowed by the pods' uplinks
    factor = np.ones(span.shape, dtype=np.float64)
    taper = 1.0
    for tier in cluster.tiers:
        taper *= tier.oversubscription
        load = taper * uplink_share(cluster, size, stride, per_node, tier.nodes, pattern)
        factor = np.maximum(factor, load)
    bw_inter = cluster.inter_node.bandwidth_GBps * 1e9 * eff.collective_efficiency_inter / factor
    bw_intra = np.full(span.shape, cluster.intra_node.bandwidth_GBps * 1e9 * eff.collective_efficiency_intra)
    return GroupLinks(
        size,
        per_node,
        inter,
        bw_intra,
        bw_inter,
        cluster.intra_node.latency_us * 1e-6,
        cluster.inter_node.latency_us * 1e-6,
        factor,
    )
