"""The rooms stay small and keep their doors: no hand-written Python or JavaScript file is over 800 lines (a
file that long does two or three jobs), and no module imports another's private name (``from x import _y``:
a name with a leading underscore is its module's own; a second user means it is public, so name it so).
The engines' and the apps' ladders are import-linter's (``.importlinter``, ``make lint``); so is this, run
here too so that ``make test`` alone catches a broken ladder."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 800
OURS = ("workers", "controlplane", "tests", "bench", "native_ops", "frontend")
GENERATED = ("migrations",)  # Django writes these
OUR_PACKAGES = {"workers", "controlplane", "tests", "bench", "native_ops"}


def hand_written(suffix: str) -> list[Path]:
    files = []
    for top in OURS:
        for path in sorted((ROOT / top).rglob(f"*{suffix}")):
            parts = path.relative_to(ROOT).parts
            if not any(p in GENERATED or p.startswith(".") or p in {"node_modules", "build"} for p in parts):
                files.append(path)
    return files


def test_no_hand_written_file_is_over_800_lines():
    files = hand_written(".py") + hand_written(".js")
    assert len(files) > 300  # the walk found the tree
    long = {
        str(p.relative_to(ROOT)): n
        for p in files
        if (n := len(p.read_text(errors="replace").splitlines())) > MAX_LINES
    }
    assert long == {}, f"over {MAX_LINES} lines: split them by responsibility"


def private_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in OUR_PACKAGES:
                continue  # another project's private API is its business (a comment says why we use it)
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno} .{node.module}.{a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
    return found


def test_no_module_imports_another_modules_private_name():
    found = [hit for p in hand_written(".py") for hit in private_imports(p)]
    assert found == []


def test_a_private_import_is_found(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from workers.planner.energy import _unpack\nfrom torch.distributed import _tensor\n")
    original = ROOT
    try:
        globals()["ROOT"] = tmp_path
        assert private_imports(bad) == ["bad.py:1 workers.planner.energy._unpack"]
    finally:
        globals()["ROOT"] = original


def test_the_ladders_hold():
    """import-linter's contracts: the engines on their ladder, the Django apps on theirs, no engine
    importing Django, Celery or the control plane."""
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "0 broken" in done.stdout
