"""Import of Prometheus text-format scrapes (dcgm-exporter, npu-exporter, node_exporter, or a Prometheus
``/federate`` dump of them) into time-stamped per-node samples, in the metric names the live collectors
use, so that a user can bring their cluster's history.

Names are mapped by ONE table, ``metric_map.json`` beside this module: each entry maps an exporter's
metric (an exact name or a regular expression) to ours, with its kind (``gauge``, ``counter``: kept as is;
``rate``: per-second rate between consecutive scrapes of the same series), a scale (unit conversion) and
the source of the mapping. Metrics the table does not know are counted in ``unmapped`` and left out.

Time: each sample line may carry its own timestamp (milliseconds, the text format's optional third field),
which is how a history of several scrapes comes in one file; lines without one take ``default_time`` (the
time of a single scrape). Node: the first of the table's ``node_labels`` a sample has (``instance``, with
any ``:port`` dropped, then dcgm-exporter's ``Hostname``, ...), else ``node=``.

Parsing: each line goes through ``prometheus_client``'s own parser (``text_fd_to_metric_families``), one
line at a time, so that an error names its line, a counter keeps the name the exporter gave it (the
parser renames counters to OpenMetrics ``_total`` names when it reads ``# TYPE`` lines), and samples stay
in file order. ``prometheus-client`` is a declared dependency (pyproject.toml).
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_fd_to_metric_families

from workers.reliability.telemetry.base import TelemetrySample, counter_increase

MAP_PATH = Path(__file__).resolve().parent / "metric_map.json"
KINDS = ("gauge", "counter", "rate")
IMPORT_ONLY = {
    "npu.{id}.hccs{lane}_crc_errors_count": "npu-exporter reads HCCS link statistics through DCMI; npu-smi's "
    "table and the -t queries the live collector runs do not print them",
    "npu.{id}.link_up": "npu-exporter asks hccn_tool for the NIC link; the live collector does not run hccn_tool",
    "npu.{id}.network_healthy": "npu-exporter asks hccn_tool for network health (see link_up)",
    "npu.{id}.error_code": "the live collector reports a chip's error codes as text in info (npu-smi -t health)",
}
"""Names in the table that no live collector produces, and why: imported history only."""
_SAMPLE_START = re.compile(
    r"[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{|[ \t]+[^ \t])"
)  # a metric name, then labels or a value
_TEMPLATE_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class MetricMapping:
    exporter: str
    ours: str
    kind: str
    source: str
    name: str | None = None
    pattern: re.Pattern | None = None
    scale: float = 1.0

    def match(self, name: str) -> dict[str, str] | None:
        """The named groups when ``name`` is this entry's metric, else None."""
        if self.name is not None:
            return {} if name == self.name else None
        m = self.pattern.match(name) if self.pattern is not None else None
        return m.groupdict() if m else None


@dataclass(frozen=True)
class MetricMap:
    mappings: tuple[MetricMapping, ...]
    exporters: dict[str, dict[str, Any]]
    node_labels: tuple[str, ...]

    def find(self, name: str) -> tuple[MetricMapping, dict[str, str]] | None:
        for m in self.mappings:
            groups = m.match(name)
            if groups is not None:
                return m, groups
        return None


def load_metric_map(path: str | Path = MAP_PATH) -> MetricMap:
    """The mapping table, checked: known kinds, a source on every entry, one of name / pattern."""
    with Path(path).open() as fh:
        raw = json.load(fh)
    mappings = []
    for i, e in enumerate(raw["metrics"]):
        where = f"{path}: metrics[{i}]"
        if e.get("kind") not in KINDS:
            raise ValueError(f"{where}: kind must be one of {KINDS}, got {e.get('kind')!r}")
        if not e.get("source"):
            raise ValueError(f"{where}: every mapping cites its source")
        if ("name" in e) == ("pattern" in e):
            raise ValueError(f"{where}: give exactly one of name and pattern")
        if e["exporter"] not in raw["exporters"]:
            raise ValueError(f"{where}: unknown exporter {e['exporter']!r}")
        mappings.append(
            MetricMapping(
                exporter=e["exporter"],
                ours=e["ours"],
                kind=e["kind"],
                source=e["source"],
                name=e.get("name"),
                pattern=re.compile(e["pattern"]) if "pattern" in e else None,
                scale=float(e.get("scale", 1.0)),
            )
        )
    return MetricMap(tuple(mappings), dict(raw["exporters"]), tuple(raw["node_labels"]))


