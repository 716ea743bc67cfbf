"""Token auth over real HTTP, /healthz against real services, and Redis going away and coming back."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request

import pytest

from tests.conftest import database_url_for_children, http, own_redis_db, start_stack, stop_stack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_token_auth_over_http(live_stack, make_member, token_for):
    alice = make_member("alice", "Team A")
    token = token_for(alice)
    assert http("GET", live_stack.base_url + "/api/me/")[0] == 401
    status, me = http("GET", live_stack.base_url + "/api/me/", token)
    assert status == 200 and me["username"] == "alice" and me["teams"][0]["slug"] == "team-a"
    status, body = http("GET", live_stack.base_url + "/api/me/", "ct_bad_token")
    assert status == 401 and "Invalid or revoked token" in body["detail"]
    # tokens are managed through the API too; a revoked one stops working at once
    status, created = http("POST", live_stack.base_url + "/api/tokens/", token, {"name": "ci"})
    assert status == 201 and created["token"].startswith("ct_")
    assert http("GET", live_stack.base_url + "/api/me/", created["token"])[0] == 200
    assert http("DELETE", f"{live_stack.base_url}/api/tokens/{created['id']}/", token)[0] == 204
    assert http("GET", live_stack.base_url + "/api/me/", created["token"])[0] == 401
    status, body = http("POST", live_stack.base_url + "/api/tokens/", token, {"name": ""})
    assert status == 400 and "name" in body
    status, body = http("POST", live_stack.base_url + "/api/tokens/", token, b"[1, 2")
    assert status == 400


def test_schema_and_docs_are_served_without_a_cdn(live_stack, make_member, token_for):
    token = token_for(make_member("alice", "Team A"))
    req = urllib.request.Request(
        live_stack.base_url + "/api/schema/?format=json", headers={"Authorization": f"Token {token}"}
    )
    with urllib.request.urlopen(req, timeout=15) as r:
        schema = json.loads(r.read())
    assert "/api/clusters/" in schema["paths"] and "/api/jobs/{id}/probe/" in schema["paths"]
    req = urllib.request.Request(
        live_stack.base_url + "/api/docs/", headers={"Authorization": f"Token {token}"}
    )
    with urllib.request.urlopen(req, timeout=15) as r:
        page = r.read().decode()
    assert "swagger-ui" in page and "/static/drf_spectacular_sidecar/" in page
    # a way back into the app from either viewer (issue 35)
    assert '<nav id="api-docs-nav"><a href="/">' in page
    req = urllib.request.Request(
        live_stack.base_url + "/api/redoc/", headers={"Authorization": f"Token {token}"}
    )
    with urllib.request.urlopen(req, timeout=15) as r:
        assert '<nav id="api-docs-nav"><a href="/">' in r.read().decode()
    # the app's icon, also where a page names none (/favicon.ico)
    with urllib.request.urlopen(live_stack.base_url + "/favicon.ico", timeout=15) as r:
        assert r.status == 200 and re.search(r"/static/img/favicon(\.[0-9a-f]{12})?\.svg$", r.url), r.url
        assert r.headers["Content-Type"].startswith("image/svg+xml") and b"<svg" in r.read()
    # no script or stylesheet from another host (a bare "cdn" search failed once on a random CSRF token)
    assert not re.search(r"<(script|link)\b[^>]*\b(src|href)=[\"'](https?:)?//", page), page
    with urllib.request.urlopen(live_stack.base_url + "/static/plotly/plotly.min.js", timeout=15) as r:
        assert r.status == 200 and b"plotly" in r.read(2000).lower()


def test_healthz_reports_every_service(live_stack):
    status, body = http("GET", live_stack.base_url + "/healthz")
    assert status == 200, body
    assert set(body["checks"]) == {"database", "redis", "celery"}
    assert all(c["ok"] for c in body["checks"].values())


def test_healthz_turns_503_without_redis_and_recovers(django_db_blocker, make_member, token_for):
    """A stack on its own Redis: stop that Redis → 503 naming Redis; start it again → 200."""
    from controlplane.jobs.models import TrainingJob
    from controlplane.stack import free_port, start_embedded_redis, stop

    alice = make_member("alice", "Team A")
    token = token_for(alice)
    job = TrainingJob.objects.create(team=alice.teams.first(), name="j", config={})
    port = free_port()
    data = __import__("pathlib").Path(os.environ["CANN_TRAIN_VAR_DIR"]) / f"redis-health-{port}"
    redis_proc = start_embedded_redis(port, data)
    with django_db_blocker.unblock():
        db_url = database_url_for_children()
    stack = start_stack(redis_url=f"redis://127.0.0.1:{port}/0", database_url=db_url, name="health")
    try:
        stack.wait_healthy()
        assert http("GET", stack.base_url + "/healthz")[0] == 200
        stop([redis_proc])
        status, body = http("GET", stack.base_url + "/healthz")
        assert status == 503
        assert body["checks"]["redis"]["ok"] is False and body["checks"]["database"]["ok"] is True
        # a page that needs Redis answers a clear 503, not a traceback
        status, body = http("POST", f"{stack.base_url}/api/jobs/{job.pk}/probe/", token, {})
        assert status == 503, body
        assert "Redis is unavailable" in body["detail"] and "REDIS_URL" in body["detail"]
        redis_proc = start_embedded_redis(port, data)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status, body = http("GET", stack.base_url + "/healthz")
            if status == 200:
                break
            time.sleep(1)
        assert status == 200, body
    finally:
        stop_stack(stack)
        stop([redis_proc])


def test_a_job_submitted_while_redis_is_down_is_kept_once_and_runs_when_redis_is_back(
    django_db_blocker, make_member, token_for
):
    """A stack on its own Redis, stopped: POST /api/jobs/ stores the job once and says (202) that it goes to a
    worker when Redis is back (the task outbox), not a 503 that leaves a job queued forever; Redis restarted,
    the relay sends it and it runs to the end."""
    from controlplane.jobs.models import TrainingJob
    from controlplane.live.models import PendingTask
    from controlplane.stack import free_port, start_embedded_redis, stop
    from workers.training.examples import example

    alice = make_member("alice", "Team A")
    token = token_for(alice)
    port = free_port()
    data = __import__("pathlib").Path(os.environ["CANN_TRAIN_VAR_DIR"]) / f"redis-outbox-{port}"
    redis_proc = start_embedded_redis(port, data)
    with django_db_blocker.unblock():
        db_url = database_url_for_children()
    stack = start_stack(redis_url=f"redis://127.0.0.1:{port}/0", database_url=db_url, name="outbox")
    request = {
        "name": "while redis is down",
        "model": example("tiny-dense.json"),
        "strategy": {"dp": 1},
        "training": {"global_batch_size": 8, "dtype": "fp32", "optimizer": "adam"},
        "steps": 3,
        "device": "cpu",
    }
    try:
        stack.wait_healthy()
        stop([redis_proc])
        status, body = http("POST", stack.base_url + "/api/jobs/", token, request)
        assert status == 202, body
        assert body["state"] == "queued" and body["dispatch"]["deferred"] is True, body
        assert "as soon as Redis is back" in body["dispatch"]["detail"], body
        assert TrainingJob.objects.filter(name="while redis is down").count() == 1
        assert (
            PendingTask.objects.filter(
                task="controlplane.jobs.tasks.launch_job", args=[body["id"], 1]
            ).count()
            == 1
        )
        redis_proc = start_embedded_redis(port, data)
        deadline = time.monotonic() + 120
        job = TrainingJob.objects.get(pk=body["id"])
        while time.monotonic() < deadline and job.state not in ("succeeded", "failed"):
            time.sleep(1)
            job.refresh_from_db()
        assert job.state == "succeeded", (job.state, job.human_readable_error, stack.log_tail("relay"))
        assert not PendingTask.objects.exists()  # sent once, then removed
        assert job.attempts == 1
    finally:
        stop_stack(stack)
        stop([redis_proc])


def test_a_busy_worker_is_ready_and_a_dead_one_is_not_while_the_web_process_stays_live(
    django_db_blocker, make_member, token_for
):
    """Readiness judges a worker by its heartbeat: with its only slot busy training, /readyz stays 200 (a ping
    task would wait behind the run: 503 after 3 s); killed, /readyz turns 503 within the heartbeat's staleness
    while /livez (the web process itself) stays 200."""
    import signal

    from controlplane.common.health import WORKER_BEAT_STALE_S
    from controlplane.jobs.models import TrainingJob
    from workers.training.examples import example

    token = token_for(make_member("alice", "Team A"))
    with django_db_blocker.unblock():
        db_url = database_url_for_children()
    stack = start_stack(
        redis_url=own_redis_db(7), database_url=db_url, name="busy", concurrency=1,
        worker_queues="default,training",
    )  # fmt: skip
    try:
        stack.wait_healthy()
        status, body = http("POST", stack.base_url + "/api/jobs/", token, {
            "name": "keeps the worker busy", "model": example("tiny-dense.json"), "strategy": {"dp": 1},
            "training": {"global_batch_size": 8, "dtype": "fp32", "optimizer": "adam"}, "steps": 400,
            "device": "cpu",
        })  # fmt: skip
        assert status == 201, body
        job = TrainingJob.objects.get(pk=body["id"])
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and job.state != "running":
            time.sleep(0.5)
            job.refresh_from_db()
        assert job.state == "running", job.state
        for _ in range(5):  # the worker's one slot is the run's for now
            status, body = http("GET", stack.base_url + "/readyz")
            assert status == 200, body
            assert "beating" in body["checks"]["celery"]["detail"]
            time.sleep(0.5)
        os.killpg(stack.procs["worker"].pid, signal.SIGKILL)
        deadline = time.monotonic() + WORKER_BEAT_STALE_S + 15
        while time.monotonic() < deadline:
            status, body = http("GET", stack.base_url + "/readyz")
            if status == 503:
                break
            time.sleep(1)
        assert status == 503, body
        assert "beat in the last" in body["checks"]["celery"]["detail"], body
        assert http("GET", stack.base_url + "/healthz")[0] == 503
        status, body = http("GET", stack.base_url + "/livez")
        assert status == 200 and body["status"] == "ok"
    finally:
        stop_stack(stack)
