"""The external launchers' pure parts: Slurm's ``scontrol show job -o`` and the training operator's
PyTorchJob status in the launchers' state vocabulary, the job config a launched attempt carries, and the
Kubernetes client sending exactly ``render_kubernetes``'s objects (to a recording HTTP server standing in
for an API server, which cannot run here); the launcher setting's start-up check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from workers.deploy import launchers
from workers.deploy.kubernetes import PyTorchJobs, pytorchjob_state
from workers.deploy.launchers import job_deployment
from workers.deploy.render import render_kubernetes, render_slurm
from workers.deploy.slurm import exit_code_of, job_state, parse_fields

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "workers" / "training" / "examples"
SCONTROL = json.loads((ROOT / "tests" / "data" / "slurm" / "scontrol_show_job.json").read_text())
CONFIG = {
    "model": json.loads((EXAMPLES / "tiny-dense.json").read_text()),
    "strategy": json.loads((EXAMPLES / "dp2.json").read_text()),
    "training": json.loads((EXAMPLES / "training.json").read_text()),
    "steps": 4,
    "lr": 0.001,
    "seed": 7,
}


# --- Slurm --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "captured, state, detail, exit_code",
    [
        ("PENDING", launchers.QUEUED, "PENDING (BeginTime)", None),
        ("RUNNING", launchers.RUNNING, "RUNNING", None),
        ("COMPLETED", launchers.SUCCEEDED, "COMPLETED", 0),
        ("FAILED", launchers.FAILED, "FAILED (NonZeroExitCode)", 3),
        ("CANCELLED", launchers.CANCELLED, "CANCELLED", 128 + 15),  # ExitCode=0:15: SIGTERM
    ],
)
def test_scontrol_output_maps_to_the_job_states(captured, state, detail, exit_code):
    line = SCONTROL[captured]
    got = job_state(line, parse_fields(line)["JobId"])
    assert (got.state, got.detail, got.exit_code) == (state, detail, exit_code)


def test_scontrol_fields_keep_values_with_spaces_and_odd_keys():
    fields = parse_fields(SCONTROL["FAILED"])
    assert fields["CPUs/Task"] == "2" and fields["ReqB:S:C:T"] == "0:0:*:*" and fields["AllocNode:Sid"]
    assert fields["StdOut"] == "/tmp/slurmproto/t1-1.out" and fields["NodeList"] == "vm"
    spaced = SCONTROL["FAILED"].replace("Command=/tmp/slurmproto/t.sh", "Command=/tmp/a dir/t.sh --x=1")
    assert parse_fields(spaced)["Command"] == "/tmp/a dir/t.sh --x=1"
    assert job_state(SCONTROL["FAILED"], "1").log_path == "/tmp/slurmproto/t1-1.out"


@pytest.mark.parametrize(
    "slurm_state, reason, state",
    [
        # squeue(1) "JOB STATE CODES", with the reasons Slurm gives them (slurm_reason_string)
        ("CONFIGURING", "None", launchers.LAUNCHING),
        ("COMPLETING", "None", launchers.RUNNING),
        ("TIMEOUT", "TimeLimit", launchers.FAILED),
        ("NODE_FAIL", "NodeDown", launchers.FAILED),
        ("OUT_OF_MEMORY", "OutOfMemory", launchers.FAILED),
        ("BOOT_FAIL", "None", launchers.FAILED),
        ("DEADLINE", "DeadLine", launchers.FAILED),
        ("PREEMPTED", "None", launchers.FAILED),
        ("REQUEUED", "BeginTime", launchers.QUEUED),
        ("SOMETHING_NEW", "None", launchers.UNKNOWN),
    ],
)
def test_every_slurm_state_has_its_place(slurm_state, reason, state):
    line = SCONTROL["FAILED"].replace(
        "JobState=FAILED Reason=NonZeroExitCode", f"JobState={slurm_state} Reason={reason}"
    )
    got = job_state(line, "1")
    assert got.state == state
    if state == launchers.FAILED and reason != "None":
        assert got.detail == f"{slurm_state} ({reason})" and got.reason == reason


def test_slurm_exit_codes_read_as_a_shell_does():
    assert [exit_code_of(v) for v in ("0:0", "3:0", "0:9", "1:15", "")] == [0, 3, 137, 143, None]


def test_no_output_for_an_id_is_gone():
    assert job_state("", "42").state == launchers.GONE


# --- Kubernetes ---------------------------------------------------------------------------------------
def _condition(kind: str, status: str, reason: str, message: str) -> dict:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2024-06-21T04:41:27Z",
        "lastUpdateTime": "2024-06-21T04:41:27Z",
    }


CREATED = _condition("Created", "True", "PyTorchJobCreated", "PyTorchJob pytorch-simple is created.")
RUNNING = _condition("Running", "True", "PyTorchJobRunning", "PyTorchJob pytorch-simple is running.")
# the status of a finished job as the Kubeflow docs show it ("PyTorch Training (PyTorchJob)", the
# pytorch-simple example): Running back to "False" beside Succeeded "True"
SUCCEEDED_STATUS = {
    "completionTime": "2024-06-21T05:00:37Z",
    "conditions": [
        CREATED,
        {**RUNNING, "status": "False"},
        _condition(
            "Succeeded", "True", "PyTorchJobSucceeded", "PyTorchJob pytorch-simple is successfully completed."
        ),
    ],
    "replicaStatuses": {"Worker": {"succeeded": 1}},
    "startTime": "2024-06-21T04:41:27Z",
}
# the operator's failure message (pytorchjob_controller.go: "PyTorchJob %s/%s has failed because %d %s
# replica(s) failed.") and restart message ("... is restarting because %d %s replica(s) failed.")
FAILED_MESSAGE = "PyTorchJob default/pytorch-simple has failed because 1 Worker replica(s) failed."
FAILED_STATUS = {
    "conditions": [
        CREATED,
        {**RUNNING, "status": "False"},
        _condition("Failed", "True", "PyTorchJobFailed", FAILED_MESSAGE),
    ]
}
RESTARTING_STATUS = {
    "conditions": [
        CREATED,
        {**RUNNING, "status": "False"},
        _condition(
            "Restarting",
            "True",
            "PyTorchJobRestarting",
            "PyTorchJob pytorch-simple is restarting because 1 Worker replica(s) failed.",
        ),
    ]
}


@pytest.mark.parametrize(
    "status, state",
    [
        (None, launchers.QUEUED),
        ({"conditions": [CREATED]}, launchers.LAUNCHING),
        ({"conditions": [CREATED, RUNNING]}, launchers.RUNNING),
        (RESTARTING_STATUS, launchers.RUNNING),
        (
            {
                "conditions": [
                    CREATED,
                    _condition("Suspended", "True", "PyTorchJobSuspended", "PyTorchJob x is suspended."),
                ]
            },
            launchers.QUEUED,
        ),
        (SUCCEEDED_STATUS, launchers.SUCCEEDED),
        (FAILED_STATUS, launchers.FAILED),
    ],
)
def test_pytorchjob_conditions_map_to_the_job_states(status, state):
    doc = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "pytorch-simple"}}
    got = pytorchjob_state({**doc, **({"status": status} if status is not None else {})})
    assert got.state == state
    if state == launchers.FAILED:
        assert got.reason == FAILED_MESSAGE and got.exit_code == 1


class _FakeApiServer(BaseHTTPRequestHandler):
    """Records each request (method, path, JSON body) and answers from ``replies`` (path -> (code, doc))."""

    requests: list = []
    replies: dict = {}

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        path = self.path.split("?")[0]
        self.requests.append((self.command, path, body))
        code, doc = self.replies.get((self.command, path), (200, body or {}))
        data = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def api_server():
    from kubernetes import client

    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeApiServer)
    _FakeApiServer.requests, _FakeApiServer.replies = [], {}
    threading.Thread(target=server.serve_forever, daemon=True).start()
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_port}"
    try:
        yield _FakeApiServer, client.ApiClient(configuration)
    finally:
        server.shutdown()


def _deployment(attempt: int = 2):
    return job_deployment(
        CONFIG,
        name="cann-train-job42-a2",
        job_id=42,
        attempt=attempt,
        redis_url="redis://redis.internal:6379/0",
        nnodes=1,
        nproc_per_node=2,
        device="cpu",
        image="registry.example/cann-train:1",
    )


def test_the_kubernetes_launcher_creates_exactly_the_rendered_objects(api_server):
    recorder, api = api_server
    objects = render_kubernetes(_deployment())
    jobs = PyTorchJobs("ml", client=api)
    assert jobs.submit(objects) == "cann-train-job42-a2"
    assert recorder.requests == [
        ("POST", "/api/v1/namespaces/ml/configmaps", objects[0]),
        ("POST", "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs", objects[1]),
    ]
    # the job config the pods mount is the job's, with what the control plane adds for its stream
    mounted = json.loads(objects[0]["data"]["job.json"])
    assert (mounted["job_id"], mounted["redis_url"], mounted["attempt"]) == (
        "42",
        "redis://redis.internal:6379/0",
        2,
    )
    assert (mounted["lr"], mounted["seed"], mounted["steps"], mounted["device"]) == (0.001, 7, 4, "cpu")

    path = "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs/cann-train-job42-a2"
    recorder.replies[("GET", path)] = (200, {**objects[1], "status": FAILED_STATUS})
    assert jobs.state("cann-train-job42-a2").state == launchers.FAILED
    recorder.replies[("GET", path)] = (404, {"kind": "Status", "code": 404, "reason": "NotFound"})
    assert jobs.state("cann-train-job42-a2").state == launchers.GONE
    recorder.requests.clear()
    recorder.replies[("DELETE", path)] = (404, {"kind": "Status", "code": 404})
    jobs.cancel("cann-train-job42-a2")  # already gone: fine
    assert [(m, p) for m, p, _ in recorder.requests] == [
        ("DELETE", path),
        ("DELETE", "/api/v1/namespaces/ml/configmaps/cann-train-job42-a2-config"),
    ]
    recorder.replies[("GET", path)] = (500, {"kind": "Status", "code": 500, "message": "etcd is down"})
    with pytest.raises(launchers.SchedulerError, match="500"):
        jobs.state("cann-train-job42-a2")


def test_the_slurm_script_writes_the_jobs_config_with_its_stream_and_attempt():
    script = render_slurm(_deployment(attempt=3))
    heredoc = script.split("<<'CANN_TRAIN_JOB_CONFIG'\n", 1)[1].split("\nCANN_TRAIN_JOB_CONFIG", 1)[0]
    written = json.loads(heredoc)
    assert (written["job_id"], written["attempt"], written["redis_url"]) == (
        "42",
        3,
        "redis://redis.internal:6379/0",
    )
    assert written["model"] == CONFIG["model"] and written["seed"] == 7
    assert "#SBATCH --cpus-per-task=2" in script and "--nproc-per-node=2" in script


def test_a_bad_launcher_setting_stops_the_start_with_the_choices():
    env = {**os.environ, "CANN_TRAIN_LAUNCHER": "pbs", "DJANGO_SETTINGS_MODULE": "controlplane.settings"}
    proc = subprocess.run(
        [sys.executable, "-c", "import controlplane.settings"],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode != 0
    assert "CANN_TRAIN_LAUNCHER must be one of local, slurm, kubernetes, got 'pbs'" in proc.stderr
