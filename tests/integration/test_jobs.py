"""Training jobs through the API and a real Celery worker: torchrun on gloo, live events, cancel,
a killed worker, and two workers acting as two nodes on loopback."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import database_url_for_children, http, start_stack, stop_stack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "workers" / "training" / "examples"


def example(name: str) -> dict:
    return json.loads((EXAMPLES / name).read_text())


def job_payload(steps=6, strategy="dp2.json", **extra) -> dict:
    return {
        "name": "tiny",
        "model": example("tiny-dense.json"),
        "strategy": example(strategy),
        "training": example("training.json"),
        "steps": steps,
        "device": "cpu",
        **extra,
    }


def wait_for_state(job_id: int, states: set[str], timeout: float = 180) -> object:
    from controlplane.jobs.models import TrainingJob

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = TrainingJob.objects.get(pk=job_id)
        if job.state in states:
            return job
        time.sleep(0.3)
    raise AssertionError(
        f"job {job_id} still {job.state} after {timeout}s: {job.human_readable_error} {job.log_tail[-2000:]}"
    )


def processes_of(job_id: int) -> list[psutil.Process]:
    marker = f"/jobs/{job_id}/attempt-"
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            continue
    return found


def test_job_runs_streams_and_succeeds(live_stack, alice_api, token_for, tmp_path):
    from controlplane.live.models import StreamEvent

    r = alice_api.post(
        "/api/jobs/",
        job_payload(steps=6, plan={"strategy": example("dp2.json"), "predicted": {"step_time_s": 0.05}}),
        format="json",
    )
    assert r.status_code == 201, r.content
    job = wait_for_state(r.json()["id"], {"succeeded", "failed"})
    assert job.state == "succeeded", (job.human_readable_error, job.log_tail[-3000:])
    assert job.world_size == 2 and job.attempts == 1
    assert job.measured["steps"] == 6 and job.measured["world_size"] == 2
    assert job.measured["tokens_per_s"] > 0 and job.measured["loss_last"] < job.measured["loss_first"]
    body = alice_api.get(f"/api/jobs/{job.pk}/").json()
    assert body["predicted_step_time_s"] == 0.05 and body["measured"]["step_time_s"] > 0
    # every train step was relayed into the database, in order
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        steps = list(
            StreamEvent.objects.filter(stream=job.stream, kind="train").values_list("step", flat=True)
        )
        states = [e.values.get("state") for e in StreamEvent.objects.filter(stream=job.stream, kind="event")]
        if len(steps) == 6 and "succeeded" in states:
            break
        time.sleep(0.3)
    assert steps == [1, 2, 3, 4, 5, 6]
    assert states[0] == "queued" and "running" in states and states[-1] == "succeeded"
    history = alice_api.get(f"/api/jobs/{job.pk}/events/").json()
    assert [e["seq"] for e in history] == sorted(e["seq"] for e in history)
    # none of the job's processes outlives it (a loaded machine may take a moment to reap torchrun's last)
    deadline = time.monotonic() + 10
    while processes_of(job.pk) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_of(job.pk) == []
    # energy and carbon, metered as the job ran: an estimate here (no RAPL, no GPU), labelled so; carbon
    # from the deployment's zone (GB) through its shipped 2020 history, labelled as a stand-in
    energy = [e for e in history if e["kind"] == "energy"]
    assert [e["step"] for e in energy] == [5, 6]  # every 5 steps, and once after the last
    totals = alice_api.get(f"/api/jobs/{job.pk}/").json()["energy"]
    assert totals["kwh"] > totals["kwh_it"] > 0 and totals["pue"] == 1.58  # the cited default PUE
    assert totals["estimate"] is True and totals["method"] == "estimate" and "estimate" in totals["label"]
    assert totals["kgco2e"] > 0 and totals["kgco2e_market"] is None and totals["cost"] is None
    assert totals["intensity"]["provider"] == "history" and totals["intensity"]["zone"] == "GB"
    assert totals["intensity"]["kind"] == "history" and totals["intensity"]["g_per_kwh"] > 0
    assert totals["tokens"] == 6 * job.measured["tokens_per_step"]
    assert totals["tokens_per_kwh"] == pytest.approx(totals["tokens"] / totals["kwh_it"])
    # carbon = each interval's energy x the intensity in force: between the lowest and highest value
    i = totals["intensity"]["g_per_kwh"]
    assert totals["kgco2e"] == pytest.approx(totals["kwh"] * i / 1000, rel=0.5)
    assert job.measured["energy"]["results"]["kwh"]["facility"] == pytest.approx(totals["kwh"])
    check_node_telemetry_and_risk(history)
    token = token_for(job.created_by)
    check_energy_report(alice_api, job, cli=(live_stack.base_url, token, tmp_path / "report.pdf"))


def check_node_telemetry_and_risk(history: list[dict]) -> None:
    """The node's supervisor streamed its telemetry (psutil here; NVML and npu-smi absent, saying why) and
    risk: two ranks are too few to name a straggler, and no failure model is configured -- both said."""
    telemetry = [e for e in history if e["kind"] == "telemetry"]
    assert telemetry, [e["kind"] for e in history]
    first = telemetry[0]["values"]
    assert first["node_rank"] == 0 and first["attempt"] == 1 and first["node"]
    assert 0 <= first["metrics"]["cpu.util_pct"] <= 100 and first["metrics"]["mem.total_GiB"] > 0
    assert "NVML" in first["absent"]["nvml"] and "npu-smi" in first["absent"]["npu-smi"]
    # what is absent is sent again only when it changed (the job's own signals appear once a step is in)
    sent = [e["values"]["absent"] for e in telemetry if "absent" in e["values"]]
    assert all(a != b for a, b in zip(sent, sent[1:], strict=False)), sent
    assert first["cost"]["cpu_s"] < 0.05  # one psutil sample: about a millisecond of CPU
    risk = [e for e in history if e["kind"] == "risk"]
    assert risk and {e["values"]["node"] for e in risk} == {first["node"]}
    last = risk[-1]["values"]
    assert last["straggler"]["absent"].startswith("2 rank(s)") and last["risk"] is not None
    assert last["level"] == "low" and {r["rank"] for r in last["ranks"]} == {0, 1}
    assert "no failure model configured" in last["failure"]["absent"]


def check_energy_report(client, job, cli: tuple | None = None) -> None:
    """The job's energy and carbon report: issued once, a PDF that shows its code and the estimate label,
    verified from the stored measurements; an altered stored figure or an altered PDF fails verification."""
    from pypdf import PdfReader

    from controlplane.green.certificate_models import GreenCertificate
    from workers.green.certificate import render_pdf

    r = client.post(f"/api/jobs/{job.pk}/certificate/")
    assert r.status_code == 201, r.content
    row = r.json()
    assert row["job"] == job.pk and row["estimate"] is True and row["kwh"] > 0 and row["kgco2e"] > 0
    again = client.post(f"/api/jobs/{job.pk}/certificate/")
    assert again.status_code == 200 and again.json()["code"] == row["code"]  # issued once
    assert [c["code"] for c in client.get("/api/certificates/").json()] == [row["code"]]
    pdf = client.get(row["pdf_url"])
    assert pdf.status_code == 200 and pdf["Content-Type"] == "application/pdf"
    data = b"".join(pdf.streaming_content) if pdf.streaming else pdf.content
    # the CLI writes the same PDF through the live server
    if cli is not None:
        url, token, out = cli
        done = subprocess.run(
            [sys.executable, "-m", "workers.cli", "green", "report", "--job", str(job.pk), "--url", url,
             "--out", str(out), "--json"],
            env={**os.environ, "CANN_TRAIN_TOKEN": token}, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["code"] == row["code"] and out.read_bytes() == data
    text = "\n".join(p.extract_text() for p in PdfReader(io.BytesIO(data)).pages)
    assert row["code"] in text and "estimate" in text.lower() and job.name in text
    ok = client.get(row["verify_url"]).json()
    assert ok["valid"] and ok["code_matches"] and ok["figures_match"] and ok["mismatches"] == [], ok
    # a code typed in lower case with spaces finds the same report
    assert client.get(f"/api/certificates/{row['code'].lower().replace('-', ' ')}/").status_code == 200
    upload = client.post(row["verify_url"], {"file": io.BytesIO(data)}, format="multipart")
    assert upload.status_code == 200 and upload.json()["valid"], upload.content
    # a PDF printed from an altered document fails against the stored one
    report = GreenCertificate.objects.get(job=job)
    forged = {**report.document, "results": {**report.document["results"], "kgco2e_location": 0.0000001}}
    bad_pdf = io.BytesIO(render_pdf(forged))
    bad_pdf.name = "forged.pdf"
    forged_check = client.post(row["verify_url"], {"file": bad_pdf}, format="multipart").json()
    assert not forged_check["valid"] and "results.kgco2e_location" in [
        m["field"] for m in forged_check["pdf"]["mismatches"]
    ]
    # any printed figure, not only the results table's: the header's last step moved on
    assert report.document["job"]["last_step"] > 0 and report.printed_text and report.printed_digest
    assert report.document["format_version"] == 2 and row["covers"] == "whole job"
    header = {**report.document, "job": {**report.document["job"]}}
    header["job"]["last_step"] = report.document["job"]["last_step"] + 100
    header_check = client.post(
        row["verify_url"], {"file": io.BytesIO(render_pdf(header))}, format="multipart"
    ).json()
    assert not header_check["valid"] and header_check["pdf"]["code_matches"], header_check
    assert [m["field"] for m in header_check["pdf"]["mismatches"]] == ["printed: last step"], header_check[
        "pdf"
    ]
    # a report issued before the printed text was stored gets it from its stored PDF at its first check
    GreenCertificate.objects.filter(pk=report.pk).update(printed_text="", printed_digest="")
    assert client.post(row["verify_url"], {"file": io.BytesIO(data)}, format="multipart").json()["valid"]
    assert GreenCertificate.objects.get(pk=report.pk).printed_text == report.printed_text
    check_public_verify(row["code"], data, render_pdf(header), job)
    junk = client.post(row["verify_url"], {"file": io.BytesIO(b"not a pdf")}, format="multipart")
    assert junk.status_code == 400 and "PDF" in str(junk.json())
    # an altered stored figure fails: against the measurements and the code
    check_report_page(job, row, data, bad_pdf.getvalue())
    report.document = forged
    report.save(update_fields=["document"])
    tampered = client.get(row["verify_url"]).json()
    assert not tampered["valid"] and not tampered["code_matches"] and not tampered["figures_match"]
    assert "results.kgco2e_location" in [m["field"] for m in tampered["mismatches"]]
    page = logged_in(job.created_by).get(row["page_url"])
    html = page.content.decode()
    assert page.status_code == 200 and 'data-valid="false"' in html and "Does not verify" in html
    assert '<tr data-field="results.kgco2e_location">' in html.split('id="mismatches"')[1]


def check_public_verify(code: str, pdf: bytes, forged_pdf: bytes, job) -> None:
    """The report says anyone holding it can check it: by its printed code, without a login, the same
    verdict, holding only what the PDF prints; an uploaded copy too; rate-limited per caller."""
    from django.contrib.auth.models import User
    from rest_framework.test import APIClient
    from rest_framework.throttling import ScopedRateThrottle

    from controlplane.accounts.services import token_issue

    anonymous = APIClient()
    url = f"/api/public/certificates/{code.lower().replace('-', ' ')}/verify"
    ok = anonymous.get(url)
    assert ok.status_code == 200, ok.content
    verdict = ok.json()
    assert verdict["valid"] and verdict["mismatches"] == [] and verdict["other_differences"] == 0
    assert verdict["job"] == {"id": job.pk, "name": job.name} and verdict["code"] == code
    assert "team" not in json.dumps(verdict) and job.team.slug not in json.dumps(verdict)
    genuine = anonymous.post(url, {"file": io.BytesIO(pdf)}, format="multipart")
    assert genuine.status_code == 200 and genuine.json()["valid"], genuine.content
    forged = anonymous.post(url, {"file": io.BytesIO(forged_pdf)}, format="multipart").json()
    assert not forged["valid"] and forged["pdf"]["mismatches"][0]["field"] == "printed: last step"
    assert anonymous.get("/api/public/certificates/ZZZZ-ZZZZ-ZZZZ-ZZZZ-ZZZZ/verify").status_code == 404
    assert anonymous.get(f"/api/certificates/{code}/verify").status_code in (
        401,
        403,
    )  # the team's full check
    # rate-limited per caller (here a user of no team: the public check needs none), with when to come back
    caller = APIClient()
    caller.credentials(
        HTTP_AUTHORIZATION=f"Token {token_issue(user=User.objects.create_user('holder'), name='t')[1]}"
    )
    saved = ScopedRateThrottle.THROTTLE_RATES  # read from the settings when DRF loaded: set here for a moment
    ScopedRateThrottle.THROTTLE_RATES = {"report-check": "3/min"}
    try:
        answers = [caller.get(url) for _ in range(4)]
    finally:
        ScopedRateThrottle.THROTTLE_RATES = saved
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert "throttled" in answers[-1].json()["detail"] and answers[-1].get("Retry-After")


def logged_in(user):
    from django.test import Client

    browser = Client()
    browser.force_login(user)
    return browser


def check_report_page(job, row, pdf: bytes, forged_pdf: bytes) -> None:
    """The report's page (what the job page's and the Green page's "verify" links open): its figures and
    the verdict, and a copy uploaded to its form checked the same way as by the API."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    browser = logged_in(job.created_by)
    assert row["page_url"] == f"/green/reports/{row['code']}/"
    page = browser.get(row["page_url"])
    html = page.content.decode()
    assert page.status_code == 200 and 'data-valid="true"' in html and "Verified." in html, html[-3000:]
    assert row["code"] in html and f'href="/jobs/{job.pk}/"' in html and 'id="report-estimate"' in html
    assert '<tr data-field="results.kwh.facility">' in html and row["pdf_url"] in html
    checked = browser.post(row["page_url"], {"file": SimpleUploadedFile("r.pdf", pdf, "application/pdf")})
    html = checked.content.decode()
    assert checked.status_code == 200 and 'data-valid="true"' in html and "the uploaded PDF" in html
    forged = browser.post(
        row["page_url"], {"file": SimpleUploadedFile("f.pdf", forged_pdf, "application/pdf")}
    )
    html = forged.content.decode()
    assert (
        forged.status_code == 200
        and 'data-valid="false"' in html
        and "does not show the stored report" in html
    )
    assert '<tr data-field="results.kgco2e_location">' in html.split('id="pdf-mismatches"')[1]
    for junk, words in ((b"not a pdf", "not a PDF"), (b"%PDF-1.7 broken", "cannot be read"), (b"", "empty")):
        bad = browser.post(row["page_url"], {"file": SimpleUploadedFile("j.pdf", junk, "application/pdf")})
        html = bad.content.decode()
        assert bad.status_code == 400 and words in html, html[-2000:]
        # one clear failure: no green "Verified." of the stored copy beside the error
        assert 'data-valid="false"' in html and "Not verified: the uploaded file could not be checked" in html
        assert 'class="verdict ok"' not in html
    missing = browser.post(row["page_url"], {})
    assert missing.status_code == 400 and "This field is required" in missing.content.decode()
    assert "Not verified" in missing.content.decode()
    assert browser.get("/green/reports/NOT-A-CODE/").status_code == 404


