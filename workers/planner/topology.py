"""A cluster as a person reads it: its totals (peak, memory, bisection bandwidth) and a drawing of its
switch tiers, nodes and links that stays legible at thousands of devices.

Pure data for the cluster pages (``controlplane.clusters``), computed from the ``cluster.json`` document
alone: :func:`cluster_figures` and :func:`topology_drawing` (boxes and edges with coordinates; the page
renders them as SVG).

Bisection bandwidth follows the cost model's own fat-tree taper (``costmodel.placement.group_links``;
Leiserson, "Fat-trees", IEEE Trans. Computers 1985): cut the devices into two halves; the traffic between
them leaves every switch tier whose domain is smaller than the cluster, so each device's scale-out link is
divided by the product of the oversubscriptions up to the outermost such tier. One node: half its devices
across the scale-up link.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .specs import ClusterSpec

SHOWN_CHILDREN = 3
"""Children drawn under one box before the rest collapse into one "+N more" box (the first box of every
level is opened; its siblings are identical by construction: the cluster is homogeneous)."""
DEVICES_SHOWN = 16
"""Devices drawn inside the opened node; more collapse into a count."""


def cross_tier_taper(cluster: ClusterSpec, span_nodes: int) -> float:
    """The factor a device's scale-out bandwidth is divided by for traffic among ``span_nodes`` nodes:
    the product of the oversubscriptions up to the outermost tier whose switch holds fewer nodes (the
    cost model's taper, ``group_links``)."""
    factor, taper = 1.0, 1.0
    for tier in cluster.tiers:
        taper *= tier.oversubscription
        if span_nodes > tier.nodes:
            factor = taper
    return factor


def cluster_figures(cluster: ClusterSpec) -> dict[str, Any]:
    """Totals of the cluster: devices, peak TFLOP/s per dtype (sum of the devices' dense peaks), memory
    (GiB), bisection bandwidth (GB/s per direction, with the link and taper it rests on), the scale-out
    bandwidth of one node (GB/s per direction) and per-tier switch counts with their uplinks."""
    n = cluster.num_devices
    if cluster.num_nodes > 1:
        taper = cross_tier_taper(cluster, cluster.num_nodes)
        bisection = n / 2 * cluster.inter_node.bandwidth_GBps / taper
        across = {"link": "inter_node", "kind": cluster.inter_node.kind, "taper": taper}
    else:
        bisection = cluster.devices_per_node / 2 * cluster.intra_node.bandwidth_GBps
        across = {"link": "intra_node", "kind": cluster.intra_node.kind, "taper": 1.0}
    node_out = cluster.devices_per_node * cluster.inter_node.bandwidth_GBps
    tiers, below, taper = [], 1, 1.0
    for tier in cluster.tiers:
        per_switch = min(tier.nodes, cluster.num_nodes)
        taper *= tier.oversubscription
        tiers.append(
            {
                "name": tier.name,
                "nodes_per_switch": tier.nodes,
                "switches": math.ceil(cluster.num_nodes / tier.nodes),
                "children_per_switch": math.ceil(per_switch / below),
                "oversubscription": tier.oversubscription,
                # what one switch of this tier sends up, per direction: its nodes' NICs over its taper
                "uplink_GBps": per_switch * node_out / taper,
            }
        )
        below = tier.nodes
    return {
        "devices": n,
        "nodes": cluster.num_nodes,
        "devices_per_node": cluster.devices_per_node,
        "peak_tflops": {dtype: n * peak for dtype, peak in cluster.device.peak_tflops.items()},
        "memory_GiB": n * cluster.device.memory_GiB,
        "memory_bandwidth_GBps": n * cluster.device.memory_bandwidth_GBps,
        "tdp_watts": n * cluster.device.tdp_watts if cluster.device.tdp_watts else None,
        "bisection_GBps": bisection,
        "bisection_across": across,
        "node_scale_out_GBps": node_out,
        "tiers": tiers,
        "beyond_tiers": bool(cluster.tiers) and cluster.tiers[-1].nodes < cluster.num_nodes,
    }


@dataclass
class _Box:
    kind: str  # network | switch | node | device | more
    label: str
    detail: str = ""
    children: list[_Box] = field(default_factory=list)
    edge: str = ""  # the label of the link up to the parent
    x: float = 0.0
    y: float = 0.0
    w: float = 0.0


BOX_W = {"network": 150, "switch": 132, "node": 150, "more": 132}
BOX_H = 46
ROW_GAP = 64
COL_GAP = 14
DEVICE = 14


def _gbps(v: float) -> str:
    return f"{v:,.0f} GB/s" if v >= 10 else f"{v:.3g} GB/s"


def _node_box(cluster: ClusterSpec, index: int, opened: bool) -> _Box:
    d = cluster.device
    box = _Box("node", f"node {index}", f"{cluster.devices_per_node} × {d.name}")
    if opened:
        box.detail += f" · {cluster.intra_node.kind} {_gbps(cluster.intra_node.bandwidth_GBps)}"
    return box


def _shown(count: int) -> list[int | None]:
    """The children drawn of ``count``: all when few, else the first two, None (a "+N more" box), the last."""
    return list(range(count)) if count <= SHOWN_CHILDREN else [0, 1, None, count - 1]


def _children(cluster: ClusterSpec, level: int, first_node: int, nodes: int) -> list[_Box]:
    """The boxes under a switch of tier ``level`` (-1: the nodes under the innermost switch) that holds
    ``nodes`` nodes from ``first_node``; only the first is opened, and only its edge is labelled (the
    others are the same link)."""
    boxes: list[_Box] = []
    if level < 0:
        link = f"{_gbps(cluster.inter_node.bandwidth_GBps)} per device · {cluster.inter_node.kind}"
        for i in _shown(nodes):
            if i is None:
                boxes.append(_Box("more", f"+{nodes - 3} more nodes", f"like node {first_node}"))
            else:
                boxes.append(_node_box(cluster, first_node + i, opened=(i == 0)))
        boxes[0].edge = link
        return boxes
    tier = cluster.tiers[level]
    count = math.ceil(nodes / tier.nodes)
    for i in _shown(count):
        if i is None:
            boxes.append(_Box("more", f"+{count - 3} more {tier.name}", f"{tier.nodes} nodes each"))
            continue
        start = i * tier.nodes
        held = min(tier.nodes, nodes - start)
        box = _Box("switch", f"{tier.name} {i}", f"{held} nodes · {tier.oversubscription:g}:1 oversubscribed")
        if i == 0:
            box.children = _children(cluster, level - 1, first_node + start, held)
        boxes.append(box)
    boxes[0].edge = _uplink_label(cluster, level)
    return boxes


def _uplink_label(cluster: ClusterSpec, level: int) -> str:
    """A switch of tier ``level``'s uplink: its nodes' scale-out bandwidth over its tier's taper."""
    tier = cluster.tiers[level]
    figures = cluster_figures(cluster)["tiers"][level]
    return f"{_gbps(figures['uplink_GBps'])} up · {tier.oversubscription:g}:1"


def _layout(box: _Box, x: float, depth: int) -> float:
    """Place ``box`` and its subtree from ``x``; returns the subtree's width."""
    own = BOX_W.get(box.kind, 132)
    box.y = depth * (BOX_H + ROW_GAP)
    if not box.children:
        box.x, box.w = x, own
        return own
    cx, total = x, 0.0
    for child in box.children:
        width = _layout(child, cx, depth + 1)
        cx += width + COL_GAP
        total += width + COL_GAP
    total -= COL_GAP
    box.w = own
    box.x = x + (total - own) / 2 if total > own else x
    if total < own:  # children narrower than their parent: centre them under it
        shift = (own - total) / 2
        for child in box.children:
            _shift(child, shift)
    return max(total, own)


def _shift(box: _Box, dx: float) -> None:
    box.x += dx
    for child in box.children:
        _shift(child, dx)


def topology_drawing(cluster: ClusterSpec) -> dict[str, Any]:
    """Boxes and edges with coordinates (SVG units): the outermost switch level on top, nodes below, the
    first node's devices drawn inside it. A level with more than SHOWN_CHILDREN boxes under one parent
    shows its first two, a "+N more" box and its last; only the first box of each level is opened, so a
    1,024-device cluster draws as a few dozen boxes. ``edges`` carry the link label: per-device scale-out
    bandwidth from a node, a switch's uplink bandwidth and oversubscription above it."""
    if cluster.tiers:
        outer = len(cluster.tiers) - 1
        top_count = math.ceil(cluster.num_nodes / cluster.tiers[outer].nodes)
        roots = _children(cluster, outer, 0, cluster.num_nodes)
        if top_count > 1:  # the cluster outgrows its outermost tier: traffic beyond it is not described
            root = _Box("network", f"beyond {cluster.tiers[outer].name}", "not described", children=roots)
        elif len(roots) == 1:
            root = roots[0]
        else:
            root = _Box("network", "network", "", children=roots)
    elif cluster.num_nodes > 1:
        root = _Box(
            "network",
            "network",
            cluster.inter_node.kind,
            children=_children(cluster, -1, 0, cluster.num_nodes),
        )
    else:
        root = _node_box(cluster, 0, opened=True)
    root.edge = ""
    width = _layout(root, 0.0, 0)
    boxes, edges = [], []
    opened_node: dict[str, Any] | None = None

    def walk(box: _Box, parent_id: int | None) -> None:
        nonlocal opened_node
        ident = len(boxes)
        boxes.append({"id": ident, "kind": box.kind, "label": box.label, "detail": box.detail,
                      "x": round(box.x, 1), "y": round(box.y, 1), "w": box.w, "h": BOX_H})  # fmt: skip
        if parent_id is not None:
            parent = boxes[parent_id]
            edges.append(
                {
                    "from": parent_id,
                    "to": ident,
                    "x1": parent["x"] + parent["w"] / 2,
                    "y1": parent["y"] + BOX_H,
                    "x2": boxes[ident]["x"] + box.w / 2,
                    "y2": boxes[ident]["y"],
                    "label": box.edge,
                }
            )
        if box.kind == "node" and opened_node is None:
            opened_node = boxes[ident]
        for child in box.children:
            walk(child, ident)

    walk(root, None)
    devices = []
    height = max(b["y"] for b in boxes) + BOX_H
    if opened_node is not None:  # the first node's devices, in a row under it
        shown = min(cluster.devices_per_node, DEVICES_SHOWN)
        per_row = max(1, int((opened_node["w"] - 8) // (DEVICE + 2)))
        y = opened_node["y"] + BOX_H + 8
        for i in range(shown):
            row, col = divmod(i, per_row)
            devices.append(
                {"x": opened_node["x"] + 4 + col * (DEVICE + 2), "y": y + row * (DEVICE + 2), "size": DEVICE}
            )
        height = max(height, max(d["y"] for d in devices) + DEVICE + 18)
    return {
        "boxes": boxes,
        "edges": edges,
        "devices": devices,
        "devices_more": max(0, cluster.devices_per_node - DEVICES_SHOWN),
        "width": round(max(width, 1.0), 1),
        "height": round(height, 1),
        "collapsed": any(b["kind"] == "more" for b in boxes),
    }
