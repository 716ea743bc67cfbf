"""Fixtures that start real processes: daphne (ASGI), a Celery worker and the live relay, on the test
database and the test Redis; plus users, teams and tokens."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def database_url_for_children() -> str:
    """The URL of the database the tests use (after pytest-django created it)."""
    from django.db import connection

    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    user = s.get("USER") or ""
    auth = f"{user}:{s.get('PASSWORD')}@" if s.get("PASSWORD") else (f"{user}@" if user else "")
    return f"postgres://{auth}{s.get('HOST') or '127.0.0.1'}:{s.get('PORT') or 5432}/{s['NAME']}"


def http(method: str, url: str, token: str | None = None, body=None) -> tuple[int, object]:
    """A real HTTP call (JSON in, JSON out; another content type comes back as bytes) with optional token
    auth."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Token {token}"
    data = json.dumps(body).encode() if isinstance(body, dict | list) else body

    def decoded(response) -> object:
        raw = response.read()
        if "json" not in (response.headers.get("Content-Type") or "json"):
            return raw  # a PDF download
        return json.loads(raw or b"null")

    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, decoded(r)
    except urllib.error.HTTPError as e:
        return e.code, decoded(e)


def wait_for(predicate, timeout: float, what: str, every: float = 0.3):
    """Poll ``predicate`` until it returns something truthy (returned), else fail saying what was awaited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@dataclass
class Stack:
    """Real daphne + Celery worker + relay processes."""

    base_url: str
    ws_url: str
    redis_url: str
    env: dict
    procs: dict = field(default_factory=dict)
    logs: dict = field(default_factory=dict)

    def log_tail(self, name: str, n: int = 4000) -> str:
        path = self.logs.get(name)
        return path.read_text()[-n:] if path and path.exists() else ""

    def wait_healthy(self, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")
            try:
                with urllib.request.urlopen(self.base_url + "/healthz", timeout=5) as r:
                    return json.loads(r.read())
            except Exception as exc:  # noqa: BLE001 - keep polling until healthy or timeout
                last = exc
            time.sleep(0.3)
        raise TimeoutError(
            f"stack not healthy after {timeout}s: {last}\n" + "\n".join(self.log_tail(n) for n in self.procs)
        )


def own_redis_db(n: int) -> str:
    """The session's Redis server, database ``n`` (1-15): a stack of its own there shares no queue, stream
    or channel with the session's stack (whose worker would otherwise take its tasks)."""
    url = os.environ["REDIS_URL"]
    return url.rsplit("/", 1)[0] + f"/{n}"


def start_stack(
    *,
    redis_url: str,
    database_url: str,
    name: str,
    worker_queues: str = "default,planning,training",
    extra_env: dict | None = None,
    concurrency: int = 4,
) -> Stack:
    from controlplane.stack import free_port, worker_command

    build_static_once()
    port = free_port()
    run_dir = Path(os.environ["CANN_TRAIN_VAR_DIR"]) / f"stack-{name}-{os.getpid()}"
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "PYTHONUNBUFFERED": "1",
        "CANN_TRAIN_VAR_DIR": str(run_dir),
        # the directories a job's own files may be under: the test session's (not the stack's var/data)
        "CANN_TRAIN_DATA_ROOTS": os.pathsep.join(str(r) for r in _session_data_roots()),
        "CANN_TRAIN_CODE_ROOTS": os.pathsep.join(str(r) for r in _session_code_roots()),
        **(extra_env or {}),
    }
    env.pop("CANN_TRAIN_TEST_SQLITE", None)
    py = sys.executable
    commands = {
        "web": [py, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "controlplane.asgi:application"],
        "worker": worker_command(
            queues=worker_queues,
            concurrency=concurrency,
            name=f"{name}-{os.getpid()}@%h",
            pool="threads",
            quick_start=True,
        ),
        "relay": [py, "manage.py", "relay"],
    }
    stack = Stack(
        base_url=f"http://127.0.0.1:{port}",
        ws_url=f"ws://127.0.0.1:{port}/ws/live/",
        redis_url=redis_url,
        env=env,
    )
    for proc_name, cmd in commands.items():
        log = run_dir / f"{proc_name}.log"
        stack.logs[proc_name] = log
        stack.procs[proc_name] = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
        )
    RUNNING_STACKS.append(stack)
    return stack


_STATIC_BUILT: list[dict] = []


