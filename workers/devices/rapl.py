"""CPU package and DRAM energy from the Linux powercap RAPL counters (``/sys/class/powercap/intel-rapl:*``;
Intel, and AMD since Linux 5.8): the engines' one RAPL adapter.

:func:`open_zones` finds the zones that count disjoint energy: those named ``package-<n>`` (a CPU package)
and ``dram`` (the memory attached to it). ``core``/``uncore`` sub-zones (inside a package) and ``psys`` (the
platform, which includes the packages) are skipped so that nothing is counted twice. A counter that went
down wrapped at ``max_energy_range_uj`` (kernel Documentation/power/powercap/powercap.rst); one wrap takes
minutes at full power, so each zone must be read (:meth:`RaplZone.advance`) at least that often.

Where RAPL cannot be read (no powercap directory, no zones, a counter readable by root only) a
:class:`RaplUnavailable` says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

RAPL_ROOT = Path("/sys/class/powercap")
DOMAINS = ("package", "dram")


class RaplUnavailable(RuntimeError):
    """RAPL cannot be read here; the message says why."""


@dataclass
class RaplZone:
    """One RAPL counter and the energy it has counted since it was opened."""

    path: Path
    name: str
    """The zone's own name (``package-0``, ``dram``)."""
    domain: str
    """``package`` or ``dram``."""
    max_range_uj: int
    last_uj: int
    joules: float = 0.0
    """Energy since the zone was opened, J."""
    wraps: int = 0

    def read_uj(self) -> int:
        return int((self.path / "energy_uj").read_text().strip())

    def advance(self) -> None:
        """Read the counter and add what it counted since the last read (a wrap included) to ``joules``."""
        now_uj = self.read_uj()
        delta = now_uj - self.last_uj
        if delta < 0:  # wrapped at max_energy_range_uj
            delta += self.max_range_uj
            self.wraps += 1
        self.joules += delta / 1e6
        self.last_uj = now_uj


def read_text(path: Path) -> str | None:
    """A sysfs file's text, stripped; None when it cannot be read."""
    try:
        return path.read_text().strip()
    except OSError:
        return None


def read_int(path: Path) -> int | None:
    text = read_text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def open_zones(root: str | Path = RAPL_ROOT) -> tuple[list[RaplZone], list[str]]:
    """``(zones, skipped)``: the package and DRAM zones under ``root``, each read once (its baseline), and
    the other zones as ``"intel-rapl:0:0 (core)"``. :class:`RaplUnavailable` when there is no RAPL, no package
    zone, or a counter cannot be read."""
    root = Path(root)
    if not root.is_dir():
        raise RaplUnavailable(
            f"{root} does not exist: no powercap RAPL interface (a virtual machine, or a kernel without the "
            "intel_rapl driver)"
        )
    paths = sorted(p for p in root.glob("intel-rapl:*") if p.is_dir())
    if not paths:
        raise RaplUnavailable(f"no intel-rapl:* zones under {root}: RAPL is not exposed on this machine")
    zones: list[RaplZone] = []
    skipped: list[str] = []
    for path in paths:
        name = read_text(path / "name")
        if name is None:
            continue
        if name.startswith("package"):
            domain = "package"
        elif name == "dram":
            domain = "dram"
        else:
            skipped.append(f"{path.name} ({name})")
            continue
        try:
            energy = int((path / "energy_uj").read_text().strip())
        except PermissionError as exc:
            raise RaplUnavailable(
                f"{path / 'energy_uj'} is readable by root only (Linux restricts RAPL counters since "
                "CVE-2020-8694); grant read access or run the meter as root"
            ) from exc
        except (OSError, ValueError) as exc:
            raise RaplUnavailable(f"cannot read {path / 'energy_uj'}: {exc}") from exc
        max_range = read_int(path / "max_energy_range_uj")
        if max_range is None or max_range <= 0:
            raise RaplUnavailable(f"cannot read {path / 'max_energy_range_uj'}: counter wraps undetectable")
        zones.append(RaplZone(path, name, domain, max_range, energy))
    if not any(z.domain == "package" for z in zones):
        raise RaplUnavailable(f"no package zone under {root} (found: {', '.join(skipped) or 'none'})")
    return zones, skipped
