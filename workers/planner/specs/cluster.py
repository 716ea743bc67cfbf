"""``cluster.json``: a homogeneous cluster (:class:`ClusterSpec`) of one accelerator (:class:`DeviceSpec`),
its two link classes (:class:`LinkSpec`) and the switch tiers above the nodes (:class:`TierSpec`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .validation import MAXIMA, DocumentChecker, SpecError, fields_as_dict


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (``cluster.json`` ``device``)."""

    name: str
    """Device model; matched against the shipped hardware profiles for calibrated efficiencies."""
    peak_tflops: dict[str, float]
    """Dense peak TFLOP/s per dtype."""
    memory_GiB: float
    """Device memory in GiB."""
    memory_bandwidth_GBps: float
    """Device memory bandwidth, GB/s."""
    tdp_watts: float | None = None
    """Board power, W (used by the green accounting, not the planner)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeviceSpec:
        c = DocumentChecker(d, "device")
        peak = c.raw("peak_tflops")
        if peak is not None:
            if not isinstance(peak, dict) or not peak:
                c.fail("peak_tflops", "must be an object {dtype: TFLOP/s}")
                peak = None
            else:
                top = MAXIMA["peak_tflops"]
                for k, v in peak.items():
                    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= top:
                        c.fail(f"peak_tflops.{k}", f"must be a number > 0 and <= {top:,.0f}, got {v!r}")
                peak = {k: float(v) for k, v in peak.items() if isinstance(v, int | float)}
        spec = dict(
            name=c.text("name"),
            peak_tflops=peak,
            memory_GiB=c.number("memory_GiB"),
            memory_bandwidth_GBps=c.number("memory_bandwidth_GBps"),
            tdp_watts=c.number("tdp_watts", default=None),
        )
        c.done()
        return cls(**spec)

    def to_dict(self) -> dict[str, Any]:
        return fields_as_dict(self)


@dataclass(frozen=True)
class LinkSpec:
    """A link class (``intra_node`` or ``inter_node``)."""

    kind: str
    """Technology label (nvswitch, hccs, infiniband-hdr, roce-200ge, ...)."""
    bandwidth_GBps: float
    """GB/s per device per direction."""
    latency_us: float
    """One-hop latency in microseconds (the alpha of the alpha-beta model)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LinkSpec:
        c = DocumentChecker(d, "link")
        spec = dict(
            kind=c.text("kind", default="link"),
            bandwidth_GBps=c.number("bandwidth_GBps"),
            latency_us=c.number("latency_us", strict=False),
        )
        c.done()
        return cls(**spec)

    def to_dict(self) -> dict[str, Any]:
        return fields_as_dict(self)


@dataclass(frozen=True)
class TierSpec:
    """A switch level above the nodes (``cluster.json`` ``tiers``, innermost first)."""

    name: str
    """Label (leaf, spine, core)."""
    nodes: int
    """Nodes under one switch of this tier."""
    oversubscription: float = 1.0
    """Downlink / uplink bandwidth ratio of this tier's switches (1 = non-blocking)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TierSpec:
        c = DocumentChecker(d, "tier")
        spec = dict(
            name=c.text("name", default="tier"),
            nodes=c.integer("nodes"),
            oversubscription=c.number("oversubscription", default=1.0),
        )
        if spec["oversubscription"] is not None and spec["oversubscription"] < 1.0:
            c.fail("oversubscription", f"must be >= 1, got {spec['oversubscription']}")
        c.done()
        return cls(**spec)

    def to_dict(self) -> dict[str, Any]:
        return fields_as_dict(self)


@dataclass(frozen=True)
class ClusterSpec:
    """A homogeneous cluster (``cluster.json``)."""

    name: str
    """Free-form cluster name."""
    num_nodes: int
    """Nodes (servers)."""
    devices_per_node: int
    """Accelerators per node."""
    device: DeviceSpec
    """The accelerator."""
    intra_node: LinkSpec
    """Scale-up link inside a node."""
    inter_node: LinkSpec
    """Scale-out link between nodes (per device)."""
    tiers: tuple[TierSpec, ...] = ()
    """Switch levels above a node, innermost first."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClusterSpec:
        c = DocumentChecker(d, "cluster")
        tiers_raw = c.raw("tiers", default=[])
        tiers: list[TierSpec] = []
        if not isinstance(tiers_raw, list):
            c.fail("tiers", "must be a list")
        else:
            for i, t in enumerate(tiers_raw):
                try:
                    tiers.append(TierSpec.from_dict(t))
                except SpecError as exc:
                    for k, msgs in exc.prefixed(f"tiers[{i}]").errors.items():
                        for m in msgs:
                            c.fail(k, m)
        for i in range(1, len(tiers)):
            if tiers[i].nodes < tiers[i - 1].nodes:
                c.fail(f"tiers[{i}].nodes", "tiers must be listed innermost first with non-decreasing nodes")
        spec = dict(
            name=c.text("name", default="cluster"),
            num_nodes=c.integer("num_nodes"),
            devices_per_node=c.integer("devices_per_node"),
            device=c.nested("device", DeviceSpec.from_dict),
            intra_node=c.nested("intra_node", LinkSpec.from_dict),
            inter_node=c.nested("inter_node", LinkSpec.from_dict),
            tiers=tuple(tiers),
        )
        c.done()
        return cls(**spec)

    def to_dict(self) -> dict[str, Any]:
        return fields_as_dict(self)

    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.devices_per_node

    def with_nodes(self, num_nodes: int) -> ClusterSpec:
        """The same cluster cut down (or grown) to ``num_nodes`` nodes."""
        return dataclasses.replace(self, num_nodes=num_nodes, name=f"{self.name}[{num_nodes} nodes]")

    def devices_problem(self, devices: int) -> str | None:
        """Why a layout of ``devices`` ranks cannot run on this cluster; None when it can: on every device,
        on part of one node (at most ``devices_per_node``) or on whole nodes (a multiple of it), the other
        devices staying idle."""
        n, per_node = self.num_devices, self.devices_per_node
        if devices == n or (0 < devices < n and (devices <= per_node or devices % per_node == 0)):
            return None
        if devices > n:
            return f"needs {devices} devices; the cluster has {n} ({self.num_nodes} x {per_node})"
        return (
            f"{devices} devices are neither part of one node (at most {per_node}) nor whole nodes (a multiple "
            f"of {per_node}) of the cluster's {n}"
        )

    def with_devices(self, devices: int) -> ClusterSpec:
        """The part of this cluster a layout of ``devices`` ranks runs on: this cluster when it takes every
        device, else part of one node or whole nodes (:meth:`devices_problem`; a ``SpecError`` on
        ``devices`` when it is neither)."""
        if problem := self.devices_problem(devices):
            raise SpecError("devices", problem)
        if devices == self.num_devices:
            return self
        if devices % self.devices_per_node == 0:
            return self.with_nodes(devices // self.devices_per_node)
        return dataclasses.replace(
            self, num_nodes=1, devices_per_node=devices, name=f"{self.name}[{devices} devices]"
        )
