"""Huawei Ascend NPUs through ``npu-smi`` (installed with the Ascend driver as ``/usr/local/bin/npu-smi``).

One ``npu-smi info`` per sample gives every chip's health, power, temperature, AI Core use and HBM use
(:func:`parse_npu_smi_info`); ``npu-smi info -t ecc -i <npu> -c <chip>`` gives the HBM ECC counters
(:func:`parse_npu_smi_ecc`), read every ``ecc_every`` samples to bound the cost (one process per chip);
``npu-smi info -t health -i <npu> -c <chip>`` gives the error codes of a chip whose health is not OK
(:func:`parse_npu_smi_health`). ``-t temp`` and ``-t power`` have parsers too (:func:`parse_npu_smi_temperature`,
and :func:`workers.green.power.parse_npu_smi_power`, which the power meter uses).

Formats: Huawei's npu-smi command reference (support.huawei.com, "npu-smi info" for Atlas A2 / 310P) and
npu-smi's own print functions, which write ``key : value`` lines as ``"\\t%-30s : %s\\n"`` (``%-40s`` for
the ECC counters); the ``npu-smi info`` table as printed by npu-smi 23.0.x. Recorded samples are in
``tests/data/telemetry`` with their provenance.

Chips are named by their logic id (what ``ASCEND_RT_VISIBLE_DEVICES`` and npu-exporter's ``id`` label
use), found through ``npu-smi info -m``; the metrics per chip are in :data:`METRICS`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field

from workers.green.power import parse_npu_smi_mapping
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
_KEY_VALUE = re.compile(r"^\s*([^:]*?)\s*:\s*(.*?)\s*$")
_NPU_ROW = re.compile(r"^(\d+)\s+(\S.*)$")  # "0     910B2"
_CHIP_ROW = re.compile(r"^(\d+)(?:\s+(\d+))?$")  # "0" or "0       0" (chip id, device / phy id)
_BUS_ID = re.compile(
    r"^(?:[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]|NA)$"
)  # or NA (no PCIe)
_PAIR = re.compile(r"(\d+)\s*/\s*(\d+)")
_VERSION = re.compile(r"npu-smi\s+(\S+)")


def parse_npu_smi_key_values(text: str) -> list[tuple[str, str]]:
    """``key : value`` lines in order. A line with an empty key continues the previous value (npu-smi
    prints a second error description as ``"\\t%-30s : %s"`` with a blank key); joined with ``"; "``."""
    fields: list[tuple[str, str]] = []
    for line in text.splitlines():
        m = _KEY_VALUE.match(line)
        if not m:
            continue
        key, value = m.group(1), m.group(2)
        if key == "" and fields:
            fields[-1] = (fields[-1][0], f"{fields[-1][1]}; {value}" if fields[-1][1] else value)
        elif key:
            fields.append((key, value))
    return fields


def _first(fields: list[tuple[str, str]], *keys: str) -> tuple[str, str] | None:
    for want in keys:
        for key, value in fields:
            if key == want:
                return key, value
    return None


@dataclass(frozen=True)
class NpuHealth:
    status: str
    """npu-smi's word: ``OK``, ``Warning``, ``Alarm``, ``Critical``, or ``NA`` (not readable, e.g. a vNPU)."""
    error_codes: list[str]
    error_information: str

    @property
    def healthy(self) -> bool | None:
        """True for OK, False for any other state, None when npu-smi says NA."""
        if self.status.upper() == "NA":
            return None
        return self.status.upper() == "OK"


def parse_npu_smi_health(text: str) -> NpuHealth:
    """``npu-smi info -t health -i <npu> [-c <chip>]``: ``Health Status``, ``Error Code`` (hex codes, or NA),
    ``Error Information``. ``ValueError`` when there is no health line (an error message instead)."""
    fields = parse_npu_smi_key_values(text)
    status = _first(fields, "Health Status", "Health")
    if status is None:
        raise ValueError(f"no 'Health Status' line in npu-smi output: {text.strip().splitlines()[:2]!r}")
    codes = _first(fields, "Error Code")
    code_text = codes[1] if codes else "NA"
    info = _first(fields, "Error Information")
    return NpuHealth(
        status=status[1],
        error_codes=[] if code_text.upper() == "NA" else code_text.split(),
        error_information="" if info is None or info[1].upper() == "NA" else info[1],
    )


