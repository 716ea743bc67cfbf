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


def our_module(name: str) -> bool:
    """Whether a dotted name is a module of ours (a file or a package in the tree), not an object in one."""
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def private_imports(path: Path) -> list[str]:
    """``from x import _y`` of our modules, and ``m._y`` where ``m`` is one of our modules imported by name
    (``from controlplane.green import apis as green_apis`` then ``green_apis._hours``: the same door, used
    through the module)."""
    found = []
    tree = ast.parse(path.read_text(), filename=str(path))
    modules: dict[str, str] = {}  # a local name bound to one of our modules -> that module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in OUR_PACKAGES:
                continue  # another project's private API is its business (a comment says why we use it)
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
            modules |= {
                a.asname or a.name: f"{node.module}.{a.name}"
                for a in node.names
                if our_module(f"{node.module}.{a.name}")
            }
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno} .{node.module}.{a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
        elif isinstance(node, ast.Import):
            modules |= {
                a.asname: a.name for a in node.names if a.asname and a.name.split(".")[0] in OUR_PACKAGES
            }
    found += [
        f"{path.relative_to(ROOT)}:{node.lineno} {modules[node.value.id]}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in modules
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
    ]
    return found


def test_no_module_imports_another_modules_private_name():
    found = [hit for p in hand_written(".py") for hit in private_imports(p)]
    assert found == []


def test_a_private_import_is_found(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from workers.planner.energy import _unpack\nfrom torch.distributed import _tensor\n"
        "from controlplane.green import apis as green_apis\nfrom controlplane.jobs.models import TrainingJob\n"
        "green_apis._hours('x')\nTrainingJob._meta\n"
    )
    (tmp_path / "controlplane" / "green").mkdir(parents=True)
    (tmp_path / "controlplane" / "green" / "apis.py").write_text("")
    original = ROOT
    try:
        globals()["ROOT"] = tmp_path
        # a class's _meta (Django's API, not a module of ours) is no private door
        assert private_imports(bad) == [
            "bad.py:1 workers.planner.energy._unpack",
            "bad.py:5 controlplane.green.apis._hours",
        ]
    finally:
        globals()["ROOT"] = original


def test_the_ladders_hold():
    """import-linter's contracts: the engines on their ladder, the Django apps on theirs, no engine
    importing Django, Celery or the control plane."""
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "0 broken" in done.stdout


# the entry points of an app: they stand above its services and may take names from the package's facade
ENTRY_POINTS = {"apis.py", "views.py", "urls.py", "apps.py", "admin.py", "forms.py", "management"}


def facade_imports(app: Path) -> list[str]:
    """Rooms of ``app`` below its entry points that import its services package itself (the facade)."""
    facade = f"controlplane.{app.name}.services"
    found = []
    for path in sorted(app.rglob("*.py")):
        rel = path.relative_to(app)
        if rel.parts[0] in ENTRY_POINTS or "migrations" in rel.parts or rel == Path("services/__init__.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            hit = (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and (
                    node.module == facade
                    or (
                        node.module == f"controlplane.{app.name}"
                        and any(a.name == "services" for a in node.names)
                    )
                )
            ) or (isinstance(node, ast.Import) and any(a.name == facade for a in node.names))
            if hit:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_an_apps_rooms_take_names_from_their_modules_not_the_services_facade():
    """``controlplane/<app>/services/__init__.py`` imports every room of its package, so a room below the
    app's entry points that imported it would close a circle that import-linter's floors cannot see (the
    facade is no floor of ``.importlinter``'s jobs contract; the rooms are)."""
    apps = [p.parent.parent for p in sorted((ROOT / "controlplane").glob("*/services/__init__.py"))]
    assert apps, "no app has a services package"
    assert [hit for app in apps for hit in facade_imports(app)] == []


def test_a_facade_import_is_found(tmp_path):
    app = tmp_path / "jobs"
    (app / "services").mkdir(parents=True)
    (app / "services" / "__init__.py").write_text("from controlplane.jobs.services.faults import x\n")
    (app / "services" / "faults.py").write_text("from controlplane.jobs.services import job_launch\n")
    (app / "apis.py").write_text("from controlplane.jobs import services\n")  # an entry point: allowed
    (app / "slots.py").write_text("from controlplane.jobs import models, services\n")
    original = ROOT
    try:
        globals()["ROOT"] = tmp_path
        assert facade_imports(app) == ["jobs/services/faults.py:1", "jobs/slots.py:1"]
    finally:
        globals()["ROOT"] = original
