"""``/metrics``: a real training job's figures scraped from the real daphne while it runs, the request id that
launched it on the runtime's events, who may scrape, and the relay's backlog read from Redis."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid

import pytest
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import own_redis_db, wait_for
from tests.integration.test_jobs import job_payload, wait_for_state

pytestmark = pytest.mark.django_db(transaction=True)


def scrape(base_url: str, headers: dict | None = None) -> dict[str, list]:
    """``{series name: [(labels, value)]}`` of one scrape."""
    req = urllib.request.Request(base_url + "/metrics", headers=headers or {})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def value_of(series: dict, name: str, **labels) -> float | None:
    found = [v for lab, v in series.get(name, []) if all(lab.get(k) == str(x) for k, x in labels.items())]
    return found[0] if found else None


@pytest.mark.slow
def test_a_running_jobs_figures_are_scraped_and_its_events_carry_the_request_id(
    live_stack, make_member, token_for
):
    from controlplane.accounts.models import Team
    from controlplane.live.models import StreamEvent

    alice = make_member("alice", "Team Metrics")
    team = Team.objects.get(name="Team Metrics").slug
    request_id = f"metrics-test-{uuid.uuid4().hex[:8]}"
    req = urllib.request.Request(
        live_stack.base_url + "/api/jobs/",
        data=json.dumps(job_payload(steps=100000)).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Token {token_for(alice)}",
            "X-Request-ID": request_id,
        },
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 201 and r.headers["X-Request-ID"] == request_id
        job_id = json.loads(r.read())["id"]
    stream = f"job/{job_id}"
    try:
        wait_for(
            lambda: StreamEvent.objects.filter(stream=stream, kind="train").count() >= 4,
            timeout=180,
            what=f"job {job_id}'s first steps",
        )

        def figures():
            # from loopback: no token needed while METRICS_TOKEN is unset (the session stack's case)
            series = scrape(live_stack.base_url)
            tokens = value_of(series, "cann_train_job_tokens_per_second", job_id=job_id, team=team)
            return (series, tokens) if tokens else None

        series, tokens_per_s = wait_for(figures, timeout=30, what="the job's tokens/s on /metrics")
        step_time_s = value_of(series, "cann_train_job_step_time_seconds", job_id=job_id, team=team)
        # tiny GPT, 2 CPU ranks: thousands of tokens/s, tens of milliseconds a step (a loaded machine: slower)
        assert 10 < tokens_per_s < 1e7 and 1e-4 < step_time_s < 30
        recent = [
            v["tokens_per_s"]
            for v in StreamEvent.objects.filter(stream=stream, kind="train").values_list("values", flat=True)
        ]
        assert min(recent) / 10 < tokens_per_s < max(recent) * 10  # the same figures the job published
        assert value_of(series, "cann_train_jobs", state="running", team=team) == 1
        assert value_of(series, "cann_train_metrics_scrape_errors", part="jobs") == 0
        assert value_of(series, "cann_train_stream_backlog_events") is not None
        assert value_of(series, "cann_train_relay_lag_seconds") >= 0
        assert "django_http_responses_total_by_status_total" in series  # django-prometheus' own
    finally:
        r = urllib.request.Request(
            f"{live_stack.base_url}/api/jobs/{job_id}/cancel/",
            headers={"Authorization": f"Token {token_for(alice)}"},
            method="POST",
        )
        urllib.request.urlopen(r, timeout=30).close()
    job = wait_for_state(job_id, {"cancelled", "failed", "succeeded"}, timeout=90)
    assert job.state == "cancelled"
    # web -> launch_job -> run_node -> torchrun: the runtime's lifecycle event names the request
    started = wait_for(
        lambda: StreamEvent.objects.filter(stream=stream, kind="event", values__has_key="world_size").first(),
        timeout=20,
        what="the runtime's started event",
    )
    assert started.values.get("request_id") == request_id
    after = scrape(live_stack.base_url)
    assert value_of(after, "cann_train_job_tokens_per_second", job_id=job_id) is None  # no longer running
    assert value_of(after, "cann_train_jobs", state="cancelled", team=team) == 1


def test_metrics_needs_the_bearer_token_when_one_is_set(client):
    with override_settings(METRICS_TOKEN="s3cret-scrape-token"):
        refused = client.get("/metrics")
        assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer")
        assert b"cann_train" not in refused.content
        assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
        assert client.get("/metrics", HTTP_AUTHORIZATION="Token s3cret-scrape-token").status_code == 403
        ok = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token", REMOTE_ADDR="10.1.2.3")
        assert ok.status_code == 200 and b"cann_train_jobs" in ok.content


def test_metrics_without_a_token_answers_only_unproxied_loopback_clients(client):
    with override_settings(METRICS_TOKEN=""):
        assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 403
        assert (
            client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.9").status_code
            == 403
        )
        assert client.get("/metrics", REMOTE_ADDR="::1").status_code == 200
        assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200


def test_relay_backlog_counts_what_the_relay_has_not_stored_and_its_age():
    """On a Redis database of its own (no stack's relay reads it): unread, read-but-pending, acknowledged."""
    import redis

    from controlplane.live.selectors import relay_backlog
    from workers.events import EventWriter, stream_key

    client = redis.Redis.from_url(own_redis_db(13))
    client.flushdb()
    try:
        writer = EventWriter(client)
        for step in range(3):
            writer.publish("job/901", "train", {"loss": 1.0}, step=step)
        time.sleep(0.05)
        unread = relay_backlog(client)  # no consumer group yet: all three are waiting
        assert (unread.events, unread.streams) == (3, 1) and unread.lag_s >= 0.05
        key = stream_key("job/901")
        client.xgroup_create(key, "relay", id="0")
        read = client.xreadgroup("relay", "test", {key: ">"}, count=2)
        assert relay_backlog(client).events == 3  # two read (pending), one not read yet
        client.xack(key, "relay", *[entry_id for entry_id, _ in read[0][1]])
        assert relay_backlog(client).events == 1
        client.xreadgroup("relay", "test", {key: ">"})
        client.xack(key, "relay", f"{3}-1")
        done = relay_backlog(client)
        assert (done.events, done.lag_s, done.streams) == (0, 0.0, 0)
    finally:
        client.flushdb()