def parse_npu_smi_temperature(text: str) -> float:
    """``npu-smi info -t temp -i <npu> [-c <chip>]``: ``NPU Temperature (C)`` on servers, ``Temperature (C)``
    elsewhere (npu-smi's print_chip_temp_info). ``ValueError`` when absent or NA."""
    found = _first(parse_npu_smi_key_values(text), "NPU Temperature (C)", "Temperature (C)")
    if found is None:
        raise ValueError(f"no temperature line in npu-smi output: {text.strip().splitlines()[:2]!r}")
    try:
        return float(found[1])
    except ValueError:
        raise ValueError(f"npu-smi reports {found[0]} as {found[1]!r}: no temperature available") from None


# ``npu-smi info -t ecc`` labels (npu-smi's printf_hbm_ecc_info / DDR equivalent) -> our metric suffix
ECC_LABELS: dict[str, str] = {}
for _mem in ("HBM", "DDR"):
    for _bits, _short in (("Single", "sbe"), ("Double", "dbe")):
        ECC_LABELS[f"{_mem} {_bits} Bit Error Count"] = f"{_mem.lower()}_ecc_{_short}_count"
        ECC_LABELS[f"{_mem} {_bits} Bit Aggregate Total Err Cnt"] = (
            f"{_mem.lower()}_ecc_{_short}_aggregate_count"
        )
        ECC_LABELS[f"{_mem} {_bits} Bit Isolated Pages Count"] = (
            f"{_mem.lower()}_ecc_{_short}_isolated_pages_count"
        )


def parse_npu_smi_ecc(text: str) -> dict[str, int]:
    """``npu-smi info -t ecc -i <npu> [-c <chip>]`` as ``{metric suffix: count}`` (``hbm_ecc_dbe_count`` ...);
    counters shown as NA are left out. ``ValueError`` when no ECC counter is in the output."""
    out: dict[str, int] = {}
    labelled = False
    for key, value in parse_npu_smi_key_values(text):
        metric = ECC_LABELS.get(key)
        labelled = labelled or metric is not None
        if metric is not None and value.isdigit():
            out[metric] = int(value)
    if not labelled:
        raise ValueError(f"no ECC counter in npu-smi output: {text.strip().splitlines()[:2]!r}")
    return out


@dataclass
class NpuChipRow:
    """One chip in the ``npu-smi info`` table."""

    npu_id: int
    chip_id: int
    name: str
    health: str
    power_W: float | None
    temp_C: float | None
    bus_id: str
    aicore_pct: float | None
    usage_MB: dict[str, tuple[int, int]] = field(default_factory=dict)
    """``{"Memory-Usage": (used, total), "HBM-Usage": (used, total)}`` as the table shows them (MB = MiB)."""


@dataclass
class NpuSmiInfo:
    version: str | None
    chips: list[NpuChipRow]


def _number(token: str) -> float | None:
    try:
        return float(token)
    except ValueError:
        return None  # "NA", "-": not available


