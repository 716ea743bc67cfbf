"""NVIDIA GPUs through NVML (``nvidia-ml-py``, imported as ``pynvml``), on the engines' NVML adapter
(:class:`workers.devices.nvml.NvmlSession`: initialisation, devices, temperature, power; the health queries
below through its ``nv``).

Every NVML call is guarded on its own: a GPU or driver that does not support a query
(``NVMLError_NotSupported``: retired pages on Ampere and newer, which remap rows instead; NVLink counters on
a PCIe card; ECC on a board with ECC off) leaves that metric absent with NVML's reason, and the rest of the
sample goes on.

Per GPU ``i`` (NVML's index, which is DCGM's ``gpu`` label) the metrics in :data:`METRICS`; ``info``
carries each GPU's name, the decoded clock-event reasons and the XID events seen (with NVIDIA's description).
"""

from __future__ import annotations

from typing import Any

from workers.devices.nvml import NvmlSession, NvmlUnavailable
from workers.reliability.telemetry.base import Collector, Reading

METRICS = tuple(
    "gpu.{gpu}." + m
    for m in (
        "temp_C",
        "mem_temp_C",
        "power_W",
        "sm_clock_MHz",
        "mem_clock_MHz",
        "util_pct",
        "mem_used_GiB",
        "clocks_event_reasons",
        "throttle_thermal",
        "throttle_power",
        "ecc_sbe_volatile_count",
        "ecc_dbe_volatile_count",
        "ecc_sbe_aggregate_count",
        "ecc_dbe_aggregate_count",
        "retired_pages_sbe_count",
        "retired_pages_dbe_count",
        "retired_pages_pending",
        "remapped_rows_correctable_count",
        "remapped_rows_uncorrectable_count",
        "row_remap_pending",
        "row_remap_failure",
        "xid_events_count",
        "xid_last",
        "nvlink_crc_flit_errors_count",
        "nvlink_crc_data_errors_count",
        "nvlink_replay_errors_count",
        "nvlink_recovery_errors_count",
        "pcie_replay_count",
    )
)
"""Every metric this collector reports per GPU (``xid_last``: the last XID code seen since the collector
started, 0 for none, as DCGM's DCGM_FI_DEV_XID_ERRORS; ``throttle_*``: 0/1 flags from the reasons mask)."""
GIB = float(1 << 30)

# nvmlClocksEventReason* bits (nvml.h; the older nvmlClocksThrottleReason* names have the same values),
# lowest bit first, with the names we report. ``nvidia-smi -q -d PERFORMANCE`` prints the same list.
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
# reasons that mean the GPU runs slower than it could because of heat or of its power limit (hw_slowdown
# can be either, so it only shows in the mask and the decoded names; gpu_idle and clock settings are not
# slowdowns a job would notice as a fault)
THERMAL_REASONS = 0x020 | 0x040
POWER_REASONS = 0x004 | 0x080


def decode_clock_event_reasons(mask: int) -> list[str]:
    """The names of the reasons set in an NVML/DCGM clock-event (throttle) bitmask, lowest bit first;
    bits NVML does not document come out as ``unknown_0x...``."""
    mask = int(mask)
    if mask < 0:
        raise ValueError(f"a clock-event reason bitmask is never negative, got {mask}")
    names = [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]
    known = 0
    for bit, _ in CLOCK_EVENT_REASONS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"unknown_{bit:#x}")
            rest &= ~bit
        bit <<= 1
    return names


# Critical XIDs a training job meets, from NVIDIA's "Xid Errors" catalog (docs.nvidia.com/deploy/xid-errors).
XID_DESCRIPTIONS: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def describe_xid(xid: int) -> str:
    return XID_DESCRIPTIONS.get(int(xid), "see NVIDIA's Xid catalog")


# NVML field ids read in one nvmlDeviceGetFieldValues call (nvml.h NVML_FI_DEV_*): the NVLink error totals
# over all links (what dcgm-exporter's DCGM_FI_DEV_NVLINK_*_TOTAL report) and the memory temperature.
NVLINK_FIELDS: dict[str, str] = {
    "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "nvlink_crc_flit_errors_count",
    "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "nvlink_crc_data_errors_count",
    "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "nvlink_replay_errors_count",
    "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "nvlink_recovery_errors_count",
}
MAX_EVENTS_PER_SAMPLE = 256
"""XID events drained per sample at most (each is one non-blocking NVML call): bounds the cost of a storm."""


