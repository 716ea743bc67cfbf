"""Structured logs, the request id from a request to its Celery tasks, and the Grafana dashboard's queries
against the metrics the code exports."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from celery import shared_task

from controlplane.common import logs

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "cann-train.json"


def record(message: str = "job %s started", *args, **extra) -> logging.LogRecord:
    rec = logging.makeLogRecord(
        {"name": "controlplane.jobs", "levelname": "INFO", "msg": message, "args": args}
    )
    rec.__dict__.update(extra)
    return rec


def test_json_formatter_writes_one_object_with_the_log_context_and_extras():
    token = logs.bind(request_id="req-1", job_id=42)
    try:
        line = logs.JsonFormatter().format(record("job %s started", 42, attempt=2))
    finally:
        logs.log_context.reset(token)
    out = json.loads(line)
    assert (
        out["message"] == "job 42 started" and out["level"] == "INFO" and out["logger"] == "controlplane.jobs"
    )
    assert out["request_id"] == "req-1" and out["job_id"] == 42 and out["attempt"] == 2
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", out["time"])
    assert "search_id" not in out  # unset keys are left out, not "-"


def test_json_formatter_keeps_the_traceback():
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys

        rec = record("failed")
        rec.exc_info = sys.exc_info()
    out = json.loads(logs.JsonFormatter().format(rec))
    assert "RuntimeError: boom" in out["exception"]


def test_log_context_filter_names_the_request_for_a_plain_format():
    rec = record("hello")
    assert logs.LogContextFilter().filter(rec) and rec.request_id == "-"
    token = logs.bind(request_id="abc")
    try:
        rec = record("hello")
        logs.LogContextFilter().filter(rec)
    finally:
        logs.log_context.reset(token)
    assert rec.request_id == "abc" and rec.job_id == "-"


def test_the_caller_request_id_is_kept_only_when_it_is_a_sane_token():
    assert logs.request_id_from("0f3c-proxy.id:7") == "0f3c-proxy.id:7"
    for bad in (None, "", "has space", "x" * 200, "new\nline", "-leading-dash"):
        assert re.fullmatch(r"[0-9a-f]{32}", logs.request_id_from(bad))


@pytest.mark.django_db
def test_request_id_goes_from_the_request_to_the_response(client):
    r = client.get("/login/", HTTP_X_REQUEST_ID="trace-123")
    assert r.status_code == 200 and r["X-Request-ID"] == "trace-123"
    made = client.get("/login/", HTTP_X_REQUEST_ID="not a token")["X-Request-ID"]
    assert re.fullmatch(r"[0-9a-f]{32}", made)
    assert client.get("/login/")["X-Request-ID"] != made  # a new one per request
    assert logs.current_request_id() is None  # nothing leaks out of the request


def test_a_task_published_during_a_request_carries_its_request_id_in_the_message_headers():
    """Published through the real broker (the test Redis) onto a queue no worker reads, then read back raw."""
    from controlplane.common.redis import redis_client
    from controlplane.common.tasks import ping

    queue = "cann-test-request-id"
    client = redis_client()
    client.delete(queue)
    token = logs.bind(request_id="req-from-web")
    try:
        ping.apply_async(("nonce",), queue=queue, ignore_result=True)
    finally:
        logs.log_context.reset(token)
    ping.apply_async(("nonce",), queue=queue, ignore_result=True)  # outside a request: no header
    try:
        messages = [json.loads(raw) for raw in client.lrange(queue, 0, -1)]
    finally:
        client.delete(queue)
    headers = sorted((m["headers"].get(logs.TASK_HEADER) or "") for m in messages)
    assert headers == ["", "req-from-web"]


@shared_task(name="tests.observability.context_of_the_run")
def context_of_the_run(job_id: int, attempt: int) -> dict:
    return dict(logs.log_context.get())


def test_a_task_run_gets_the_request_id_and_its_object_ids_in_its_log_context():
    result = context_of_the_run.apply((7, 1), headers={logs.TASK_HEADER: "req-42"}).get()
    assert result == {"request_id": "req-42", "job_id": 7}
    assert logs.log_context.get() == {}  # restored after the run
    assert context_of_the_run.apply((8, 1)).get() == {"job_id": 8}


# --- the Grafana dashboard ------------------------------------------------------------------------------


def exported_series() -> set[str]:
    """Every series name the web process (django-prometheus and the product collector) and a worker export."""
    import django_prometheus.middleware  # noqa: F401 - registers its metrics, as settings' middleware does
    from prometheus_client import REGISTRY

    from controlplane.common.worker_metrics import WORKER_METRICS
    from controlplane.metrics import PRODUCT_METRICS, ProductCollector

    names = set()
    families = [f for c in (REGISTRY, ProductCollector()) for f in c.collect()]
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    for family in families:
        names.add(family.name)
        names.update(family.name + s for s in suffixes.get(family.type, ()))
    for name in WORKER_METRICS:
        names.update(name + s for s in suffixes["histogram" if name.endswith("_seconds") else "counter"])
    assert set(PRODUCT_METRICS) <= {f.name for f in families}, (
        "a documented family the collector does not yield"
    )
    return names


@pytest.mark.django_db
def test_every_dashboard_query_names_a_metric_the_code_exports():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["uid"] and isinstance(dashboard["schemaVersion"], int)
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    exported = exported_series()
    used = set()
    for panel in panels:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]) and panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = set(re.findall(r"\b((?:cann_train|django)_[a-z0-9_]+)\b", target["expr"]))
            assert names, f"{panel['title']}: no metric in {target['expr']}"
            assert names <= exported, f"{panel['title']}: {sorted(names - exported)} not exported"
            used |= names
    from controlplane.metrics import PRODUCT_METRICS

    # every product family has a panel (a counter's series is its name + _total, a histogram's _bucket)
    shown = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in used}
    assert set(PRODUCT_METRICS) <= shown, sorted(set(PRODUCT_METRICS) - shown)


def test_worker_metrics_endpoint_counts_tasks_across_processes(tmp_path):
    """``serve`` in a process of its own (it switches that process to multiprocess mode), a forked child that
    runs a task, and the endpoint's answer adding up both."""
    import subprocess
    import sys

    from controlplane.stack import free_port

    port = free_port()
    script = f"""
import os, urllib.request
from controlplane.common import worker_metrics
worker_metrics.serve({port})
worker_metrics.task_started("t1", "controlplane.jobs.tasks.launch_job")
worker_metrics.task_finished("t1", "controlplane.jobs.tasks.launch_job", "SUCCESS")
if (child := os.fork()) == 0:  # a prefork pool process
    worker_metrics.task_started("t2", "controlplane.jobs.tasks.launch_job")
    worker_metrics.task_failed("controlplane.jobs.tasks.launch_job", ValueError("bad"))
    worker_metrics.task_finished("t2", "controlplane.jobs.tasks.launch_job", "FAILURE")
    os._exit(0)
os.waitpid(child, 0)
print(urllib.request.urlopen("http://127.0.0.1:{port}/metrics", timeout=10).read().decode())
"""
    env = {**__import__("os").environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    task = 'task="controlplane.jobs.tasks.launch_job"'
    assert f"cann_train_celery_tasks_started_total{{{task}}} 2.0" in out.stdout
    assert f'cann_train_celery_tasks_finished_total{{state="FAILURE",{task}}} 1.0' in out.stdout
    assert f'cann_train_celery_tasks_failed_total{{exception="ValueError",{task}}} 1.0' in out.stdout
    assert f"cann_train_celery_task_duration_seconds_count{{{task}}} 2.0" in out.stdout
