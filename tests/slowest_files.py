"""After ``make test``: the test files that took longest (setup + call + teardown, summed from pytest's
JUnit XML), so a CI run shows where its time goes under xdist's ``--dist loadfile`` (one file per worker
at a time: the run lasts at least as long as its longest file).

    python tests/slowest_files.py var/test/junit.xml [N]
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    try:
        root = ET.parse(argv[0]).getroot()
    except (OSError, ET.ParseError) as exc:
        print(f"slowest_files: no report ({exc})")
        return 0  # informational: never the reason a run fails
    top = int(argv[1]) if len(argv) > 1 else 15
    per_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for case in root.iter("testcase"):
        name = case.get("classname") or "?"  # tests.unit.test_x, or tests.unit.test_x.TestY for a class
        module, _, last = name.rpartition(".")
        if module and last[:1].isupper():
            name = module
        per_file[name][0] += float(case.get("time") or 0.0)
        per_file[name][1] += 1
    total = sum(t for t, _ in per_file.values())
    print(f"test time by file (summed over {sum(n for _, n in per_file.values())} tests: {total:.0f} s)")
    for name, (seconds, count) in sorted(per_file.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {seconds:7.1f} s  {100 * seconds / max(total, 1e-9):4.1f} %  {count:4d} tests  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
