"""Huawei Ascend NPUs through ``npu-smi`` (installed with the Ascend driver as ``/usr/local/bin/npu-smi``):
the engines' one npu-smi adapter.

:class:`NpuSmi` finds the tool and runs one query under a timeout (one process per query: too slow for a
training thread, so its callers sample on their own threads); the parsers read what it prints:

- ``npu-smi info`` (:func:`parse_npu_smi_info`): every chip's health, power, temperature, AI Core and HBM use;
- ``npu-smi info -m`` (:func:`parse_npu_smi_mapping`): chip logic ids (what ``ASCEND_RT_VISIBLE_DEVICES`` and
  npu-exporter's ``id`` label use) to the ``-i <npu id> -c <chip id>`` the per-chip queries take;
- ``npu-smi info -t power|health|temp|ecc -i <npu> [-c <chip>]`` (:func:`parse_npu_smi_power`,
  :func:`parse_npu_smi_health`, :func:`parse_npu_smi_temperature`, :func:`parse_npu_smi_ecc`).

Formats: Huawei's npu-smi command reference (support.huawei.com, "npu-smi info" for Atlas A2 / 310P) and
npu-smi's own print functions, which write ``key : value`` lines as ``"\\t%-30s : %s\\n"`` (``%-40s`` for
the ECC counters); the ``npu-smi info`` table as printed by npu-smi 23.0.x. Recorded samples are in
``tests/data/telemetry`` with their provenance.

A tool that is absent, fails or times out raises :class:`NpuSmiUnavailable` saying why; a parser that finds
no figure raises ``ValueError`` saying what it found instead.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field

_KEY_VALUE = re.compile(r"^\s*([^:]*?)\s*:\s*(.*?)\s*$")
_NPU_ROW = re.compile(r"^(\d+)\s+(\S.*)$")  # "0     910B2"
_CHIP_ROW = re.compile(r"^(\d+)(?:\s+(\d+))?$")  # "0" or "0       0" (chip id, device / phy id)
_BUS_ID = re.compile(
    r"^(?:[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]|NA)$"
)  # or NA (no PCIe)
_PAIR = re.compile(r"(\d+)\s*/\s*(\d+)")
_VERSION = re.compile(r"npu-smi\s+(\S+)")


class NpuSmiUnavailable(RuntimeError):
    """npu-smi is not here, or a query failed; the message says why."""


def ascend_visible_devices(env: Mapping[str, str] | None = None) -> list[int] | None:
    """``ASCEND_RT_VISIBLE_DEVICES`` of ``env`` (default: this process's environment) as chip logic ids, in
    the order the process numbers its NPUs; None when it is unset or empty (every chip, by logic id)."""
    visible = (os.environ if env is None else env).get("ASCEND_RT_VISIBLE_DEVICES", "").strip()
    return [int(p) for p in visible.split(",") if p.strip().isdigit()] if visible else None


def chip_query(query: str, npu_id: int, chip_id: int | None) -> list[list[str]]:
    """The arguments of ``npu-smi info -t <query>`` for one chip, to try in order: with ``-c <chip id>``
    (when known), then without it, as some products answer only per board."""
    base = ["info", "-t", query, "-i", str(npu_id)]
    return ([[*base, "-c", str(chip_id)]] if chip_id is not None else []) + [base]


class NpuSmi:
    """The ``npu-smi`` executable on PATH (:class:`NpuSmiUnavailable` when it is not)."""

    def __init__(self, executable: str = "npu-smi", *, timeout_s: float = 10.0):
        path = shutil.which(executable)
        if path is None:
            raise NpuSmiUnavailable(
                f"{executable} is not on PATH: no Ascend driver here (it installs /usr/local/bin/npu-smi)"
            )
        self.executable, self.timeout_s = path, timeout_s

    def run(self, args: list[str]) -> str:
        """What ``npu-smi <args>`` prints; :class:`NpuSmiUnavailable` when it fails, exits non-zero or takes
        longer than ``timeout_s``."""
        try:
            done = subprocess.run(
                [self.executable, *args], capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NpuSmiUnavailable(f"npu-smi {' '.join(args)} failed: {exc}") from exc
        if done.returncode != 0:
            raise NpuSmiUnavailable(
                f"npu-smi {' '.join(args)} exited {done.returncode}: {(done.stderr or done.stdout).strip()[:200]}"
            )
        return done.stdout

    def chip_mapping(self) -> dict[int, tuple[int, int]]:
        """``npu-smi info -m`` as ``{chip logic id: (npu id, chip id)}``; empty when the query fails."""
        try:
            return parse_npu_smi_mapping(self.run(["info", "-m"]))
        except NpuSmiUnavailable:
            return {}


# -------------------------------------------------------------------------------------------- parsers


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


# ``npu-smi info -t power -i <npu id> [-c <chip id>]`` prints ``key : value`` lines, each key left-aligned
# in 30 columns after a tab (the npu-smi sources print them with ``"\t%-30s : %.1f\n"``), e.g. on an
# Atlas A2 (Ascend 910B, npu-smi 25.5.1):
#
#         NPU ID                         : 0
#         Chip Count                     : 1
#
#         NPU Real-time Power(W)         : 103.5
#         Chip ID                        : 0
#
# Huawei's npu-smi command reference (support.huawei.com EDOC1100438695 for Atlas A2, EDOC1100368198 for
# 310P: "info -t power -i id -c chip_id") documents the query. The power line's label depends on the
# product and on whether a chip or the board's MCU answers:
# - ``NPU Real-time Power(W)``: the chip's (or, in ``-t common`` output, the MCU's) real-time power;
# - ``Power Dissipation(W)``: the board's power where the MCU answers (Ascend 310/310B boards, cards);
# - ``Rated Power Dissipation(W)``: a rating (Ascend 310 chips), not a measurement: refused here;
# - ``NA`` as the value: not available (e.g. a vNPU inside a container).
NPU_POWER_LABELS = ("NPU Real-time Power(W)", "Power Dissipation(W)")
NPU_RATED_LABEL = "Rated Power Dissipation(W)"


@dataclass(frozen=True)
class NpuPower:
    """One power figure parsed from ``npu-smi info -t power``."""

    watts: float
    label: str
    npu_id: int | None
    chip_id: int | None


def parse_npu_smi_power(text: str) -> NpuPower:
    """The measured power in ``npu-smi info -t power -i <id> [-c <chip>]`` output (format above);
    ``ValueError`` saying what was found when there is none (a rating, ``NA``, an error message)."""
    fields = parse_npu_smi_key_values(text)
    npu_id = next((int(v) for k, v in fields if k == "NPU ID" and v.isdigit()), None)
    chip_id = next((int(v) for k, v in fields if k == "Chip ID" and v.isdigit()), None)
    for label in NPU_POWER_LABELS:
        for key, value in fields:
            if key != label:
                continue
            try:
                watts = float(value)
            except ValueError:
                raise ValueError(
                    f"npu-smi reports {label} as {value!r}: no power reading available"
                ) from None
            if not math.isfinite(watts) or watts < 0:
                raise ValueError(f"npu-smi reports {label} as {value!r}, not a power")
            return NpuPower(watts, label, npu_id, chip_id)
    if any(k == NPU_RATED_LABEL for k, _ in fields):
        raise ValueError(f"npu-smi reports only {NPU_RATED_LABEL}, a rating and not a measurement")
    shown = text.strip().splitlines()[:3]
    raise ValueError(f"no power line ({' or '.join(NPU_POWER_LABELS)}) in npu-smi output: {shown!r}")


def parse_npu_smi_mapping(text: str) -> dict[int, tuple[int, int]]:
    """``npu-smi info -m`` as ``{chip logic id: (npu id, chip id)}``; MCU rows (logic id ``-``) are left
    out. The table's columns: ``NPU ID  Chip ID  Chip Logic ID  Chip Name``."""
    mapping: dict[int, tuple[int, int]] = {}
    for line in text.splitlines():
        parts = line.split(maxsplit=3)
        if len(parts) >= 3 and all(p.isdigit() for p in parts[:3]):
            mapping[int(parts[2])] = (int(parts[0]), int(parts[1]))
    return mapping


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
