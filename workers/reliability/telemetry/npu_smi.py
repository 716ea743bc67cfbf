"""Huawei Ascend NPUs through ``npu-smi`` (installed with the Ascend driver as ``/usr/local/bin/npu-smi``).

One ``npu-smi info`` per sample gives every chip's health, power, temperature, AI Core use and HBM use
(:func:`parse_npu_smi_info`); ``npu-smi info -t ecc -i <npu> -c <chip>`` gives the HBM ECC counters
(:func:`parse_npu_smi_ecc`), read every ``ecc_every`` samples to bound the cost (one process per chip);
``npu-smi info -t health -i <npu> -c <chip>`` gives the error codes of a chip whose health is not OK
(:func:`parse_npu_smi_health`). ``-t temp`` and ``-t power`` have parsers too (:func:`parse_npu_smi_temperature`,
and :func:`~workers.devices.npu_smi.parse_npu_smi_power`, which the power meter uses).

Running npu-smi and reading its outputs is the engines' npu-smi adapter, :mod:`workers.devices.npu_smi`
(formats and their sources there); the parsers are importable from here as well.

Chips are named by their logic id (what ``ASCEND_RT_VISIBLE_DEVICES`` and npu-exporter's ``id`` label
use), found through ``npu-smi info -m``; the metrics per chip are in :data:`METRICS`.
"""

from __future__ import annotations

from workers.devices.npu_smi import (
    ECC_LABELS,
    NpuChipRow,
    NpuHealth,
    NpuSmi,
    NpuSmiInfo,
    NpuSmiUnavailable,
    chip_query,
    parse_npu_smi_ecc,
    parse_npu_smi_health,
    parse_npu_smi_info,
    parse_npu_smi_key_values,
    parse_npu_smi_mapping,
    parse_npu_smi_temperature,
)
from workers.reliability.telemetry.base import Collector, Reading

METRICS = tuple(
    "npu.{id}." + m
    for m in (
        "health",
        "power_W",
        "temp_C",
        "aicore_util_pct",
        "hbm_used_GiB",
        "hbm_total_GiB",
        "mem_used_GiB",
        "mem_total_GiB",
        *(
            f"{mem}_ecc_{bits}_{what}"
            for mem in ("hbm", "ddr")
            for bits in ("sbe", "dbe")
            for what in ("count", "aggregate_count", "isolated_pages_count")
        ),
    )
)
"""Every metric this collector reports per chip (``health``: 1 when npu-smi says OK, 0 for any other state,
as npu-exporter's npu_chip_info_health_status)."""
MIB_PER_GIB = 1024.0


class NpuSmiCollector(Collector):
    """Health, power, temperature, AI Core and HBM use, and HBM ECC counters of this node's Ascend chips."""

    name = "npu-smi"

    def __init__(self, *, executable: str = "npu-smi", ecc_every: int = 6, timeout_s: float = 10.0):
        if ecc_every < 1:
            raise ValueError(f"ecc_every must be >= 1 sample, got {ecc_every}")
        self.ecc_every, self.timeout_s = int(ecc_every), float(timeout_s)
        self.samples = 0
        self._why = ""
        self.logic: dict[tuple[int, int], int] = {}
        self.index_source = ""
        self.executable: str | None = None
        try:
            self._tool = NpuSmi(executable, timeout_s=self.timeout_s)
        except NpuSmiUnavailable as exc:
            self._why = str(exc)
            return
        self.executable = self._tool.executable
        mapping = self._tool.chip_mapping()
        self.logic = {pair: logic for logic, pair in mapping.items()}
        self.index_source = (
            "logic ids from npu-smi info -m" if self.logic else "npu-smi info -m unreadable: NPU ids used"
        )
        try:
            parse_npu_smi_info(self._tool.run(["info"]))
        except (NpuSmiUnavailable, ValueError) as exc:
            self._why = f"npu-smi info is not usable here: {exc}"

    def available(self) -> tuple[bool, str]:
        if self._why:
            return False, self._why
        return True, f"{self.executable} ({self.index_source})"

    def _chip_index(self, chip: NpuChipRow) -> int:
        return self.logic.get((chip.npu_id, chip.chip_id), chip.npu_id)

    def sample(self) -> Reading:
        r = Reading()
        self.samples += 1
        try:
            table = parse_npu_smi_info(self._tool.run(["info"]))
        except (NpuSmiUnavailable, ValueError) as exc:
            r.absent["npu"] = str(exc)
            return r
        r.info["npu.npu_smi_version"] = table.version
        read_ecc = (self.samples - 1) % self.ecc_every == 0
        for chip in table.chips:
            p = f"npu.{self._chip_index(chip)}."
            r.info[p + "name"] = chip.name
            r.info[p + "health_status"] = chip.health
            health = NpuHealth(chip.health, [], "").healthy
            r.put(p + "health", None if health is None else int(health), why_absent="npu-smi shows health NA")
            r.put(p + "power_W", chip.power_W, why_absent="npu-smi shows no power for this chip (NA)")
            r.put(p + "temp_C", chip.temp_C, why_absent="npu-smi shows no temperature for this chip (NA)")
            r.put(p + "aicore_util_pct", chip.aicore_pct, why_absent="npu-smi shows no AI Core use (NA)")
            for column, prefix in (("HBM-Usage", "hbm"), ("Memory-Usage", "mem")):
                pair = chip.usage_MB.get(column)
                if pair is not None and pair[1] > 0:  # "0 / 0": the chip has no such memory
                    r.put(p + f"{prefix}_used_GiB", pair[0] / MIB_PER_GIB)
                    r.put(p + f"{prefix}_total_GiB", pair[1] / MIB_PER_GIB)
            if health is False:
                self._health_detail(chip, p, r)
            if read_ecc:
                self._ecc(chip, p, r)
            else:
                r.absent[p + "hbm_ecc"] = (
                    f"ECC counters are read every {self.ecc_every} samples (bounded cost)"
                )
        return r

    def _health_detail(self, chip: NpuChipRow, p: str, r: Reading) -> None:
        errors = []
        for args in chip_query("health", chip.npu_id, chip.chip_id):
            try:
                health = parse_npu_smi_health(self._tool.run(args))
            except (NpuSmiUnavailable, ValueError) as exc:
                errors.append(str(exc))
                continue
            r.info[p + "error_codes"] = health.error_codes
            r.info[p + "error_information"] = health.error_information
            return
        r.info[p + "error_codes_unreadable"] = "; ".join(errors)

    def _ecc(self, chip: NpuChipRow, p: str, r: Reading) -> None:
        errors = []
        for args in chip_query("ecc", chip.npu_id, chip.chip_id):
            try:
                counts = parse_npu_smi_ecc(self._tool.run(args))
            except (NpuSmiUnavailable, ValueError) as exc:
                errors.append(str(exc))
                continue
            for metric, count in counts.items():
                r.put(p + metric, count)
            return
        r.absent[p + "hbm_ecc"] = "; ".join(errors)


__all__ = [
    "ECC_LABELS",
    "METRICS",
    "MIB_PER_GIB",
    "NpuChipRow",
    "NpuHealth",
    "NpuSmiCollector",
    "NpuSmiInfo",
    "parse_npu_smi_ecc",
    "parse_npu_smi_health",
    "parse_npu_smi_info",
    "parse_npu_smi_key_values",
    "parse_npu_smi_mapping",
    "parse_npu_smi_temperature",
]
