"""Launch a rendered batch script (:func:`workers.deploy.render.render_slurm`) through Slurm's own commands and
follow it: ``sbatch --parsable`` submits, ``scontrol show job -o`` reports, ``scancel`` cancels, and the
job's ``StdOut`` file is its log. Slurm's tools find the cluster the usual way (``SLURM_CONF``, or
``/etc/slurm/slurm.conf``, or DNS SRV records).

States (``squeue(1)``, "JOB STATE CODES") in the launchers' vocabulary (:mod:`workers.deploy.launchers`):
pending -> queued, configuring -> launching, running / completing -> running, completed -> succeeded,
cancelled -> cancelled, any of :data:`FAILED_STATES` -> failed (with Slurm's ``Reason``); an id
``scontrol`` answers "Invalid job id specified" to (purged ``MinJobAge`` after it ended, default 300 s,
``slurm.conf(5)``) -> gone.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from workers.deploy.launchers import (
    CANCELLED,
    FAILED,
    GONE,
    LAUNCHING,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    UNKNOWN,
    ExternalState,
    SchedulerError,
)

COMMAND_TIMEOUT_S = 60.0
"""How long one Slurm command may take: slurm.conf's ``MessageTimeout`` (default 10 s) per RPC, a few
retries (``sbatch`` retries a busy controller)."""

QUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
LAUNCHING_STATES = frozenset({"CONFIGURING"})  # nodes allocated, booting / being configured
RUNNING_STATES = frozenset(
    {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING", "SUSPENDED", "STOPPED"}
)
FAILED_STATES = frozenset(
    {
        "FAILED",
        "NODE_FAIL",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "SPECIAL_EXIT",
        "REVOKED",
    }
)
UNKNOWN_ID = "Invalid job id specified"
"""What ``scontrol show job`` says (exit code 1) for an id slurmctld does not hold (``slurm_strerror``)."""

# a key of scontrol's one-line output: "JobId=", "AllocNode:Sid=", "CPUs/Task=", "ReqB:S:C:T=" ...
_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=")


def parse_fields(line: str) -> dict[str, str]:
    """``Key=Value Key=Value ...`` (``scontrol show job -o``, one job per line) as a dict. A value runs to
    the next `` Key=``, so values with spaces (``Command=``, ``Comment=``) stay whole."""
    matches = list(_FIELD.finditer(line))
    fields = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        fields[m.group(1)] = line[m.end() : end].strip()
    return fields


def exit_code_of(value: str) -> int | None:
    """Slurm's ``ExitCode=<code>:<signal>`` as one shell-style code: the code, or 128 + the signal that
    ended the batch step (``sbatch(1)``, "ExitCode")."""
    code, _, signal = value.partition(":")
    if not code.isdigit():
        return None
    if signal.isdigit() and int(signal):
        return 128 + int(signal)
    return int(code)


def job_state(text: str, job_id: str) -> ExternalState:
    """The state of ``job_id`` from ``scontrol show job -o <id>`` output (one line per job; an array or
    heterogeneous job prints several: the line of ``job_id`` itself, else the first)."""
    lines = [parse_fields(line) for line in text.splitlines() if line.strip()]
    if not lines:
        return ExternalState(GONE, f"Slurm printed nothing for job {job_id}")
    fields = next((f for f in lines if f.get("JobId") == str(job_id)), lines[0])
    raw = fields.get("JobState", "")
    slurm_state = raw.split()[0] if raw else ""
    reason = fields.get("Reason", "")
    reason = "" if reason in ("None", "(null)") else reason
    detail = slurm_state + (f" ({reason})" if reason else "")
    exit_code = exit_code_of(fields.get("ExitCode", ""))
    if slurm_state in QUEUED_STATES:
        state = QUEUED
    elif slurm_state in LAUNCHING_STATES:
        state = LAUNCHING
    elif slurm_state in RUNNING_STATES:
        state = RUNNING
    elif slurm_state == "COMPLETED":
        state = SUCCEEDED
    elif slurm_state == "CANCELLED":
        state = CANCELLED
    elif slurm_state in FAILED_STATES:
        state = FAILED
    else:
        state = UNKNOWN
    log_path = fields.get("StdOut", "")
    return ExternalState(
        state=state,
        detail=detail or "no JobState",
        reason=reason,
        exit_code=exit_code if state in (SUCCEEDED, FAILED, CANCELLED) else None,
        log_path="" if log_path in ("(null)", "/dev/null") else log_path,
        nodes="" if fields.get("NodeList") in (None, "(null)") else fields["NodeList"],
    )


def submit_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """What ``sbatch`` runs with, and so what the batch job and its ranks inherit (sbatch exports its whole
    environment by default): the worker's environment scrubbed as a local job's ranks get it
    (:func:`~workers.training.launch.rank_env`: none of the control plane's secrets), plus Slurm's own client
    settings (``SLURM_CONF``, ...)."""
    from workers.training.launch import SECRET_NAME, rank_env

    base = os.environ if base is None else base
    env = rank_env(base)
    env.update({k: v for k, v in base.items() if k.startswith("SLURM_") and not SECRET_NAME.search(k)})
    return env


def _run(
    argv: list[str], *, cwd: str | Path | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess:
    if shutil.which(argv[0]) is None:
        raise SchedulerError(
            f"{argv[0]} is not on this machine's PATH: install Slurm's client commands (Debian: slurm-client) "
            "where the control plane's worker and relay run, and point SLURM_CONF at the cluster's slurm.conf"
        )
    try:
        return subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise SchedulerError(f"{' '.join(argv)} did not answer within {COMMAND_TIMEOUT_S:.0f} s") from None
    except OSError as exc:
        raise SchedulerError(f"{argv[0]}: {exc.strerror or exc}") from None


def _said(proc: subprocess.CompletedProcess) -> str:
    return (proc.stderr or proc.stdout or "").strip() or f"exit code {proc.returncode}"


def submit(
    script: str, *, workdir: str | Path, name: str, partition: str = "", extra_args: list[str] | None = None
) -> str:
    """Write ``script`` to ``<workdir>/<name>.sbatch`` and ``sbatch --parsable`` it from ``workdir`` (the
    job's submit directory: the script writes its job config there, and its output goes there). Returns
    Slurm's job id."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"{name}.sbatch"
    path.write_text(script)
    argv = ["sbatch", "--parsable", *([f"--partition={partition}"] if partition else []), *(extra_args or [])]
    proc = _run([*argv, str(path)], cwd=workdir, env=submit_env())
    # --parsable: "<job id>[;<cluster>]" (sbatch(1))
    job_id = proc.stdout.strip().split(";")[0] if proc.returncode == 0 else ""
    if not job_id.isdigit():
        raise SchedulerError(f"sbatch refused the job: {_said(proc)}")
    return job_id


def state(job_id: str) -> ExternalState:
    """What slurmctld says about ``job_id`` now; :class:`SchedulerError` when it cannot be asked."""
    proc = _run(["scontrol", "show", "job", "-o", str(job_id)])
    if proc.returncode != 0:
        if UNKNOWN_ID in (proc.stderr or ""):
            return ExternalState(
                GONE,
                f"Slurm no longer knows job {job_id} (it drops an ended job's record MinJobAge after it "
                "ended, default 300 s)",
            )
        raise SchedulerError(f"scontrol show job {job_id}: {_said(proc)}")
    return job_state(proc.stdout, str(job_id))


def cancel(job_id: str) -> None:
    """``scancel`` the job (its steps get SIGTERM, then SIGKILL ``KillWait`` later). A job that already
    ended, or that Slurm no longer knows, is fine."""
    proc = _run(["scancel", str(job_id)])
    said = _said(proc)
    if proc.returncode != 0 and UNKNOWN_ID not in said and "already completing or completed" not in said:
        raise SchedulerError(f"scancel {job_id}: {said}")


def output_tail(path: str | Path) -> str:
    """The end of the job's output file (its ``StdOut``), torchrun's noise left out as the local launcher's log
    tail leaves it out (``workers.training.supervision.supervisor.filtered_tail``); "" when there is none (yet)."""
    from workers.training.supervision.supervisor import filtered_tail

    return filtered_tail(Path(path)) if path else ""
