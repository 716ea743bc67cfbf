"""The fault plan's grammar: what ``JobConfig.inject`` (and ``cann-train elastic --inject``) may say.

``kind@step=N[:rank=R]``, comma-separated, e.g. ``kill-rank@step=17,hang-rank@step=40:rank=1``. What each
kind does, and the injector that fires them from outside the ranks, is :mod:`workers.reliability.faults`;
the grammar lives with the runtime so that a job's config is checked without importing the injector.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KINDS = ("kill-rank", "hang-rank", "corrupt-snapshot", "kill-worker", "drop-link")
MAX_FAULTS = 100
DROP_LINK_NEEDS_NETEM = (
    "drop-link takes down a node's link on the emulated two-tier network (one network namespace per node, "
    "workers/training/comm/netem.py)"
)
_FAULT = re.compile(r"(?P<kind>[a-z-]+)@step=(?P<step>\d{1,9})(?::rank=(?P<rank>\d{1,6}))?")


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int | None = None

    def __str__(self) -> str:
        return f"{self.kind}@step={self.step}" + (f":rank={self.rank}" if self.rank is not None else "")


def parse_faults(text: str) -> list[Fault]:
    """``kill-rank@step=17,hang-rank@step=40:rank=1`` -> faults; ``ValueError`` naming the bad item."""
    faults: list[Fault] = []
    for item in (part.strip() for part in str(text).split(",")):
        if not item:
            continue
        m = _FAULT.fullmatch(item)
        if not m:
            raise ValueError(
                f"{item!r} is not a fault: write kind@step=N or kind@step=N:rank=R "
                f"(kinds: {', '.join(KINDS)}), e.g. kill-rank@step=17"
            )
        if m["kind"] not in KINDS:
            raise ValueError(f"{m['kind']!r} is not a fault kind (known: {', '.join(KINDS)})")
        step = int(m["step"])
        if step < 1:
            raise ValueError(f"{item!r}: the step must be >= 1 (faults fire after a committed step)")
        rank = int(m["rank"]) if m["rank"] is not None else None
        if rank is not None and m["kind"] in ("corrupt-snapshot", "kill-worker"):
            raise ValueError(f"{item!r}: {m['kind']} takes no rank")
        faults.append(Fault(m["kind"], step, rank))
    if len(faults) > MAX_FAULTS:
        raise ValueError(f"at most {MAX_FAULTS} faults, got {len(faults)}")
    return faults
