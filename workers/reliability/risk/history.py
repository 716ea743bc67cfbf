"""A cluster's own history to train and evaluate on: telemetry from a Prometheus text dump (dcgm-exporter,
npu-exporter, node_exporter, or Prometheus's ``/federate`` output, read by
:mod:`workers.reliability.telemetry.prometheus` with per-sample timestamps) and failures from an incident
list.

The incident list is CSV with a header naming at least ``node,time,kind`` (other columns are kept out):
``node`` as the dump names it (the ``instance`` label without its port, or ``Hostname``), ``time`` in ISO 8601
with a zone (``2026-01-01T00:28:00Z``) or Unix seconds, ``kind`` free text (a key of
``simulator.KINDS`` where one fits, e.g. ``gpu_hbm3``). Lines starting with ``#`` are comments.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from workers.reliability.risk.traces import Failure, NodeTrace, TraceSet
from workers.reliability.telemetry.prometheus import import_prometheus_file

INCIDENT_COLUMNS = ("node", "time", "kind")


def parse_incident_time(text: str) -> float:
    """Unix seconds from ISO 8601 with a zone, or from a number of Unix seconds."""
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(value):
            raise ValueError(f"time {text!r} is not a finite number")
        return value
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"time {text!r} is neither ISO 8601 (2026-01-01T00:28:00Z) nor Unix seconds"
        ) from None
    if when.tzinfo is None:
        raise ValueError(f"time {text!r} has no time zone: add Z (UTC) or an offset such as +08:00")
    return when.timestamp()


def incident_rows(text: str, *, source: str = "incidents") -> list[tuple[int, Failure]]:
    """``(line number, incident)`` of each data line of an incident list's text (see the module docstring);
    ``ValueError`` naming ``source`` and the line otherwise. Each line is one record (no field spans lines)."""
    rows = [
        (i, line)
        for i, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not rows:
        raise ValueError(f"{source}: no header line (expected {','.join(INCIDENT_COLUMNS)})")

    def fields_of(lineno: int, line: str) -> list[str]:
        try:
            return next(csv.reader([line]))
        except csv.Error as exc:
            raise ValueError(f"{source}, line {lineno}: not a CSV line ({exc})") from None

    header = [h.strip().lower() for h in fields_of(*rows[0])]
    missing = [c for c in INCIDENT_COLUMNS if c not in header]
    if missing:
        raise ValueError(
            f"{source}, line {rows[0][0]}: the header must name {', '.join(INCIDENT_COLUMNS)}; "
            f"missing {', '.join(missing)}"
        )
    col = {c: header.index(c) for c in INCIDENT_COLUMNS}
    out = []
    for lineno, line in rows[1:]:
        fields = fields_of(lineno, line)
        if len(fields) < len(header):
            raise ValueError(f"{source}, line {lineno}: {len(fields)} fields, the header has {len(header)}")
        node, when, kind = (fields[col[c]].strip() for c in INCIDENT_COLUMNS)
        if not node or not kind:
            raise ValueError(f"{source}, line {lineno}: node and kind must not be empty")
        try:
            t = parse_incident_time(when)
        except ValueError as exc:
            raise ValueError(f"{source}, line {lineno}: {exc}") from None
        out.append((lineno, Failure(node=node, time_unix_s=t, kind=kind)))
    return out


def load_incidents(path: str | Path) -> list[Failure]:
    """The incidents of a CSV file (see the module docstring); ``ValueError`` naming the line otherwise."""
    path = Path(path)
    return [failure for _, failure in incident_rows(path.read_text(), source=str(path))]


def traces_from_prometheus(
    dump: str | Path,
    incidents: str | Path | None = None,
    *,
    default_time: float | None = None,
    node_labels: Iterable[str] | None = None,
) -> TraceSet:
    """Per-node traces from a Prometheus text dump, with the incident list's failures (none without one)."""
    dump = Path(dump)
    result = import_prometheus_file(dump, default_time=default_time, node_labels=node_labels)
    if not result.samples:
        raise ValueError(
            f"{dump}: no sample of a metric the telemetry map knows (unmapped: {result.unmapped})"
        )
    traces = [NodeTrace.from_samples(node, samples) for node, samples in sorted(result.samples.items())]
    failures = load_incidents(incidents) if incidents is not None else []
    known = {t.node for t in traces}
    unknown = sorted({f.node for f in failures} - known)
    if unknown:
        raise ValueError(
            f"{incidents}: incidents on nodes the dump has no samples of: {', '.join(unknown[:5])} "
            f"(the dump's nodes: {', '.join(sorted(known)[:10])})"
        )
    description = {
        "source": "imported Prometheus history",
        "traces": dump.name,
        "incidents": Path(incidents).name if incidents is not None else None,
        "unmapped_metrics": len(result.unmapped),
        "skipped_samples": result.skipped,
    }
    return TraceSet(traces, failures, description)


def write_incidents(failures: list[Failure], path: str | Path) -> Path:
    """The failures as an incident list (what ``faults simulate --incidents`` writes)."""
    path = Path(path)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(INCIDENT_COLUMNS)
        for f in sorted(failures, key=lambda f: (f.time_unix_s, f.node)):
            iso = (
                datetime.fromtimestamp(f.time_unix_s, UTC)
                .isoformat(timespec="seconds")
                .replace("+00:00", "Z")
            )
            w.writerow([f.node, iso, f.kind])
    return path
