"""Jobs launched through a real Slurm (``CANN_TRAIN_LAUNCHER=slurm``): a one-node cluster of this machine
(munged, slurmctld and slurmd from Debian's packages, ``make slurm``), the control plane's own stack (daphne,
a Celery worker that sbatches, the relay that follows Slurm) and the ranks on the Slurm node publishing to
the stack's Redis. Kubernetes: against the cluster ``KUBECONFIG`` names, when it has the PyTorchJob CRD."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.conftest import database_url_for_children, http, own_redis_db, start_stack, stop_stack, wait_for
from tests.integration.test_jobs import job_payload

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo")
NODE_CPUS = 4
"""CPUs the test node offers (SlurmdParameters=config_overrides: Slurm takes them as configured): two 2-rank
jobs at once, so a test need not wait for the previous one's processes to be gone."""


@dataclass
class SlurmCluster:
    conf: Path
    env: dict

    def scontrol_job(self, job_id: str) -> dict:
        from workers.deploy.slurm import parse_fields

        out = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return parse_fields(out.splitlines()[0])


def _free_port() -> int:
    from controlplane.stack import free_port

    return free_port()


def _slurm_conf(d: Path, host: str) -> str:
    # slurm.conf(5); one node, no cgroups (proctrack/linuxproc, task/none: works in a container), no
    # accounting; everything in the test's directory; the node back in service as soon as slurmd registers
    return f"""ClusterName=canntest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={host} NodeAddr=127.0.0.1 CPUs={NODE_CPUS} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    """munged + slurmctld + slurmd of this machine, on a temporary slurm.conf; stopped at the end."""
    missing = [b for b in SLURM_BINARIES if shutil.which(b) is None]
    if missing:
        pytest.skip(
            f"Slurm is not installed here ({', '.join(missing)} missing): `make slurm` installs Debian's "
            "slurmctld, slurmd, slurm-client and munge"
        )
    if os.geteuid() != 0:
        pytest.skip("the test cluster runs slurmd as root (SlurmdUser=root: it starts jobs as their user)")
    d = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (d / sub).mkdir()
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))  # munged(8): a key of 1024 random bytes, readable by its owner only
    key.chmod(0o600)
    host = socket.gethostname().split(".")[0]
    conf = d / "slurm.conf"
    conf.write_text(_slurm_conf(d, host))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    logs = {name: (d / f"{name}.out").open("wb") for name in ("munged", "slurmctld", "slurmd")}
    procs: list[subprocess.Popen] = []

    def start(name: str, argv: list[str]) -> None:
        procs.append(
            subprocess.Popen(
                argv, env=env, stdout=logs[name], stderr=subprocess.STDOUT, start_new_session=True
            )
        )

    try:
        # -F foreground, -f: run as root
        start(
            "munged",
            [
                "munged",
                "-F",
                "-f",
                f"--key-file={key}",
                f"--socket={d}/munge.sock",
                f"--pid-file={d}/munged.pid",
            ]
            + [f"--seed-file={d}/munged.seed", f"--log-file={d}/munged.log"],
        )
        wait_for(lambda: (d / "munge.sock").exists(), 20, "munged's socket")
        start("slurmctld", ["slurmctld", "-D", "-c"])  # -c: no state from an earlier run
        start("slurmd", ["slurmd", "-D"])

        def node_idle() -> bool:
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(
                        f"{p.args[0]} exited: {(d / (p.args[0] + '.out')).read_text()[-2000:]}"
                    )
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
            return out.stdout.strip() == "idle"

        wait_for(node_idle, 60, "the Slurm node to be idle")
        yield SlurmCluster(conf=conf, env=env)
    finally:
        subprocess.run(["scancel", "--user=root"], env=env, capture_output=True, timeout=30, check=False)
        for p in reversed(procs):  # slurmd, then slurmctld, then munged
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for f in logs.values():
            f.close()


@pytest.fixture(scope="module")
def slurm_stack(slurm_cluster, django_db_setup, django_db_blocker):
    """The control plane with CANN_TRAIN_LAUNCHER=slurm, on its own Redis database (so no other stack's worker
    takes its launches); its relay asks Slurm every second."""
    with django_db_blocker.unblock():
        db_url = database_url_for_children()
    stack = start_stack(
        redis_url=own_redis_db(14),
        database_url=db_url,
        name="slurm",
        worker_queues="default,training",
        concurrency=2,
        extra_env={
            "CANN_TRAIN_LAUNCHER": "slurm",
            "SLURM_CONF": str(slurm_cluster.conf),
            "CANN_TRAIN_EXTERNAL_FOLLOW_EVERY_S": "1",
            "CANN_TRAIN_SLURM_PYTHON": sys.executable,
        },
    )
    try:
        stack.wait_healthy()
        yield stack
    finally:
        stop_stack(stack)


@pytest.fixture
def token(make_member, token_for):
    return token_for(make_member("sam", "Team S"))


def submit(stack, token: str, **extra) -> dict:
    status, job = http("POST", stack.base_url + "/api/jobs/", token, job_payload(**extra))
    assert status == 201, job
    return job


def job_row(job_id: int):
    from controlplane.jobs.models import TrainingJob

    return TrainingJob.objects.get(pk=job_id)


def ended(job_id: int, timeout: float = 180):
    return wait_for(lambda: (j := job_row(job_id)).is_finished and j, timeout, f"job {job_id} to end")


def stored(job_id: int, kind: str) -> list:
    from controlplane.live.models import StreamEvent

    return list(StreamEvent.objects.filter(stream=f"job/{job_id}", kind=kind).order_by("seq"))


RUNTIME_STATES = ("started", "finished")
"""The ranks' own lifecycle events (``workers.training.metrics``), beside the control plane's job states."""


def states_of(job_id: int) -> list[str]:
    events = stored(job_id, "event")
    return [e.values["state"] for e in events if e.values.get("state") not in (None, *RUNTIME_STATES)]


def slurm_id_of(job_id: int) -> str:
    return wait_for(lambda: job_row(job_id).external_id, 60, "the Slurm job id")


def test_a_job_runs_through_slurm_and_follows_its_state(slurm_cluster, slurm_stack, token):
    job = submit(slurm_stack, token, steps=4)
    slurm_id = slurm_id_of(job["id"])
    row = ended(job["id"])
    assert row.state == "succeeded", (row.human_readable_error, row.log_tail[-3000:])
    assert row.launcher == "slurm" and row.external_state == "COMPLETED"
    # Slurm ran it: its own record says so, and its output file is where the job was submitted from
    record = slurm_cluster.scontrol_job(slurm_id)
    assert (record["JobState"], record["ExitCode"], record["JobName"]) == (
        "COMPLETED",
        "0:0",
        f"cann-train-job{job['id']}-a1",
    )
    assert Path(record["StdOut"]).is_file() and f"/jobs/{job['id']}/attempt-1" in record["StdOut"]
    # the job's states followed Slurm's, through the same events a local job has
    wait_for(lambda: "succeeded" in states_of(job["id"]), 30, "the succeeded event stored")
    assert states_of(job["id"]) == ["queued", "launching", "running", "succeeded"]
    submitted = [e.values for e in stored(job["id"], "event") if e.values.get("external_id")]
    assert submitted and submitted[0]["external_id"] == slurm_id
    # the ranks on the Slurm node published their metrics on the job's stream ...
    train = [e for e in stored(job["id"], "train") if e.values.get("attempt") == 1]
    assert [e.step for e in train] == [1, 2, 3, 4]
    # ... and rank 0's summary is the job's measurement: its last loss is the last train event's
    assert row.measured["steps"] == 4 and row.measured["world_size"] == 2
    assert row.measured["loss_last"] == pytest.approx(train[-1].values["loss"])
    assert "step " in row.log_tail  # the job's output, torchrun's noise left out
    assert [n.state for n in row.nodes.filter(attempt=1)] == ["succeeded"]


def test_a_users_own_script_runs_through_slurm_without_the_control_planes_secrets(
    slurm_cluster, slurm_stack, token, code_dir
):
    """An entrypoint job on Slurm: the DDP example (two ranks, the SDK) trains with live charts and its
    summary; a probe script finds none of the control plane's secrets in its environment (sbatch ran with
    the worker's scrubbed one) and no way onto the other job's stream (the job's own Redis credential)."""
    root = Path(__file__).resolve().parents[2]
    shutil.copy(root / "examples" / "sdk" / "ddp_loop.py", code_dir / "ddp_loop.py")
    shutil.copy(root / "tests" / "data" / "user_code" / "probe.py", code_dir / "probe.py")
    body = {
        "name": "ddp loop on slurm",
        "entrypoint": {
            "script": str(code_dir / "ddp_loop.py"),
            "args": ["--steps", "6"],
            "nproc_per_node": 2,
        },
        "steps": 6,
        "device": "cpu",
    }
    status, job = http("POST", slurm_stack.base_url + "/api/jobs/", token, body)
    assert status == 201, job
    row = ended(job["id"])
    assert row.state == "succeeded", (row.human_readable_error, row.log_tail[-3000:])
    assert row.launcher == "slurm" and row.external_state == "COMPLETED"
    train = [e for e in stored(job["id"], "train") if e.values.get("attempt") == 1]
    assert [e.step for e in train] == [1, 2, 3, 4, 5, 6] and all("loss" in e.values for e in train)
    [started] = [e.values for e in stored(job["id"], "event") if e.values.get("state") == "started"]
    assert started["entrypoint"] is True and started["world_size"] == 2
    assert row.measured["world_size"] == 2 and row.measured["loss_last"] == pytest.approx(
        train[-1].values["loss"]
    )

    probe = {
        "name": "probe on slurm",
        "entrypoint": {"script": str(code_dir / "probe.py")},
        "steps": 1,
        "device": "cpu",
        "hyperparameters": {"other_stream": f"job/{job['id']}"},
    }
    status, probed = http("POST", slurm_stack.base_url + "/api/jobs/", token, probe)
    assert status == 201, probed
    row = ended(probed["id"])
    assert row.state == "succeeded", (row.human_readable_error, row.log_tail[-3000:])
    [step] = [e.values for e in stored(probed["id"], "train")]
    assert not any(step[f"env_{k}"] for k in ("SECRET_KEY", "DATABASE_URL", "REDIS_URL", "METRICS_TOKEN")), (
        step
    )
    assert step["refused"] == "publish,xadd,read" and step["cwd"] == str(code_dir)
    assert not [e for e in stored(job["id"], "event") if e.values.get("from") == "probe"]


def _ranks_of(job_id: int, slurm_id: str) -> list[psutil.Process]:
    """The job's rank processes: ``python -u -m workers.training.run --config <its config>`` (torchrun's
    children; srun and torchrun carry the config path in their command lines too)."""
    config = f"cann-train-job{job_id}-a1-{slurm_id}.json"
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if cmd[1:4] == ["-u", "-m", "workers.training.run"] and any(config in part for part in cmd):
            found.append(p)
    return found


def test_a_cancelled_and_a_failed_job_end_as_slurm_says(slurm_cluster, slurm_stack, token):
    """Two long jobs at once (the node has CPUs for both): one cancelled through the API, one whose rank is
    killed; Slurm's record and the job's row agree on how each ended."""
    cancel, kill = (submit(slurm_stack, token, steps=100000)["id"] for _ in range(2))
    ids = {job_id: slurm_id_of(job_id) for job_id in (cancel, kill)}
    for job_id in ids:
        wait_for(lambda j=job_id: stored(j, "train"), 180, f"job {job_id}'s first train event")

    # a cancel: scancel, and the job settles as cancelled once Slurm says so
    status, _ = http("POST", f"{slurm_stack.base_url}/api/jobs/{cancel}/cancel/", token)
    assert status == 202
    # a rank killed: torchrun fails, srun --kill-on-bad-exit ends the step, the batch script exits non-zero
    ranks = wait_for(lambda: _ranks_of(kill, ids[kill]), 30, "the job's rank processes")
    assert len(ranks) == 2
    os.kill(ranks[0].pid, signal.SIGKILL)

    row = ended(cancel, timeout=90)
    assert row.state == "cancelled" and row.human_readable_error == "Cancelled by sam."
    assert slurm_cluster.scontrol_job(ids[cancel])["JobState"] == "CANCELLED"

    row = ended(kill, timeout=90)
    assert row.state == "failed"
    record = slurm_cluster.scontrol_job(ids[kill])
    assert (record["JobState"], record["Reason"]) == ("FAILED", "NonZeroExitCode")
    code = int(record["ExitCode"].split(":")[0])
    assert code != 0
    assert row.human_readable_error.startswith(
        f"Slurm job {ids[kill]} ended FAILED (NonZeroExitCode), exit code {code}."
    ), row.human_readable_error
    assert row.error and row.exit_codes == [{"attempt": 1, "node_rank": 0, "code": code}]
    for job_id, slurm_id in ids.items():
        assert wait_for(
            lambda j=job_id, s=slurm_id: not _ranks_of(j, s), 30, f"job {job_id}'s ranks to be gone"
        )


def test_the_reaper_leaves_the_jobs_a_scheduler_runs_alone(make_member):
    """A job Slurm runs sends no heartbeats: its liveness is Slurm's state, so the reaper must not fail it.

    The job is made up (Slurm never ran a job 7 for it): the relays of the stacks running on this test
    database are paused meanwhile, or their follower (``follow_external_jobs``) rightly fails it as a job
    Slurm does not know (CI: it did, between the reap and the check)."""
    from datetime import timedelta

    from controlplane.jobs.models import TrainingJob
    from controlplane.jobs.services import reap_orphans
    from tests.conftest import relays_paused
    from tests.integration.test_job_reaper import running_job

    team = make_member("ria", "Team R").teams.first()
    with relays_paused():
        local, on_slurm = (running_job(team, "anywhere", heartbeat_age_s=6) for _ in range(2))
        TrainingJob.objects.filter(pk=on_slurm.pk).update(launcher="slurm", external_id="7")
        assert reap_orphans(stale_after=timedelta(seconds=4)) == [local.pk]
        assert TrainingJob.objects.get(pk=on_slurm.pk).state == "running"
        TrainingJob.objects.filter(pk=on_slurm.pk).update(state="cancelled")  # nothing left for a follower


def test_a_job_slurm_no_longer_knows_fails_saying_so(slurm_cluster, make_member, monkeypatch):
    from controlplane.jobs.models import TrainingJob
    from controlplane.jobs.services.follow import follow_external_jobs
    from tests.integration.test_job_reaper import running_job

    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    job = running_job(make_member("uma", "Team U").teams.first(), "anywhere", heartbeat_age_s=1)
    TrainingJob.objects.filter(pk=job.pk).update(launcher="slurm", external_id="999999")
    assert follow_external_jobs() == [job.pk]
    job = TrainingJob.objects.get(pk=job.pk)
    assert job.state == "failed"
    assert job.human_readable_error.startswith("Slurm no longer knows job 999999"), job.human_readable_error


@pytest.mark.skipif(
    not os.environ.get("KUBECONFIG"),
    reason="no Kubernetes cluster: set KUBECONFIG to one with the Kubeflow Training Operator (PyTorchJob CRD)",
)
def test_a_pytorchjob_runs_through_kubernetes():
    """Submit render_kubernetes's objects for a 2-rank CPU job, follow the PyTorchJob to its end, delete it."""
    from workers.deploy import launchers
    from workers.deploy.kubernetes import PyTorchJobs
    from workers.deploy.launchers import SchedulerError, job_deployment
    from workers.deploy.render import render_kubernetes
    from workers.training.examples import example

    namespace = os.environ.get("CANN_TRAIN_K8S_NAMESPACE", "default")
    try:
        jobs = PyTorchJobs(namespace)
        jobs.custom.list_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs")
    except Exception as exc:  # noqa: BLE001 - a cluster without the CRD, or unreachable
        pytest.skip(f"KUBECONFIG's cluster has no usable PyTorchJob API: {exc}")
    config = {"model": example("tiny-dense.json"), "strategy": example("dp2.json"), "steps": 3}
    dep = job_deployment(
        config,
        name=f"cann-train-test-{os.getpid()}",
        job_id=1,
        attempt=1,
        redis_url="redis://127.0.0.1:1/0",  # the ranks publish nowhere: the job's state is what is followed
        nnodes=1,
        nproc_per_node=2,
        device="cpu",
        image=os.environ.get("CANN_TRAIN_K8S_IMAGE", "cann-train:latest"),
    )
    name = jobs.submit(render_kubernetes(dep))
    try:
        state = wait_for(
            lambda: (s := jobs.state(name)).finished and s, 600, "the PyTorchJob to end", every=3
        )
        assert state.state == launchers.SUCCEEDED, (state.detail, jobs.log_tail(name))
    finally:
        try:
            jobs.cancel(name)
        except SchedulerError:
            pass
    assert wait_for(lambda: jobs.state(name).state == launchers.GONE, 60, "the PyTorchJob deleted")
