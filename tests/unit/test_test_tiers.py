"""`make test` and `make test-long` together collect every test exactly once: the two tiers' selections,
taken from the Makefile's own pytest lines, are collected as those targets collect them; no test is in both,
none is listed twice within one, and every test file under tests/ is in one of them (a folder missing from
``testpaths`` would otherwise run in neither)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections import Counter

from tests.conftest import ROOT


def tier_selection(target: str) -> list[str]:
    """The ``-m`` selection the Makefile's ``target`` passes to pytest."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe, f"no {target} target in the Makefile"
    line = next((x for x in recipe.group(1).splitlines() if "-m pytest" in x), None)
    assert line, f"{target} runs no pytest"
    args = shlex.split(line.split("-m pytest", 1)[1].split(";")[0])
    assert args.count("-m") == 1, f"{target}: expected one -m selection in {args}"
    return ["-m", args[args.index("-m") + 1]]


def collected(selection: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *selection]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def ids(proc: subprocess.Popen) -> list[str]:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    return [line for line in out.splitlines() if "::" in line]


def test_the_two_tiers_collect_every_test_exactly_once():
    fast_sel, long_sel = tier_selection("test"), tier_selection("test-long")
    assert fast_sel != long_sel
    fast_proc, long_proc = collected(fast_sel), collected(long_sel)  # both at once: CI time
    fast, long = ids(fast_proc), ids(long_proc)
    twice = [i for i, n in (Counter(fast) + Counter(long)).items() if n > 1]
    assert not twice, f"collected more than once: {twice[:10]}"
    assert len(long) >= 30, f"the long tier shrank to {len(long)} tests: {long}"  # 37 when it was marked
    files = {i.split("::", 1)[0] for i in fast + long}
    on_disk = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
    assert on_disk - files == set(), f"test files neither tier collects: {sorted(on_disk - files)}"