def build_static_once() -> dict:
    """The static files every stack serves, built as ``make run`` builds them (``controlplane.static_build``:
    hashed names, gzip and Brotli, the partial plotly.js), once per test process: skipped in milliseconds when
    the sources are those of the last build, a few seconds after a change (its own log line says)."""
    if not _STATIC_BUILT:
        from controlplane.static_build import build_static

        _STATIC_BUILT.append(build_static(log=lambda line: print(line, file=sys.stderr)))
    return _STATIC_BUILT[0]


def _session_data_roots() -> list:
    from django.conf import settings

    return list(settings.DATA_ROOTS)


def _session_code_roots() -> list:
    from django.conf import settings

    return list(settings.CODE_ROOTS)


RUNNING_STACKS: list[Stack] = []
"""The stacks this session has running: every one's relay reads the test database."""


def stacks_at_failure(worker_lines: int = 300, relay_lines: int = 40) -> str:
    """What the running stacks were doing: each worker asked for its threads' stacks (SIGUSR2: the
    worker's faulthandler, ``controlplane/celery.py``), then the tail of its log and its relay's."""
    asked = []
    for stack in RUNNING_STACKS:
        worker = stack.procs.get("worker")
        if worker is not None and worker.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGUSR2)
                asked.append(worker)
    if asked:
        time.sleep(1.0)  # the dump is written by the worker's own signal handler
    parts = []
    for stack in RUNNING_STACKS:
        for name, lines in (("worker", worker_lines), ("relay", relay_lines)):
            if (log := stack.logs.get(name)) is not None and log.exists():
                tail = log.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"== {log} (last {len(tail)} lines)\n" + "\n".join(tail))
    return "\n".join(parts)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that fails while stacks run says what their workers were doing (a supervisor that stopped
    beating, a task that never returned) in its report: CI keeps no files of a run."""
    outcome = yield
    report = outcome.get_result()
    # the tiers whose tests talk to a stack (an engine test beside a running session stack is not about it)
    if report.failed and RUNNING_STACKS and {"integration", "browser"} & set(item.path.parts):
        try:
            report.sections.append(("stacks at the failure", stacks_at_failure()))
        except Exception as exc:  # noqa: BLE001 - the failure itself matters more than its context
            report.sections.append(("stacks at the failure", f"not read: {exc!r}"))


def stop_stack(stack: Stack) -> None:
    from controlplane.stack import stop

    if stack in RUNNING_STACKS:
        RUNNING_STACKS.remove(stack)
    stop(list(stack.procs.values()))


def _no_write_lock_held() -> bool:
    """True unless the test database is SQLite and another process holds its write lock right now."""
    import sqlite3

    from django.db import connection

    if connection.vendor != "sqlite":
        return True
    try:
        other = sqlite3.connect(connection.settings_dict["NAME"], timeout=0.2, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            other.execute("ROLLBACK")
        finally:
            other.close()
    except sqlite3.OperationalError:
        return False
    return True


@contextlib.contextmanager
def relays_paused():
    """SIGSTOP the relay of every running stack, SIGCONT it after: a test that drives the relay's work itself
    (``publish_pending_events``) on the shared test database must not have a stack's relay take its rows."""
    relays = [
        s.procs["relay"] for s in RUNNING_STACKS if s.procs.get("relay") and s.procs["relay"].poll() is None
    ]
    for _ in range(50):
        for p in relays:
            os.kill(p.pid, signal.SIGSTOP)
        if _no_write_lock_held():
            break
        for p in relays:  # stopped inside a write: let it finish, then stop it again
            os.kill(p.pid, signal.SIGCONT)
        time.sleep(0.05)
    try:
        yield
    finally:
        for p in relays:
            try:
                os.kill(p.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="session")
def live_stack(django_db_setup, django_db_blocker):
    """daphne + Celery worker + relay on the test database and the test Redis, for the whole session."""
    with django_db_blocker.unblock():
        url = database_url_for_children()
    stack = start_stack(redis_url=os.environ["REDIS_URL"], database_url=url, name="main")
    try:
        stack.wait_healthy()
        yield stack
    finally:
        stop_stack(stack)


# --- people -------------------------------------------------------------------------------------------
PASSWORD = "correct-horse-battery-staple"