def parse_npu_smi_info(text: str) -> NpuSmiInfo:
    """The ``npu-smi info`` table: per chip, the NPU row (``NPU  Name | Health | Power(W)  Temp(C) ...``)
    and the chip row under it (``Chip [Device] | Bus-Id | AICore(%)  Memory-Usage(MB)  [HBM-Usage(MB)]``).
    The process table after it is ignored. ``ValueError`` when no chip is found."""
    version = None
    usage_columns: list[str] = []
    chips: list[NpuChipRow] = []
    npu: tuple[int, str, str, float | None, float | None] | None = None
    for line in text.splitlines():
        line = line.strip()
        if "Process id" in line:
            break
        if version is None and (m := _VERSION.search(line)):
            version = m.group(1)
            continue
        if not (line.startswith("|") and line.endswith("|")):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) < 3:
            continue
        if "AICore(%)" in cells[2]:
            usage_columns = re.findall(r"(Memory-Usage|HBM-Usage)\(MB\)", cells[2])
            continue
        # a chip row: digits only ("0", or "0       0" with a device id), then a bus id; tested first, as
        # "0       0" would also read as an NPU row (NPU 0 named "0")
        if npu is not None and (m := _CHIP_ROW.match(cells[0])) and _BUS_ID.match(cells[1]):
            tokens = cells[2].split()
            pairs = [(int(a), int(b)) for a, b in _PAIR.findall(cells[2])]
            names = usage_columns or ["Memory-Usage", "HBM-Usage"]
            npu_id, name, health, power, temp = npu
            chips.append(
                NpuChipRow(
                    npu_id=npu_id,
                    chip_id=int(m.group(1)),
                    name=name,
                    health=health,
                    power_W=power,
                    temp_C=temp,
                    bus_id=cells[1],
                    aicore_pct=_number(tokens[0]) if tokens else None,
                    usage_MB=dict(zip(names, pairs, strict=False)),
                )
            )
            continue
        if (m := _NPU_ROW.match(cells[0])) and re.fullmatch(r"[A-Za-z]+", cells[1]):
            tokens = cells[2].split()
            npu = (
                int(m.group(1)),
                m.group(2).strip(),
                cells[1],
                _number(tokens[0]) if tokens else None,
                _number(tokens[1]) if len(tokens) > 1 else None,
            )
    if not chips:
        raise ValueError(f"no NPU in the npu-smi info table: {text.strip().splitlines()[:3]!r}")
    return NpuSmiInfo(version, chips)


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
        path = shutil.which(executable)
        self.executable = path
        if path is None:
            self._why = (
                f"{executable} is not on PATH: no Ascend driver here (it installs /usr/local/bin/npu-smi)"
            )
            return
        try:
            mapping = parse_npu_smi_mapping(self._run(["info", "-m"]))
        except RuntimeError:
            mapping = {}
        self.logic = {pair: logic for logic, pair in mapping.items()}
        self.index_source = (
            "logic ids from npu-smi info -m" if self.logic else "npu-smi info -m unreadable: NPU ids used"
        )
        try:
            parse_npu_smi_info(self._run(["info"]))
        except (RuntimeError, ValueError) as exc:
            self._why = f"npu-smi info is not usable here: {exc}"

    def available(self) -> tuple[bool, str]:
        if self._why:
            return False, self._why
        return True, f"{self.executable} ({self.index_source})"

    def _run(self, args: list[str]) -> str:
        try:
            done = subprocess.run(
                [self.executable, *args], capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeError(f"npu-smi {' '.join(args)} failed: {exc}") from exc
        if done.returncode != 0:
            raise RuntimeError(
                f"npu-smi {' '.join(args)} exited {done.returncode}: {(done.stderr or done.stdout).strip()[:200]}"
            )
        return done.stdout

    def _chip_index(self, chip: NpuChipRow) -> int:
        return self.logic.get((chip.npu_id, chip.chip_id), chip.npu_id)

    def sample(self) -> Reading:
        r = Reading()
        self.samples += 1
        try:
            table = parse_npu_smi_info(self._run(["info"]))
        except (RuntimeError, ValueError) as exc:
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

    def _chip_args(self, query: str, chip: NpuChipRow) -> list[list[str]]:
        base = ["info", "-t", query, "-i", str(chip.npu_id)]
        return [[*base, "-c", str(chip.chip_id)], base]  # some products answer only per board (no -c)

    def _health_detail(self, chip: NpuChipRow, p: str, r: Reading) -> None:
        errors = []
        for args in self._chip_args("health", chip):
            try:
                health = parse_npu_smi_health(self._run(args))
            except (RuntimeError, ValueError) as exc:
                errors.append(str(exc))
                continue
            r.info[p + "error_codes"] = health.error_codes
            r.info[p + "error_information"] = health.error_information
            return
        r.info[p + "error_codes_unreadable"] = "; ".join(errors)

    def _ecc(self, chip: NpuChipRow, p: str, r: Reading) -> None:
        errors = []
        for args in self._chip_args("ecc", chip):
            try:
                counts = parse_npu_smi_ecc(self._run(args))
            except (RuntimeError, ValueError) as exc:
                errors.append(str(exc))
                continue
            for metric, count in counts.items():
                r.put(p + metric, count)
            return
        r.absent[p + "hbm_ecc"] = "; ".join(errors)