@dataclass
class ImportResult:
    """Per node, the samples in time order; and what could not be used."""

    samples: dict[str, list[TelemetrySample]]
    unmapped: dict[str, int] = field(default_factory=dict)
    """Exporter metric name -> how many of its samples the table has no mapping for."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Why -> how many samples were left out for that reason (blank values, missing labels, ...)."""
    lines: int = 0

    @property
    def nodes(self) -> list[str]:
        return sorted(self.samples)


@dataclass
class _Point:
    node: str
    t: float
    ours: str
    value: float
    kind: str


def _node_of(labels: dict[str, str], node_labels: Iterable[str], default: str | None) -> str | None:
    for label in node_labels:
        value = labels.get(label)
        if value:
            if label == "instance":
                value = re.sub(r":\d+$", "", value)  # host:port -> host (one node, several exporters)
            return value
    return default


def _parse_line(line: str, lineno: int, source: str):
    """The one sample on a text-format line, through prometheus_client's parser, after the checks it is
    lax about: ``name[{labels}] value [timestamp]``, the timestamp an integer of milliseconds."""
    shown = line.strip()[:120]
    if not _SAMPLE_START.match(line):
        raise ValueError(f"{source}, line {lineno}: not Prometheus text format (no metric name): {shown!r}")
    rest = line[line.rindex("}") + 1 :] if "{" in line and "}" in line else line.split(None, 1)[-1]
    tokens = rest.split()
    if not 1 <= len(tokens) <= 2:
        raise ValueError(
            f"{source}, line {lineno}: not Prometheus text format (expected 'name{{labels}} value "
            f"[timestamp]'): {shown!r}"
        )
    if len(tokens) == 2 and not re.fullmatch(r"-?[0-9]+", tokens[1]):
        raise ValueError(
            f"{source}, line {lineno}: the timestamp must be integer milliseconds, got {tokens[1]!r}: {shown!r}"
        )
    try:
        families = list(text_fd_to_metric_families([line]))
    except Exception as exc:  # the parser raises ValueError, and IndexError on some truncated lines
        raise ValueError(
            f"{source}, line {lineno}: not Prometheus text format ({exc or type(exc).__name__}): {shown!r}"
        ) from None
    samples = [s for f in families for s in f.samples]
    if len(samples) != 1:
        raise ValueError(
            f"{source}, line {lineno}: expected one sample, got {len(samples)}: {line.strip()[:120]!r}"
        )
    return samples[0]


def _check_comment(line: str, lineno: int, source: str) -> None:
    parts = line.split(None, 3)
    if len(parts) >= 2 and parts[1] in ("TYPE", "HELP") and len(parts) < 3:
        raise ValueError(f"{source}, line {lineno}: '# {parts[1]}' without a metric name")
    if len(parts) >= 2 and parts[1] == "TYPE" and len(parts) < 4:
        raise ValueError(f"{source}, line {lineno}: '# TYPE {parts[2]}' without a type")