@pytest.fixture
def code_dir():
    """A directory of this test's own under the first allowed code root (settings.CODE_ROOTS): where a test puts
    the user's script a job runs."""
    import shutil
    import uuid

    from django.conf import settings

    root = Path(settings.CODE_ROOTS[0]) / f"test-{uuid.uuid4().hex[:8]}"
    root.mkdir(parents=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def make_member():
    """make_member("alice", "Team A") -> user in that team (team created when new). The test enables the
    database itself (`db` or `transactional_db`)."""
    from django.contrib.auth import get_user_model

    from controlplane.accounts.models import Membership, Team
    from controlplane.accounts.services import team_create

    def make(username: str, team_name: str):
        user = get_user_model().objects.create_user(username=username, password=PASSWORD)
        team = Team.objects.filter(name=team_name).first() or team_create(name=team_name)
        Membership.objects.create(team=team, user=user)
        return user

    return make


@pytest.fixture
def alice(make_member):
    """alice, in Team A (the test enables the database itself, as for make_member)."""
    return make_member("alice", "Team A")


@pytest.fixture
def bob(make_member):
    """bob, in Team B: another team, for the cross-team checks."""
    return make_member("bob", "Team B")


@pytest.fixture
def api_client():
    """api_client(user) -> a DRF test client authenticated as ``user``, with ``.user`` and ``.team`` (the
    user's first team) set."""
    from rest_framework.test import APIClient

    def make(user) -> APIClient:
        client = APIClient()
        client.force_authenticate(user)
        client.user, client.team = user, user.teams.first()
        return client

    return make


@pytest.fixture
def alice_api(alice, api_client):
    """The API as alice (``api_client(alice)``)."""
    return api_client(alice)


@pytest.fixture
def alice_pages(alice):
    """The pages as alice: a Django test client signed in as her."""
    from django.test import Client

    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def token_for():
    from controlplane.accounts.services import token_issue

    def issue(user, name: str = "tests") -> str:
        return token_issue(user=user, name=name)[1]

    return issue


def import_tiny_cpu_plan(client, name: str = "tiny on this machine") -> dict:
    """Import (POST /api/plans/) a plan for the tiny example GPT, data parallel over 2 ranks of this
    machine's cpu cluster; returns the created plan as the API answers it."""
    from controlplane.planning.seed import local_cpu_cluster
    from workers.training.examples import example

    cpu, _ = local_cpu_cluster()
    r = client.post(
        "/api/plans/",
        {
            "name": name,
            "model": example("tiny-dense.json"),
            "cluster": {**cpu, "num_nodes": 1, "devices_per_node": 2},
            "training": {"global_batch_size": 8, "dtype": "fp32", "optimizer": "adam"},
            "strategy": example("dp2.json"),
        },
        format="json",
    )
    assert r.status_code == 201, r.content
    return r.json()


# --- the long tier ------------------------------------------------------------------------------------
# `make test` (the developer's loop) leaves out the tests marked `long` (the costliest fault and layout
# scenarios, each with cheaper members of its family kept in `make test`); `make test-long` runs them, and CI
# runs both (.ci/run). A test joins the tier where it is written: `@pytest.mark.long` on the test, or
# `tiered(...)` for some cases of a parametrized one (tests/unit/test_test_tiers.py checks that the two
# tiers together collect every test exactly once).


def tiered(cases, long) -> list:
    """The ids of ``cases`` as ``parametrize`` values, those named in ``long`` marked for the long tier. A
    long id that is not a case fails at collection: a renamed case cannot silently leave its tier."""
    unknown = set(long) - set(cases)
    if unknown:
        raise ValueError(f"tiered: {sorted(unknown)} marked long but not among the cases {sorted(cases)}")
    return [pytest.param(c, marks=pytest.mark.long, id=c) if c in long else c for c in cases]


@contextlib.contextmanager
def calibration_held(stack):
    """While inside, ``stack``'s machine is being calibrated as far as its processes know (a fresh status file
    says so): a request to calibrate is answered 409 and nothing measures, so a test that sends valid
    requests to every operation starts no minutes-long measuring, nor leaves a calibrated profile behind."""
    directory = Path(stack.env["CANN_TRAIN_VAR_DIR"]) / "calibration"
    directory.mkdir(parents=True, exist_ok=True)
    status = directory / "status.json"
    status.write_text(
        json.dumps({"state": "running", "stage": "held", "what": "held by a test", "fraction": 0})
    )
    try:
        yield
    finally:
        status.unlink(missing_ok=True)
