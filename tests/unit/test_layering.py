"""The layering rules of DESIGN.md, checked on the source: the engines under ``workers/`` never import
Django, Celery or the control plane (not even inside a function), each Celery task lives in its app's
``tasks.py``, and the web and relay processes start without importing torch."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# top-level packages an engine may not import: the web framework, the task queue, and the app itself
FORBIDDEN_IN_ENGINES = {
    "django",
    "rest_framework",
    "channels",
    "channels_redis",
    "celery",
    "kombu",
    "controlplane",
}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module a file imports, at any depth (function-level imports included), with its line."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in {
            "import_module",
            "__import__",
        }:
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found


def engine_violations(root: Path) -> list[str]:
    bad = []
    for path in sorted(root.rglob("*.py")):
        for line, module in imported_modules(path):
            if module.split(".")[0] in FORBIDDEN_IN_ENGINES:
                bad.append(f"{path.relative_to(root.parent)}:{line} imports {module}")
    return bad


def test_nothing_under_workers_imports_django_celery_or_the_control_plane():
    assert engine_violations(ROOT / "workers") == []


DJANGO_FIXTURES = {
    "db",
    "transactional_db",
    "django_db_setup",
    "live_stack",
    "make_member",
    "client",
    "alice",
}


def test_engine_tests_need_no_django():
    """tests/engines holds the engines' tests (laid out as workers/ is): they import none of the web stack
    and ask for no database or live-stack fixture, so they stay runnable without the control plane."""
    root = ROOT / "tests" / "engines"
    assert engine_violations(root) == []
    asks = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                asks += [
                    f"{path.name}:{node.lineno} {a.arg}" for a in node.args.args if a.arg in DJANGO_FIXTURES
                ]
    assert asks == []


def test_the_import_check_catches_a_function_level_import(tmp_path):
    engine = tmp_path / "workers"
    engine.mkdir()
    (engine / "ok.py").write_text("import numpy\nfrom workers.planner import search\n")
    (engine / "sneaky.py").write_text(
        "def f():\n    from controlplane.jobs import services\n    import celery\n"
    )
    assert engine_violations(engine) == [
        "workers/sneaky.py:2 imports controlplane.jobs",
        "workers/sneaky.py:3 imports celery",
    ]


def _is_task_decorator(node: ast.expr) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    name = getattr(target, "id", None) or getattr(target, "attr", None)
    return name in {"shared_task", "task"}


def test_every_celery_task_lives_in_an_apps_tasks_module():
    defined = set()
    for top in ("controlplane", "workers", "native_ops", "bench"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef) and any(map(_is_task_decorator, node.decorator_list)):
                    defined.add(path.relative_to(ROOT).as_posix())
    assert defined == {
        "controlplane/clusters/tasks.py",
        "controlplane/common/tasks.py",
        "controlplane/jobs/tasks.py",
        "controlplane/live/tasks.py",
        "controlplane/planning/tasks.py",
    }


def _imports_torch(code: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
    }
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_web_and_relay_processes_start_without_torch():
    """daphne's application, every URL's view module, the API schema and the relay import without torch:
    the web image needs no torch to serve pages (torch is imported where a job or a comparison runs)."""
    r = _imports_torch(
        "import sys, django; django.setup()\n"
        "from controlplane.asgi import application\n"
        "from django.urls import get_resolver\n"
        "get_resolver().url_patterns\n"
        "import controlplane.live.relay, controlplane.celery\n"
        "from django.apps import apps\n"
        "import importlib\n"
        "for app in apps.get_app_configs():\n"
        "    if app.name.startswith('controlplane.'):\n"
        "        for mod in ('services', 'selectors', 'apis', 'views', 'tasks'):\n"
        "            try:\n"
        "                importlib.import_module(f'{app.name}.{mod}')\n"
        "            except ModuleNotFoundError as exc:\n"
        "                if exc.name != f'{app.name}.{mod}':\n"
        "                    raise\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:5])\n"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "[]", r.stdout
