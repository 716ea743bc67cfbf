"""Node telemetry (pure engine: no Django, no Celery): collectors for the sources present on a node, a
sampler that streams them at a bounded cost, and an import of Prometheus scrapes in the same names.

Sources, each used where present and reported absent with the reason otherwise (never faked):

- :class:`~.host.PsutilCollector`      CPU load / utilisation / steal, frequency, memory, swap, NIC error
                                       and drop rates, disk throughput and busy time, file-system use
- :class:`~.nvml.NvmlCollector`        NVIDIA GPUs: temperature, power, clocks and clock-event (throttle)
                                       reasons, ECC, retired pages / remapped rows, XID events, NVLink
                                       errors, PCIe replays
- :class:`~.npu_smi.NpuSmiCollector`   Ascend NPUs through npu-smi: health, power, temperature, AI Core and
                                       HBM use, HBM ECC
- :class:`~.job.JobSignals`            the job's own signals, fed by the trainer: per-rank step time,
                                       collective wait, heartbeat age
- :func:`~.prometheus.import_prometheus_text`  dcgm-exporter / npu-exporter / node_exporter scrapes and
                                       histories, mapped by one table (``metric_map.json``)

Metric names are ``<scope>.<device>.<metric>`` (``gpu.0.temp_C``, ``net.eth0.rx_errs_per_s``,
``npu.3.hbm_ecc_dbe_count``, ``job.rank2.step_time_p50_s``) or ``<scope>.<metric>`` for the host
(``cpu.util_pct``): the scope is before the first dot, the metric after the last (metrics have no dots),
the device in between (it may contain dots, e.g. a VLAN interface). The metric ends with its unit: ``_C``,
``_W``, ``_MHz``, ``_pct``, ``_GiB``, ``_Bps`` (bytes/s), ``_per_s``, ``_count`` (cumulative), ``_s``; 0/1
flags, bitmasks and codes have none. Each collector lists its names in ``METRICS``.
"""

from workers.reliability.telemetry.base import Collector, CounterRates, Reading, TelemetrySample
from workers.reliability.telemetry.host import PsutilCollector
from workers.reliability.telemetry.job import JobSignals
from workers.reliability.telemetry.npu_smi import NpuSmiCollector
from workers.reliability.telemetry.nvml import NvmlCollector, decode_clock_event_reasons
from workers.reliability.telemetry.prometheus import (
    ImportResult,
    import_prometheus_file,
    import_prometheus_text,
    load_metric_map,
)
from workers.reliability.telemetry.sampler import TelemetrySampler, collectors_for_node


def split_metric(name: str) -> tuple[str, str | None, str]:
    """``(scope, device or None, metric)`` of a metric name (see the module docstring)."""
    scope, _, rest = name.partition(".")
    if not rest:
        raise ValueError(f"a metric name is <scope>.<metric> or <scope>.<device>.<metric>, got {name!r}")
    device, _, metric = rest.rpartition(".")
    return scope, device or None, metric


__all__ = [
    "Collector",
    "CounterRates",
    "ImportResult",
    "JobSignals",
    "NpuSmiCollector",
    "NvmlCollector",
    "PsutilCollector",
    "Reading",
    "TelemetrySample",
    "TelemetrySampler",
    "collectors_for_node",
    "decode_clock_event_reasons",
    "import_prometheus_file",
    "import_prometheus_text",
    "load_metric_map",
    "split_metric",
]
