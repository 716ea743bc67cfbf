"""Faults on real processes: Redis dies and comes back empty in the middle of a job, the Celery worker is
killed in the middle of a job. Nothing may crash for good, nothing may be lost, nothing may stay stuck."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import (
    database_url_for_children,
    http,
    own_redis_db,
    start_stack,
    stop_stack,
    wait_for,
)
from workers.events import parse_time
from workers.training.examples import example

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

STEPS = 160


def _job_body(name: str, steps: int = STEPS) -> dict:
    return {
        "name": name,
        "model": example("tiny-dense.json"),
        "strategy": {"dp": 2, "micro_batch_size": 2},
        "training": {"global_batch_size": 4},
        "steps": steps,
        "device": "cpu",
        "profile_every": 0,
    }


def _train_steps(stream: str) -> list[int]:
    from controlplane.live.models import StreamEvent

    return list(StreamEvent.objects.filter(stream=stream, kind="train").values_list("step", flat=True))


@pytest.fixture(
    params=[pytest.param("persistent", marks=pytest.mark.long), "empty"]
)  # empty: the harder case
def private_redis(request):
    """A Redis of this test's own, killed (SIGKILL) and restarted on the same port. ``persistent``: with
    its append-only file, as ``make run``'s own Redis runs; ``empty``: without, so the restart loses every
    key (queues, streams, counters), as an external Redis without persistence would."""
    from controlplane.stack import free_port, start_embedded_redis, stop

    persist = request.param == "persistent"
    port = free_port()
    data = Path(os.environ["CANN_TRAIN_VAR_DIR"]) / f"redis-chaos-{port}"
    state = {"proc": start_embedded_redis(port, data, persist=persist), "port": port, "persist": persist}

    def restart(down_s: float) -> None:
        state["proc"].send_signal(signal.SIGKILL)
        state["proc"].wait()
        time.sleep(down_s)
        state["proc"] = start_embedded_redis(port, data, persist=persist)

    def pause_writes() -> None:
        """Hold every write (``CLIENT PAUSE ... WRITE``) until the restart: what the test reads as the last
        published event then stays the last one Redis took before it dies (a publisher's write waits,
        and goes to the new Redis once it is back)."""
        import redis

        redis.Redis(port=port).client_pause(30_000, all=False)

    state["restart"] = restart
    state["pause_writes"] = pause_writes
    yield state
    stop([state["proc"]])


class SocketRecorder:
    """A websocket client on its own thread, as a job page's ``live.js`` is: subscribes to ``stream`` from its
    start in batches, keeps every event it is sent, in arrival order, and when the socket closes (daphne's
    channel layer lost Redis) connects again and subscribes with the last seq it got; until stopped."""

    def __init__(self, stack, token: str, stream: str):
        import threading

        self.stack, self.token, self.stream = stack, token, stream
        self.events: list[dict] = []
        self.errors: list[str] = []
        self.reconnects = 0
        self.stopping = threading.Event()
        self.subscribed = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import asyncio
        import json

        import websockets

        async def record() -> None:
            headers = {"Authorization": f"Token {self.token}"}
            async with websockets.connect(self.stack.ws_url, additional_headers=headers) as ws:
                last = self.events[-1]["seq"] if self.events else 0
                await ws.send(
                    json.dumps(
                        {"action": "subscribe", "stream": self.stream, "last_seq": last, "batch": True}
                    )
                )
                while not self.stopping.is_set():
                    try:
                        frame = json.loads(await asyncio.wait_for(ws.recv(), 0.5))
                    except TimeoutError:
                        continue
                    if frame.get("type") == "subscribed":
                        self.subscribed.set()
                    elif frame.get("type") == "error":
                        self.errors.append(frame["message"])
                    elif frame.get("type") == "events":
                        self.events.extend(frame["events"])
                    elif "seq" in frame:
                        self.events.append(frame)

        while not self.stopping.is_set():
            try:
                asyncio.run(record())
            except (OSError, websockets.exceptions.WebSocketException):
                self.reconnects += 1
                self.stopping.wait(0.5)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)


def _stream_contract(recorder: SocketRecorder, stored: dict[int, tuple]) -> None:
    """What a socket was sent is the stored stream, in order, each number once, none skipped."""
    seqs = [e["seq"] for e in recorder.events]
    assert not recorder.errors, recorder.errors
    dupes = len(seqs) - len(set(seqs))
    holes = [b for a, b in zip(seqs, seqs[1:], strict=False) if b != a + 1]
    assert dupes == 0 and not holes and seqs[:1] == [1], (dupes, holes[:5], seqs[:3], len(seqs))
    assert seqs == sorted(stored), (len(seqs), len(stored))
    differ = [
        e["seq"]
        for e in recorder.events
        if (e["kind"], e["step"]) != stored[e["seq"]][:2]
        or abs((parse_time(e["time"]) - stored[e["seq"]][2]).total_seconds()) > 0.001
    ]
    assert not differ, f"events sent under a number the stored history gives another event: {differ[:10]}"


def _last_published_step(redis_url: str, stream: str) -> int:
    import redis

    from workers.events import parse_entries, stream_key

    entries = redis.Redis.from_url(redis_url).xrevrange(stream_key(stream), count=50)
    return max((e["step"] or 0 for e in parse_entries(entries) if e["kind"] == "train"), default=0)


def test_redis_restart_mid_job_keeps_the_app_up_and_every_event(
    private_redis, django_db_blocker, make_member, token_for
):
    from controlplane.jobs.models import TrainingJob
    from controlplane.live.models import StreamEvent

    token = token_for(make_member("alice", "Team A"))
    with django_db_blocker.unblock():
        db_url = database_url_for_children()
    redis_url = f"redis://127.0.0.1:{private_redis['port']}/0"
    stack = start_stack(
        redis_url=redis_url, database_url=db_url, name="chaos-redis",
        extra_env={"CANN_TRAIN_EVENTS_AUDIT_AFTER_S": "3"},
    )  # fmt: skip
    try:
        stack.wait_healthy()
        status, body = http(
            "POST", stack.base_url + "/api/jobs/", token, _job_body("through a redis restart")
        )
        assert status == 201, body
        job_id, stream = body["id"], body["stream"]
        # a job page open across the outage, and one opened right after it
        before = SocketRecorder(stack, token, stream)
        assert before.subscribed.wait(30), before.errors
        wait_for(lambda: len(_train_steps(stream)) >= 20, 180, "20 stored train events")
        wait_for(lambda: TrainingJob.objects.get(pk=job_id).progress > 0, 10, "the job's progress to move")

        relay = stack.procs["relay"].pid
        if not private_redis["persist"]:
            # a backlog the relay has not read when Redis dies empty (it stops reading for 2 s): those
            # events are gone for good, and must be counted and said, not lost in silence
            os.killpg(relay, signal.SIGSTOP)
            time.sleep(0.5)  # a commit already on its way lands
            stopped = len(_train_steps(stream))
            time.sleep(2.0)
        stored_before = max(_train_steps(stream))
        private_redis["pause_writes"]()
        published_before = _last_published_step(redis_url, stream)
        if not private_redis["persist"]:
            assert published_before > stored_before and len(_train_steps(stream)) == stopped
        private_redis["restart"](down_s=3.0)
        if not private_redis["persist"]:
            os.killpg(relay, signal.SIGCONT)
        after = SocketRecorder(stack, token, stream)

        job = wait_for(
            lambda: (j := TrainingJob.objects.get(pk=job_id)).is_finished and j, 300, "the job to finish"
        )
        assert job.state == "succeeded", (job.state, job.human_readable_error, stack.log_tail("worker"))
        for name, proc in stack.procs.items():
            assert proc.poll() is None, f"{name} exited with {proc.returncode}:\n{stack.log_tail(name)}"
        assert wait_for(lambda: http("GET", stack.base_url + "/healthz")[0] == 200, 60, "/healthz 200")
        assert wait_for(
            lambda: StreamEvent.objects.filter(
                stream=stream, kind="event", values__state="succeeded"
            ).exists(),
            30,
            "the succeeded event",
        )
        time.sleep(2)  # the relay's last batch
        steps = _train_steps(stream)
        assert len(steps) == len(set(steps)), "an event was stored twice"
        seqs = list(StreamEvent.objects.filter(stream=stream).values_list("seq", flat=True))
        assert len(seqs) == len(set(seqs))
        missing = set(range(1, STEPS + 1)) - set(steps)
        if private_redis["persist"]:
            assert not missing, f"lost steps {sorted(missing)}"
        else:
            # only what sat in Redis, not yet relayed, when it died without a disk may be gone; everything
            # published after the restart is stored, numbered on from the highest number already used (the
            # relay restored the counter before the ranks' guarded appends went ahead: none renumbered)
            assert missing and missing <= set(range(stored_before + 1, published_before + 1)), sorted(missing)
            assert "numbering goes on after" in stack.log_tail("relay", 20000)
        # the stream contract holds across the outage: every number once, none skipped, on both sockets
        assert sorted(seqs) == list(range(1, len(seqs) + 1)), "the stored stream has a hole"
        stored = {
            seq: (kind, step, t)
            for seq, kind, step, t in StreamEvent.objects.filter(stream=stream).values_list(
                "seq", "kind", "step", "time"
            )
        }
        for recorder in (before, after):
            assert after.subscribed.wait(30), after.errors
            deadline = time.monotonic() + 30
            while len(recorder.events) < len(stored) and time.monotonic() < deadline:
                time.sleep(0.2)
            recorder.stop()
            assert len(recorder.events) >= len(stored), (
                "before" if recorder is before else "after",
                len(recorder.events),
                len(stored),
                [e["seq"] for e in recorder.events][-5:],
                recorder.errors,
                stack.log_tail("web", 3000),
            )
            _stream_contract(recorder, stored)
        # what was lost is counted against what rank 0 published, once the job ended: a fault naming the
        # steps, on the job (nothing is lost in silence); with the AOF nothing is, and no fault says otherwise
        job = wait_for(
            lambda: "events_audit" in ((j := TrainingJob.objects.get(pk=job_id)).measured or {}) and j,
            60,
            "the event delivery audit",
        )
        audit = job.measured["events_audit"]
        assert audit["submitted"] == STEPS and audit["missing"] == len(missing), (audit, sorted(missing))
        lost = list(job.faults.filter(kind="events-lost"))
        if missing:
            [fault] = lost
            assert f"{len(missing)} of the {STEPS} train events" in fault.message and fault.step == min(
                missing
            )
            assert StreamEvent.objects.filter(
                stream=stream, kind="event", values__fault__kind="events-lost"
            ).exists()
            assert job.state == "succeeded"  # trained all the same: the record is what was lost
        else:
            assert not lost
    finally:
        stop_stack(stack)


@pytest.fixture
def fragile_stack(django_db_blocker):
    """A stack of this test's own whose worker the test kills (SIGKILL) and starts again; its relay calls
    a supervisor dead after 6 s without heartbeats and a search stalled after 5 s."""
    with django_db_blocker.unblock():
        db_url = database_url_for_children()
    stack = start_stack(
        redis_url=own_redis_db(6),
        database_url=db_url,
        name="chaos-worker",
        worker_queues="default,planning,training",
        extra_env={"CANN_TRAIN_HEARTBEAT_TIMEOUT_S": "6", "CANN_TRAIN_SEARCH_TIMEOUT_S": "5"},
    )
    try:
        stack.wait_healthy()
        yield stack
    finally:
        stop_stack(stack)


def kill_and_restart_worker(stack) -> None:
    import subprocess
    import sys

    from controlplane.stack import worker_command

    old = stack.procs["worker"]
    os.killpg(old.pid, signal.SIGKILL)
    old.wait()
    log = stack.logs["worker"]
    stack.procs["worker"] = subprocess.Popen(
        worker_command(
            queues="default,planning,training",
            concurrency=4,
            name=f"again-{os.getpid()}@%h",
            pool="threads",
            quick_start=True,
        ),
        cwd=Path(__file__).resolve().parents[2],
        env=stack.env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert sys.executable in stack.procs["worker"].args[0]


def processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


@pytest.mark.long
def test_a_worker_killed_mid_job_leaves_a_failed_relaunchable_job_and_no_ranks(
    fragile_stack, make_member, token_for
):
    from controlplane.jobs.models import JobNode, TrainingJob

    token = token_for(make_member("bob", "Team B"))
    status, body = http(
        "POST", fragile_stack.base_url + "/api/jobs/", token, _job_body("worker dies", steps=400)
    )
    assert status == 201, body
    job_id, stream = body["id"], body["stream"]
    wait_for(lambda: len(_train_steps(stream)) >= 5, 180, "the job to train")
    config_path = f"jobs/{job_id}/attempt-1/config-node0.json"
    assert processes_mentioning(config_path), "the ranks should be running"

    kill_and_restart_worker(fragile_stack)

    job = wait_for(
        lambda: (j := TrainingJob.objects.get(pk=job_id)).is_finished and j, 60, "the job to settle"
    )
    assert job.state == "failed" and "stopped answering" in job.human_readable_error
    assert wait_for(lambda: not processes_mentioning(config_path), 30, "the orphaned ranks to be gone")

    # relaunch: one new attempt, one node task for it, and it runs to the end on the new worker
    status, body = http("POST", f"{fragile_stack.base_url}/api/jobs/{job_id}/relaunch/", token, {})
    assert status == 202, body
    job = wait_for(lambda: (j := TrainingJob.objects.get(pk=job_id)).is_finished and j, 300, "the relaunch")
    assert job.state == "succeeded" and job.attempts == 2, (job.state, job.human_readable_error)
    assert JobNode.objects.filter(job_id=job_id, attempt=2).count() == 1


def test_a_worker_killed_mid_search_runs_the_search_again_once(fragile_stack, make_member, token_for):
    from controlplane.planning.models import StoredPlan, StrategySearch
    from workers.planner.examples import contract

    token = token_for(make_member("carol", "Team C"))
    body = {
        "cluster_doc": contract("cluster-atlas900.json"),
        "model_doc": contract("model-moe.json"),
        "training": {"global_batch_size": 1536, "dtype": "bf16", "optimizer": "adam"},
        "top_k": 5,
    }
    for _attempt in range(3):  # the kill must land while the search runs (it takes about a second)
        status, created = http("POST", fragile_stack.base_url + "/api/searches/", token, body)
        assert status == 201, created
        search_id = created["id"]
        wait_for(
            lambda sid=search_id: StrategySearch.objects.get(pk=sid).state != "queued",
            60,
            "the search to start",
            0.02,
        )
        if StrategySearch.objects.get(pk=search_id).state == "running":
            kill_and_restart_worker(fragile_stack)
            if StrategySearch.objects.get(pk=search_id).state == "running":
                break
    else:
        pytest.skip("the search always finished before the worker could be killed")
    search = wait_for(
        lambda: (s := StrategySearch.objects.get(pk=search_id)).is_finished and s, 120, "the search to end"
    )
    assert search.state == "succeeded", search.human_readable_error
    plans = list(StoredPlan.objects.filter(search_id=search_id).values_list("strategy", flat=True))
    assert plans and len(plans) == len({tuple(sorted(p.items())) for p in plans}), "plans stored twice"
    assert StrategySearch.objects.get(pk=search_id).stats.get("evaluated", 0) > 100_000


def _postgres_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    return found[-1].parent if found else None


@pytest.fixture
def private_postgres():
    """A PostgreSQL server of this test's own (initdb into a temporary folder, run as the `postgres` user),
    which it may restart; skipped where the machine has no PostgreSQL binaries."""
    import pwd
    import shutil
    import subprocess

    from controlplane.stack import free_port

    bin_dir = _postgres_bin()
    if bin_dir is None or shutil.which("runuser") is None:
        pytest.skip("no PostgreSQL server binaries (or runuser) on this machine")
    try:
        pg_user = pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("no postgres system user to run the server as")
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="cann-pg-"))  # under /tmp: pytest's own tmp folders are root-only
    data = root / "data"
    os.chown(root, pg_user.pw_uid, pg_user.pw_gid)
    port = free_port()

    def as_postgres(*argv, check=True):
        return subprocess.run(
            ["runuser", "-u", "postgres", "--", *argv],
            capture_output=True,
            text=True,
            timeout=120,
            check=check,
        )

    as_postgres(str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "cann", "--no-sync")
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"

    def pg_ctl(action: str):
        return as_postgres(
            str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-w", "-l", str(root / "log"), action
        )

    pg_ctl("start")
    as_postgres(str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "cann", "cann")
    yield {"url": f"postgres://cann@127.0.0.1:{port}/cann", "restart": lambda: pg_ctl("restart")}
    as_postgres(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop", check=False)
    shutil.rmtree(root, ignore_errors=True)


def _django(env: dict, code: str) -> str:
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()\n" + code],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip()


@pytest.mark.long
def test_a_postgresql_restart_mid_job_loses_nothing(private_postgres):
    import subprocess
    import sys

    env = {
        **os.environ,
        "DATABASE_URL": private_postgres["url"],
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
    }
    env.pop("CANN_TRAIN_TEST_SQLITE", None)
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert migrate.returncode == 0, migrate.stderr
    token = _django(
        env,
        "from django.contrib.auth.models import User\n"
        "from controlplane.accounts.services import team_create, token_issue\n"
        "from controlplane.accounts.models import Membership\n"
        "u = User.objects.create_user('pat', password='x'); t = team_create(name='Team P')\n"
        "Membership.objects.create(team=t, user=u); print(token_issue(user=u, name='t')[1])",
    ).splitlines()[-1]
    stack = start_stack(redis_url=own_redis_db(5), database_url=private_postgres["url"], name="chaos-pg")
    try:
        stack.wait_healthy()
        status, body = http(
            "POST", stack.base_url + "/api/jobs/", token, _job_body("through a database restart")
        )
        assert status == 201, body
        job_id, stream = body["id"], body["stream"]
        count = f"from controlplane.live.models import StreamEvent as E; print(E.objects.filter(stream='{stream}', kind='train').count())"
        wait_for(lambda: int(_django(env, count)) >= 10, 180, "10 stored train events", every=1.0)

        private_postgres["restart"]()

        state = (
            f"from controlplane.jobs.models import TrainingJob as J; print(J.objects.get(pk={job_id}).state)"
        )
        final = wait_for(
            lambda: (s := _django(env, state)) in {"succeeded", "failed", "cancelled"} and s,
            300,
            "the job to end",
            every=2.0,
        )
        assert final == "succeeded", stack.log_tail("worker")
        for name, proc in stack.procs.items():
            assert proc.poll() is None, f"{name} exited with {proc.returncode}:\n{stack.log_tail(name)}"
        steps = wait_for(
            lambda: (n := int(_django(env, count))) >= STEPS and n, 60, "every train event", every=2.0
        )
        assert steps == STEPS
    finally:
        stop_stack(stack)


def test_jobs_queued_behind_a_busy_worker_wait_their_turn_and_are_not_failed(
    django_db_blocker, make_member, token_for
):
    """One worker slot, two jobs, a 6 s heartbeat timeout: the second job waits longer than that for the
    slot, shows its place in the queue, and is neither failed as dead nor run twice."""
    from controlplane.jobs.models import JobNode, TrainingJob

    token = token_for(make_member("erin", "Team E"))
    with django_db_blocker.unblock():
        db_url = database_url_for_children()
    stack = start_stack(
        redis_url=own_redis_db(8),
        database_url=db_url,
        name="one-slot",
        concurrency=1,
        extra_env={"CANN_TRAIN_HEARTBEAT_TIMEOUT_S": "6"},
    )
    try:
        stack.wait_healthy()
        # long enough to hold the only slot well past the check below (it is cancelled after it)
        first = http("POST", stack.base_url + "/api/jobs/", token, _job_body("first", steps=20_000))[1]
        wait_for(
            lambda: TrainingJob.objects.get(pk=first["id"]).state == "running", 120, "the first job to run"
        )
        status, second = http("POST", stack.base_url + "/api/jobs/", token, _job_body("second", steps=20))
        assert status == 201, second
        time.sleep(10)  # longer than the heartbeat timeout, while the only slot is busy
        waiting = http("GET", f"{stack.base_url}/api/jobs/{second['id']}/", token)[1]
        assert waiting["state"] in {"queued", "launching"} and waiting["queue_position"] == 0, waiting
        assert TrainingJob.objects.get(pk=first["id"]).state == "running"
        assert http("POST", f"{stack.base_url}/api/jobs/{first['id']}/cancel/", token, {})[0] == 202
        for job_id, expected in ((first["id"], "cancelled"), (second["id"], "succeeded")):
            job = wait_for(
                lambda j=job_id: (x := TrainingJob.objects.get(pk=j)).is_finished and x, 400, "the jobs"
            )
            assert job.state == expected, (job.pk, job.state, job.human_readable_error)
            assert JobNode.objects.filter(job_id=job_id).count() == 1
    finally:
        stop_stack(stack)