def import_prometheus_text(
    text: str,
    *,
    default_time: float | None = None,
    node: str | None = None,
    metric_map: MetricMap | None = None,
    source: str = "<text>",
    node_labels: Iterable[str] | None = None,
) -> ImportResult:
    """Samples per node from Prometheus text format (one scrape, or several with timestamps per sample).

    ``default_time`` (Unix seconds) dates lines without a timestamp; ``node`` names the node of samples that
    carry no node label; ``node_labels`` overrides the table's order of labels that name a node (e.g.
    ``("Hostname",)`` to name nodes by host name rather than by scrape address). ``ValueError`` naming the line for text that is not Prometheus text format, a
    sample without a time, or one without a node."""
    table = metric_map or load_metric_map()
    labels_naming_node = tuple(node_labels) if node_labels is not None else table.node_labels
    points: list[_Point] = []
    unmapped: dict[str, int] = defaultdict(int)
    skipped: dict[str, int] = defaultdict(int)
    lines = 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        lines = lineno
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            _check_comment(stripped, lineno, source)
            continue
        sample = _parse_line(stripped, lineno, source)
        found = table.find(sample.name)
        if found is None:
            unmapped[sample.name] += 1
            continue
        mapping, groups = found
        t = sample.timestamp if sample.timestamp is not None else default_time
        if t is None:
            raise ValueError(
                f"{source}, line {lineno}: the sample has no timestamp; pass default_time (the time of the scrape)"
            )
        where = _node_of(sample.labels, labels_naming_node, node)
        if where is None:
            raise ValueError(
                f"{source}, line {lineno}: no node label ({', '.join(labels_naming_node)}) on the sample; "
                "pass node= (the node this scrape came from)"
            )
        exporter = table.exporters[mapping.exporter]
        if any(sample.labels.get(k) in v for k, v in exporter.get("skip_labels", {}).items()):
            skipped[f"{mapping.exporter}: skipped label value"] += 1
            continue
        value = float(sample.value)
        if value in exporter.get("invalid_values", ()):
            skipped[exporter["invalid_reason"]] += 1
            continue
        blank = exporter.get("blank_at_or_above")
        if blank is not None and value >= blank:
            skipped[exporter["blank_reason"]] += 1
            continue
        if not math.isfinite(value):
            skipped["not a finite number (NaN or Inf)"] += 1
            continue
        fields = {**sample.labels, **groups}
        missing = [f for f in _TEMPLATE_FIELD.findall(mapping.ours) if f not in fields]
        if missing:
            skipped[f"{sample.name}: no {', '.join(missing)} label to name the device"] += 1
            continue
        ours = _TEMPLATE_FIELD.sub(lambda m, fields=fields: fields[m.group(1)], mapping.ours)
        points.append(_Point(where, float(t), ours, value * mapping.scale, mapping.kind))
    samples = _to_samples(points, source)
    return ImportResult(samples, dict(unmapped), dict(skipped), lines)


def _to_samples(points: list[_Point], source: str) -> dict[str, list[TelemetrySample]]:
    by_node_time: dict[tuple[str, float], TelemetrySample] = {}

    def sample_at(node: str, t: float) -> TelemetrySample:
        s = by_node_time.get((node, t))
        if s is None:
            s = by_node_time[(node, t)] = TelemetrySample(
                node=node, time_unix_s=t, source=f"prometheus:{source}"
            )
        return s

    series: dict[tuple[str, str], list[_Point]] = defaultdict(list)
    for p in points:
        if p.kind == "rate":
            series[(p.node, p.ours)].append(p)
        else:
            sample_at(p.node, p.t).values[p.ours] = p.value
    for (node, ours), ps in series.items():
        ps.sort(key=lambda p: p.t)
        sample_at(node, ps[0].t).absent[ours] = "first scrape of this counter: a rate needs two"
        for prev, cur in zip(ps, ps[1:], strict=False):
            if cur.t <= prev.t:
                sample_at(node, cur.t).absent[ours] = "two scrapes of this counter at the same time"
                continue
            sample_at(node, cur.t).values[ours] = counter_increase(prev.value, cur.value) / (cur.t - prev.t)
    out: dict[str, list[TelemetrySample]] = defaultdict(list)
    for (node, _), s in sorted(by_node_time.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        out[node].append(s)
    return dict(out)


def import_prometheus_file(
    path: str | Path,
    *,
    default_time: float | None = None,
    node: str | None = None,
    metric_map: MetricMap | None = None,
    node_labels: Iterable[str] | None = None,
) -> ImportResult:
    """:func:`import_prometheus_text` on a file; a single scrape without timestamps is dated by
    ``default_time`` (there is no safe default: a file's modification time is when it was copied)."""
    path = Path(path)
    return import_prometheus_text(
        path.read_text(),
        default_time=default_time,
        node=node,
        metric_map=metric_map,
        source=str(path),
        node_labels=node_labels,
    )