def test_invalid_job_is_a_400_naming_the_field(live_stack, alice_api):
    bad = job_payload()
    bad["strategy"] = {**bad["strategy"], "tp": 3}
    r = alice_api.post("/api/jobs/", bad, format="json")
    assert r.status_code == 400 and "strategy.tp" in r.json()
    r = alice_api.post("/api/jobs/", {**job_payload(), "nnodes": 3}, format="json")
    assert r.status_code == 400 and "nnodes" in r.json()
    r = alice_api.post("/api/jobs/", {**job_payload(), "model": "big"}, format="json")
    assert r.status_code == 400 and "model" in r.json()
    r = alice_api.post(
        "/api/jobs/", {k: v for k, v in job_payload().items() if k != "strategy"}, format="json"
    )
    assert r.status_code == 400 and "strategy" in r.json()


def test_cancel_stops_every_process(live_stack, alice_api):
    r = alice_api.post("/api/jobs/", job_payload(steps=100000), format="json")
    job_id = r.json()["id"]
    wait_for_state(job_id, {"running"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(processes_of(job_id)) < 3:  # agent + 2 ranks
        time.sleep(0.2)
    assert len(processes_of(job_id)) >= 3
    assert alice_api.post(f"/api/jobs/{job_id}/cancel/").status_code == 202
    job = wait_for_state(job_id, {"cancelled", "failed", "succeeded"}, timeout=60)
    assert job.state == "cancelled"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and processes_of(job_id):
        time.sleep(0.2)
    assert processes_of(job_id) == []
    r = alice_api.post(f"/api/jobs/{job_id}/cancel/")
    assert r.status_code == 400 and "already ended" in r.json()["state"][0]


def test_killed_worker_leaves_the_job_failed_and_relaunchable(make_member, token_for, django_db_blocker):
    """A stack (on its own Redis database, so no other worker can take the job) whose only training
    worker is SIGKILLed mid-run: the job ends failed, not stuck "running", says why, its ranks are
    gone, and a relaunch on a fresh worker succeeds."""
    token = token_for(make_member("alice", "Team A"))
    with django_db_blocker.unblock():
        db_url = database_url_for_children()
    redis_url = os.environ["REDIS_URL"].rsplit("/", 1)[0] + "/3"
    os.environ["CANN_TRAIN_HEARTBEAT_TIMEOUT_S"] = "6"
    try:
        stack = start_stack(
            redis_url=redis_url, database_url=db_url, name="kill", worker_queues="default,training"
        )
    finally:
        del os.environ["CANN_TRAIN_HEARTBEAT_TIMEOUT_S"]
    try:
        stack.wait_healthy()
        status, body = http("POST", stack.base_url + "/api/jobs/", token, job_payload(steps=100000))
        assert status == 201, body
        job_id = body["id"]
        wait_for_state(job_id, {"running"})
        os.killpg(stack.procs["worker"].pid, signal.SIGKILL)
        job = wait_for_state(job_id, {"failed", "succeeded", "cancelled"}, timeout=90)
        assert job.state == "failed"
        assert "stopped answering" in job.human_readable_error and "Relaunch" in job.human_readable_error
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and processes_of(job_id):
            time.sleep(0.3)
        assert processes_of(job_id) == []
        assert http("GET", f"{stack.base_url}/api/jobs/{job_id}/", token)[1]["state"] == "failed"
        # a new worker on the same broker takes the relaunched attempt
        stack.procs["worker"] = __import__("subprocess").Popen(
            stack.procs["worker"].args,
            cwd=Path(__file__).resolve().parents[2],
            env=stack.env,
            stdout=stack.logs["worker"].open("ab"),
            stderr=-2,
            start_new_session=True,
        )
        status, body = http("POST", f"{stack.base_url}/api/jobs/{job_id}/relaunch/", token)
        assert status == 202 and body["attempts"] == 2, body
        wait_for_state(job_id, {"running"})  # the fresh worker took the new attempt
        status, body = http("POST", f"{stack.base_url}/api/jobs/{job_id}/cancel/", token)
        assert status == 202
        job = wait_for_state(job_id, {"cancelled"}, timeout=90)
        assert job.attempts == 2
    finally:
        stop_stack(stack)


def test_relaunch_after_failure(live_stack, alice_api):
    from controlplane.jobs.services import job_fail

    r = alice_api.post("/api/jobs/", job_payload(steps=3), format="json")
    job_id = r.json()["id"]
    job = wait_for_state(job_id, {"succeeded", "failed"})
    assert job.state == "succeeded"
    r = alice_api.post(f"/api/jobs/{job_id}/relaunch/")
    assert r.status_code == 400  # a succeeded job is not relaunched
    job_fail(job_id=job_id, human="pretend")  # no-op: it already ended
    job = wait_for_state(job_id, {"succeeded"})
    assert job.attempts == 1


@pytest.mark.long
def test_two_workers_as_two_nodes_run_one_job(live_stack, alice_api):
    """One Celery worker per "node" (own node queue), one torchrun agent each, one c10d rendezvous."""
    import subprocess

    from controlplane.stack import worker_command

    root = Path(__file__).resolve().parents[2]
    workers = []
    for name in ("node-a", "node-b"):
        env = {**live_stack.env, "CANN_TRAIN_NODE": name}
        cmd = worker_command(
            queues=f"node.{name}",
            concurrency=2,
            name=f"{name}-{os.getpid()}@%h",
            pool="threads",
            quick_start=True,
        )
        log = Path(live_stack.logs["worker"]).with_name(f"{name}.log")
        workers.append(
            subprocess.Popen(
                cmd,
                cwd=root,
                env=env,
                stdout=log.open("wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    try:
        from controlplane.jobs.selectors import online_node_queues

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(online_node_queues()) < 2:
            time.sleep(0.5)
        assert online_node_queues() == ["node.node-a", "node.node-b"]
        r = alice_api.post("/api/jobs/", job_payload(steps=4, nnodes=2), format="json")
        assert r.status_code == 201, r.content
        assert r.json()["nproc_per_node"] == 1
        job = wait_for_state(r.json()["id"], {"succeeded", "failed"})
        assert job.state == "succeeded", (job.human_readable_error, job.log_tail)
        nodes = alice_api.get(f"/api/jobs/{job.pk}/").json()["nodes"]
        assert [(n["node_rank"], n["node_name"], n["state"], n["exit_code"]) for n in nodes] == [
            (0, "node-a", "succeeded", 0),
            (1, "node-b", "succeeded", 0),
        ]
        assert job.measured["world_size"] == 2
    finally:
        from controlplane.stack import stop

        stop(workers)