def field_value(fv, nv) -> float:
    """The number in an ``nvmlFieldValue_t`` according to its ``valueType``."""
    kind = fv.valueType
    attr = {
        nv.NVML_VALUE_TYPE_DOUBLE: "dVal",
        nv.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        nv.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        nv.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        getattr(nv, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "usVal",
    }.get(kind)
    if attr is None:
        raise ValueError(f"NVML field {fv.fieldId} has an unknown value type {kind}")
    return float(getattr(fv.value, attr))


def _nvml_reason(exc: Exception) -> str:
    return f"NVML: {exc}"


class NvmlCollector(Collector):
    """Health and thermal telemetry of this node's NVIDIA GPUs (all of them, or NVML ``indices``)."""

    name = "nvml"

    def __init__(self, indices: list[int] | None = None):
        self._nv: Any = None
        self._session: NvmlSession | None = None
        self._ok = False
        self._why = ""
        self._event_set = None
        self.gpus: list[dict[str, Any]] = []
        self.xid_counts: dict[int, int] = {}
        self.xid_last: dict[int, int] = {}
        self._xid_absent = ""
        try:
            session = NvmlSession()
        except NvmlUnavailable as exc:
            self._why = str(exc)
            return
        self._session, self._nv = session, session.nv
        try:
            count = session.device_count()
            chosen = list(range(count)) if indices is None else list(indices)
            for i in chosen:
                if not 0 <= i < count:
                    raise ValueError(f"NVML has {count} GPU(s); index {i} is not one of them")
                handle = session.handle(i)
                self.gpus.append({"index": i, "handle": handle, "name": session.name(handle)})
        except Exception:
            session.close()
            raise
        if not self.gpus:
            session.close()
            self._why = "NVML initialised but this node has no NVIDIA GPU"
            return
        self._ok = True
        self._register_xid_events()

    def available(self) -> tuple[bool, str]:
        if not self._ok:
            return False, self._why
        return True, f"NVML, driver {self._session.driver_version()}, {len(self.gpus)} GPU(s)"

    # -------------------------------------------------------------------------------------------- XIDs

    def _register_xid_events(self) -> None:
        nv = self._nv
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            self._xid_absent = f"cannot create an NVML event set: {exc}"
            return
        registered = 0
        why: list[str] = []
        for g in self.gpus:
            try:
                nv.nvmlDeviceRegisterEvents(g["handle"], nv.nvmlEventTypeXidCriticalError, self._event_set)
                g["xid_events"] = True
                registered += 1
                self.xid_counts[g["index"]] = 0
                self.xid_last[g["index"]] = 0
            except nv.NVMLError as exc:
                g["xid_events"] = False
                why.append(f"gpu {g['index']}: {exc}")
        if not registered:
            self._xid_absent = "XID critical-error events cannot be registered: " + "; ".join(why)

    def _drain_xid_events(self, r: Reading) -> None:
        nv = self._nv
        if self._event_set is None:
            return
        seen = 0
        while seen < MAX_EVENTS_PER_SAMPLE:
            try:
                data = nv.nvmlEventSetWait_v2(self._event_set, 0)  # 0 ms: never blocks the sampler
            except nv.NVMLError_Timeout:
                break
            except nv.NVMLError as exc:
                r.absent["gpu.xid"] = f"reading XID events failed: {exc}"
                break
            seen += 1
            if data.eventType != nv.nvmlEventTypeXidCriticalError:
                continue
            try:
                index = nv.nvmlDeviceGetIndex(data.device)
            except nv.NVMLError:
                continue
            xid = int(data.eventData)
            self.xid_counts[index] = self.xid_counts.get(index, 0) + 1
            self.xid_last[index] = xid
            r.info.setdefault("gpu.xid_events", []).append(
                {"gpu": index, "xid": xid, "description": describe_xid(xid)}
            )
        if seen >= MAX_EVENTS_PER_SAMPLE:
            r.info["gpu.xid_events_truncated"] = f"more than {MAX_EVENTS_PER_SAMPLE} events this sample"

    # ------------------------------------------------------------------------------------------ sample

    def sample(self) -> Reading:
        r = Reading()
        self._drain_xid_events(r)
        for g in self.gpus:
            self._sample_gpu(g, r)
        return r

    def _call(self, r: Reading, metric: str, fn, *args):
        """``fn(*args)``, or None with ``metric`` recorded absent (NVML's reason) when NVML refuses."""
        nv = self._nv
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            r.absent[metric] = _nvml_reason(exc)
            return None

    def _sample_gpu(self, g: dict[str, Any], r: Reading) -> None:
        nv, h, p = self._nv, g["handle"], f"gpu.{g['index']}."
        r.info[p + "name"] = g["name"]
        temp = self._call(r, p + "temp_C", self._session.temperature_c, h)
        if temp is not None:
            r.put(p + "temp_C", temp)
        mw = self._call(r, p + "power_W", self._session.power_mw, h)
        if mw is not None:
            r.put(p + "power_W", mw / 1000.0)
        for clock, metric in ((nv.NVML_CLOCK_SM, "sm_clock_MHz"), (nv.NVML_CLOCK_MEM, "mem_clock_MHz")):
            mhz = self._call(r, p + metric, nv.nvmlDeviceGetClockInfo, h, clock)
            if mhz is not None:
                r.put(p + metric, mhz)
        util = self._call(r, p + "util_pct", nv.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            r.put(p + "util_pct", util.gpu)
        mem = self._call(r, p + "mem_used_GiB", nv.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            r.put(p + "mem_used_GiB", mem.used / GIB)
        self._throttle(g, r)
        self._ecc(g, r)
        self._retired_and_remapped(g, r)
        self._fields(g, r)
        replays = self._call(r, p + "pcie_replay_count", nv.nvmlDeviceGetPcieReplayCounter, h)
        if replays is not None:
            r.put(p + "pcie_replay_count", replays)
        if g.get("xid_events"):
            r.put(p + "xid_events_count", self.xid_counts.get(g["index"], 0))
            r.put(p + "xid_last", self.xid_last.get(g["index"], 0))
        else:
            why = self._xid_absent or "XID events could not be registered for this GPU"
            r.absent[p + "xid_events_count"] = why
            r.absent[p + "xid_last"] = why

    def _throttle(self, g: dict[str, Any], r: Reading) -> None:
        nv, h, p = self._nv, g["handle"], f"gpu.{g['index']}."
        # the ClocksEvent name since driver 535; older nvidia-ml-py has only the Throttle one
        fn = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        mask = self._call(r, p + "clocks_event_reasons", fn, h)
        if mask is None:
            for flag in ("throttle_thermal", "throttle_power"):
                r.absent[p + flag] = r.absent[p + "clocks_event_reasons"]
            return
        r.put(p + "clocks_event_reasons", mask)
        r.put(p + "throttle_thermal", 1 if mask & THERMAL_REASONS else 0)
        r.put(p + "throttle_power", 1 if mask & POWER_REASONS else 0)
        r.info[p + "clocks_event_reasons"] = decode_clock_event_reasons(mask)

    def _ecc(self, g: dict[str, Any], r: Reading) -> None:
        nv, h, p = self._nv, g["handle"], f"gpu.{g['index']}."
        for error, bits in (
            (nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, "sbe"),
            (nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "dbe"),
        ):
            for counter, scope in ((nv.NVML_VOLATILE_ECC, "volatile"), (nv.NVML_AGGREGATE_ECC, "aggregate")):
                metric = f"{p}ecc_{bits}_{scope}_count"
                count = self._call(r, metric, nv.nvmlDeviceGetTotalEccErrors, h, error, counter)
                if count is not None:
                    r.put(metric, count)

    def _retired_and_remapped(self, g: dict[str, Any], r: Reading) -> None:
        nv, h, p = self._nv, g["handle"], f"gpu.{g['index']}."
        for cause, metric in (
            (nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, "retired_pages_sbe_count"),
            (nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, "retired_pages_dbe_count"),
        ):
            pages = self._call(r, p + metric, nv.nvmlDeviceGetRetiredPages, h, cause)
            if pages is not None:
                r.put(p + metric, len(pages))
        pending = self._call(r, p + "retired_pages_pending", nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
        if pending is not None:
            r.put(p + "retired_pages_pending", 1 if pending else 0)
        rows = self._call(r, p + "remapped_rows", nv.nvmlDeviceGetRemappedRows, h)
        names = (
            "remapped_rows_correctable_count",
            "remapped_rows_uncorrectable_count",
            "row_remap_pending",
            "row_remap_failure",
        )
        if rows is None:
            why = r.absent.pop(p + "remapped_rows")
            for n in names:
                r.absent[p + n] = why
            return
        for n, v in zip(names, rows, strict=True):
            r.put(p + n, v)

    def _fields(self, g: dict[str, Any], r: Reading) -> None:
        nv, h, p = self._nv, g["handle"], f"gpu.{g['index']}."
        wanted = {getattr(nv, k): v for k, v in NVLINK_FIELDS.items()}
        wanted[nv.NVML_FI_DEV_MEMORY_TEMP] = "mem_temp_C"
        ids = list(wanted)
        values = self._call(r, p + "fields", nv.nvmlDeviceGetFieldValues, h, ids)
        if values is None:
            why = r.absent.pop(p + "fields")
            for metric in wanted.values():
                r.absent[p + metric] = why
            return
        for fv in values:
            metric = wanted.get(fv.fieldId)
            if metric is None:
                continue
            if fv.nvmlReturn != nv.NVML_SUCCESS:
                r.absent[p + metric] = _nvml_reason(nv.NVMLError(fv.nvmlReturn))
                continue
            r.put(p + metric, field_value(fv, nv))

    def close(self) -> None:
        nv = self._nv
        if not self._ok:
            return
        self._ok = False
        if self._event_set is not None:
            try:
                nv.nvmlEventSetFree(self._event_set)
            except nv.NVMLError:
                pass
            self._event_set = None
        self._session.close()
        self._why = "closed"
