"""Fixtures that start real processes: daphne (ASGI), a Celery worker and the live relay, on the test
database and the test Redis; plus users, teams and tokens."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
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


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


RUNS: dict[str, dict] = {}
"""Summaries of deterministic training runs by config, shared across test modules in one session
(``tests/integration/test_training_parallel.py``'s ``train``). Here because this module has one name
everywhere (``tests.conftest``), where a test module imported by another is loaded twice."""


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


RUNNING_STACKS: list[Stack] = []
"""The stacks this session has running: every one's relay reads the test database."""


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
# `make test` (what CI runs, within its 30 minutes on a 2-core machine) leaves these out; `make test-long`
# runs them. Each is the costliest of a family whose other members stay in `make test` (the capability
# keeps a test there): chosen from the JUnit times of a full run (tests/slowest_files.py), 2026-12-02,
# where they were a third of the test time.
LONG_TESTS = {
    "tests/integration/test_elastic_scaling.py::test_a_lost_node_shrinks_the_job_and_its_return_grows_it_back",
    "tests/browser/test_comm_compare_page.py::test_comparison_shows_progress_cancels_and_recommends",
    "tests/integration/test_api_fuzz.py::test_every_operation_answers_as_documented[yaml]",
    "tests/integration/test_api_fuzz.py::test_valid_requests_answer_as_documented[yaml]",
    "tests/integration/test_elastic_jobs.py::test_an_elastic_job_started_on_one_node_grows_when_another_node_worker_comes_online",
    "tests/integration/test_fault_risk_jobs.py::test_a_straggling_node_of_an_elastic_job_is_snapshotted_drained_and_the_job_goes_on",
    "tests/integration/test_chaos.py::test_a_worker_killed_mid_job_leaves_a_failed_relaunchable_job_and_no_ranks",
    "tests/integration/test_chaos.py::test_a_postgresql_restart_mid_job_loses_nothing",
    "tests/integration/test_checkpoint_resharding.py::test_fsdp2_zero3_snapshot_of_two_ranks_loads_on_four",
    "tests/integration/test_job_schedules.py::test_an_interruptible_job_runs_in_its_slots_and_its_report_carries_the_saving",
    "tests/integration/test_job_schedules.py::test_the_green_cli_runs_a_carbon_aware_job_profiles_its_energy_and_writes_its_report",
    "tests/browser/test_planner_runs_here.py::test_a_big_plan_launches_scaled_down_as_a_labelled_job_that_runs_here",
    "tests/integration/test_checkpoint_resume.py::test_resumed_run_matches_the_uninterrupted_run_bit_for_bit[dp2-fsdp2-zero3]",
    "tests/integration/test_training_parallel.py::test_parallel_run_matches_single_process[tp2-pp2-interleaved-1f1b]",
    "tests/integration/test_training_parallel.py::test_a_rank_order_trains_as_the_default_one[tp2-dp2-dp-innermost]",
    "tests/integration/test_training_parallel.py::test_a_rank_order_trains_as_the_default_one[cp2-dp2-zero3-dp-before-cp]",
    "tests/integration/test_elastic_recovery.py::test_other_layouts_recover_to_the_reference_loss[pp2-1f1b]",
    "tests/integration/test_elastic_recovery.py::test_the_in_memory_tier_loses_at_most_its_interval_and_nothing_else",
    "tests/browser/test_visualizer.py::test_seed_scenario_visualizer",
    "tests/browser/test_visualizer_data.py::test_with_the_socket_open_the_page_never_polls_and_ends_from_page_data",
    "tests/integration/test_jobs.py::test_two_workers_as_two_nodes_run_one_job",
    "tests/integration/test_drop_link.py::test_a_dropped_node_link_is_found_recovered_and_the_losses_stay_bit_for_bit",
    "tests/integration/test_hotswap.py::test_survivor_keeps_stepping_and_the_killed_replica_rejoins_with_equal_parameters",
    "tests/integration/test_calibrate.py::test_calibrate_writes_a_measured_profile_the_planner_uses",
    "tests/integration/test_checkpoint_log_resume.py::test_the_run_writes_logs_between_full_snapshots",
    "tests/integration/test_comm_opt.py::test_comm_opt_compares_methods_on_the_emulated_network",
    # second cut (the tiered suite with 2 workers still took 32.4 min in CI, pytest 27.6): the slowest
    # 11 left whose family keeps a member in make test, ~610 s of test time
    "tests/integration/test_elastic_jobs.py::test_an_elastic_job_that_loses_a_node_goes_on_without_it_and_succeeds",
    "tests/integration/test_checkpoint_resume.py::test_a_run_killed_with_sigkill_resumes_from_its_newest_snapshot",
    "tests/integration/test_comm_compare_progress.py::test_progress_per_step_then_cancel_stops_the_run_and_keeps_earlier_rows",
    "tests/browser/test_job_pages.py::test_planned_job_trains_live_on_its_page_and_ends_succeeded",
    "tests/browser/test_job_attempt_traces_and_live_log.py::test_relaunch_is_a_trace_of_its_own_and_the_log_streams_while_it_runs",
    "tests/browser/test_planner_runs_here.py::test_a_pareto_point_is_saved_then_opened_and_launched",
    "tests/integration/test_checkpoint_resume.py::test_resumed_run_matches_the_uninterrupted_run_bit_for_bit[ep2-dp2-moe]",
    "tests/integration/test_checkpoint_resharding.py::test_ddp_snapshot_of_two_ranks_loads_on_one",
    "tests/integration/test_chaos.py::test_redis_restart_mid_job_keeps_the_app_up_and_every_event[persistent]",
    "tests/integration/test_training_parallel.py::test_parallel_run_matches_single_process[cp2-tp2-sequence-parallel-zero3]",
    "tests/integration/test_training_parallel.py::test_a_rank_order_trains_as_the_default_one[pp2-dp2-stages-inside-replicas]",
}


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        if item.nodeid in LONG_TESTS:
            item.add_marker(pytest.mark.long)
