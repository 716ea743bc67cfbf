"""One node of one attempt: the Celery task's body (``run_node``). Rendezvous, the node's torchrun under the
engine's supervisor (``workers.training.supervision.supervisor``), its watches, and what it reports."""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import time

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from django.utils import timezone
from redis.exceptions import ResponseError

from controlplane.common import logs
from controlplane.common.models import JobState
from controlplane.common.redis import redis_client
from controlplane.jobs.models import JobNode, TrainingJob
from controlplane.jobs.paths import job_dir
from controlplane.jobs.selectors import restarts_left
from controlplane.jobs.services.events import until_the_database_answers
from controlplane.jobs.services.nodes import heartbeat, node_finished, node_started
from controlplane.jobs.services.outcomes import job_fail
from controlplane.jobs.services.recovery import resume_after_worker_lost
from controlplane.jobs.services.watches import elastic_watch_for, risk_watch_for
from controlplane.live import credentials
from controlplane.live.services import publish
from workers.events import GUARD_ENV
from workers.training.entrypoint import is_user_run
from workers.training.supervision import supervisor

log = logging.getLogger(__name__)


def node_run(*, job_id: int, attempt: int, node_rank: int) -> str:
    """Run one node's ``torchrun`` agent for a job attempt inside this worker and record what happens:
    started, heartbeats (answering a cancel), exit code, log tail and run summary."""
    close_old_connections()
    job = TrainingJob.objects.get(pk=job_id)
    node = JobNode.objects.filter(job=job, attempt=attempt, node_rank=node_rank).first()
    if node is None or job.attempts != attempt or job.is_finished or node.state != JobState.QUEUED:
        log.info(
            "job %s attempt %s node %s: nothing to do (stale or repeated delivery)",
            job_id,
            attempt,
            node_rank,
        )
        return "skipped"
    # picked up: from now on this node's heartbeats say whether its supervisor lives (a node still waiting
    # in the queue for a free worker slot has none, and the reaper leaves its job alone)
    picked_at = timezone.now()
    JobNode.objects.filter(pk=node.pk).update(node_name=supervisor.node_name(), heartbeat_at=picked_at)
    TrainingJob.objects.filter(pk=job.pk).update(heartbeat_at=picked_at)
    if problem := node_refusal(job):
        job_fail(job_id=job.pk, human=problem)
        return "failed"
    workdir = job_dir(job, attempt)
    try:
        endpoint = supervisor.rendezvous_endpoint(
            redis_client(),
            f"cann:rdzv:job/{job.pk}/{attempt}",
            node_rank,
            address=supervisor.node_address(),
            on_wait=lambda: heartbeat(node=node),
        )
    except TimeoutError as exc:
        job_fail(job_id=job.pk, human=f"Job {job.pk}: {exc}")
        return "failed"
    config_path = workdir / f"config-node{node_rank}.json"
    # torchrun's c10d rendezvous hands out global ranks in joining order and ignores --node-rank, so global
    # rank 0 (the one that writes the summary) may run under any node's agent: every node asks for one.
    summary_path = workdir / f"summary-node{node_rank}.json"
    # the ranks publish onto the job's stream with a credential for that stream alone (a user's code runs
    # there; ours too), or, where this Redis cannot make one, the deployment's URL, said in the log
    events_url, why_not = credentials.publisher_url(job.stream)
    if why_not:
        log.warning("job %s: %s", job.pk, why_not)
    # ``attempt`` labels every event the run publishes (the job page draws each attempt as its own trace)
    run_config = {**job.config, "job_id": str(job.pk), "redis_url": events_url, "attempt": attempt}
    if is_user_run(job.config):  # the SDK writes rank 0's summary where the runtime's --summary would
        run_config["summary_path"] = str(summary_path)
    config_path.write_text(json.dumps(run_config))
    config_path.chmod(0o600)
    # the recovery engine: watches the ranks (progress, hangs), fires injected faults, reports faults,
    # recoveries and snapshots (recorded as they come) and the goodput at the end (services.watches)
    try:
        watch = elastic_watch_for(job, attempt, node_rank, workdir)
    except ValueError as exc:  # a fault plan that does not fit the job (checked at submit; kept safe)
        job_fail(job_id=job.pk, human=f"Fault injection: {exc}")
        return "failed"
    cmd = torchrun_command(job, attempt, node_rank, endpoint, config_path, summary_path, watch)
    log.info("job %s node %s: %s", job.pk, node_rank, " ".join(cmd))
    outcome = supervised(job, node, attempt, node_rank, workdir, cmd, watch, config_path)
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    report = None
    if watch is not None:
        try:
            watch.finish(lost=outcome.lost)  # the ranks' last progress; the end of the goodput clock
            report = watch.report()
        except Exception:  # noqa: BLE001 - the run's outcome is recorded without it
            log.warning("job %s node %s: no recovery report", job.pk, node_rank, exc_info=True)
    resumed = ""
    if outcome.lost and not job.elastic:
        # the node's torchrun agent was killed (not a rank's error): a lost worker, resumed from the newest
        # snapshot while restarts are left; an elastic job's other nodes go on without it (node_finished)
        consequences = drop_faults_of_the_lost_agent(job, attempt)
        if consequences:
            log.info(
                "job %s: %d rank fault(s) seen as the agent died dropped: its loss is the fault",
                job.pk,
                consequences,
            )
        why_not = resume_after_worker_lost(
            job_id=job.pk,
            cause=(
                f"node {node_rank}'s torchrun agent was killed ({signal_name(-outcome.exit_code)}); "
                "its ranks were stopped"
            ),
        )
        resumed = "" if why_not else " (agent lost: resumed)"
        if why_not:
            log.warning("job %s: torchrun agent of node %s lost, not resumed: %s", job.pk, node_rank, why_not)
    until_the_database_answers(
        lambda: node_finished(
            node=node,
            exit_code=outcome.exit_code,
            cancelled=outcome.cancelled,
            log_tail=outcome.log_tail,
            summary=summary,
            elastic=report,
        ),
        what=f"record how job {job.pk} node {node_rank} ended",
    )
    return "cancelled" if outcome.cancelled else f"exit {outcome.exit_code}{resumed}"


AGENT_LOSS_WINDOW_S = 15.0
"""Rank faults detected this close before a lost agent was noticed are taken for its consequence."""


def drop_faults_of_the_lost_agent(job: TrainingJob, attempt: int) -> int:
    """The ranks of a killed agent die with it (the rendezvous store it held is gone): the watch may see them
    go before the agent's exit is noticed and record a rank fault. That is the agent's loss, one fault, not
    two (and not two restarts off ``max_restarts``): the unrecovered rank faults of the attempt detected in the
    last :data:`AGENT_LOSS_WINDOW_S` are removed. Returns how many."""
    from datetime import timedelta

    from controlplane.jobs.models import FaultKind, JobFault

    deleted, _ = JobFault.objects.filter(
        job=job,
        attempt=attempt,
        kind__in=(FaultKind.RANK_FAILED, FaultKind.RANK_KILLED),
        recovered_at__isnull=True,
        detected_at__gte=timezone.now() - timedelta(seconds=AGENT_LOSS_WINDOW_S),
    ).delete()
    return deleted


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def node_refusal(job: TrainingJob) -> str:
    """Why this node cannot run the job's ranks ("" when it can): the devices it asks for are missing, or
    its ranks would not fit in their memory (the planner's rule, ``workers.planner.fits``)."""
    from workers.devices.backend import device_memory_GiB, devices_missing, select_device
    from workers.training.fits import memory_problem

    requested = job.config.get("device", "auto")
    if problem := devices_missing(requested, job.nproc_per_node):
        return problem
    if is_user_run(job.config):  # a user's code: its memory is its own to know
        return ""
    kind = select_device(requested).kind
    return memory_problem(
        job.config, job.nproc_per_node, device_kind=kind, device_memory_GiB=device_memory_GiB(kind)
    )


def torchrun_command(job, attempt: int, node_rank: int, endpoint: str, config_path, summary_path, watch):
    """The node's torchrun command line (the warm agent)."""
    from workers.training.launch import render_torchrun_command

    # torchrun restarts the node's ranks from the newest good snapshot, as often as the job has restarts
    # left (a job that takes no snapshots would start over from step 0: it is not restarted)
    max_restarts = restarts_left(job) if watch is not None and job.snapshots_enabled else 0
    return render_torchrun_command(
        str(config_path),
        job.nnodes,
        job.nproc_per_node,
        # a node that joins a running elastic attempt has a new row past the first nnodes; c10d ignores
        # --node-rank (see above), torchrun only checks it is below --nnodes
        min(node_rank, job.nnodes - 1),
        endpoint,
        run_id=f"job{job.pk}-a{attempt}",
        max_restarts=max_restarts,
        summary_path=str(summary_path),
        # an elastic range: --nnodes MIN:MAX, so the agents re-form the group on the nodes left (and with a
        # node that comes back)
        min_nodes=job.min_nodes if job.elastic else None,
        # warm agents (workers.training.supervision.agent) for every job: the ranks fork from one import of
        # the runtime (~4 s of CPU per rank saved at each start and restart here). With plain torchrun the
        # shrink and regrow of tests/engines/reliability/test_elastic_scaling.py timed out. A killed Celery
        # worker's job once settled ~100 s later with them (test_chaos); re-measured after the ranks'
        # OpenMP pool fix: 36 s, against 45 s with plain torchrun.
        warm=True,
        # node 0 hosts the rendezvous store, never another node (c10d lets the first agent to bind the port
        # host it): the group must not lose its store with a node it can lose (reap_lost_nodes)
        hosts_store=False if job.elastic and node_rank != 0 else None,
        # a user's entrypoint (torchrun starts it as it would by hand: the agent forks only our runtime)
        program=user_entrypoint(job).program() if is_user_run(job.config) else None,
    )


def publish_log(job: TrainingJob, node_rank: int, attempt: int, lines: list[str]) -> None:
    """New lines of the node's log as an event on the job's stream; a stream that refuses it (a job's code
    broke its numbering) costs its live log, not the supervision."""
    try:
        publish(job.stream, "event", {"log": lines, "node": node_rank, "attempt": attempt})
    except ResponseError as exc:
        log.warning("job %s node %s: log lines not published: %s", job.pk, node_rank, exc)


def user_entrypoint(job: TrainingJob):
    from workers.training.entrypoint import Entrypoint

    return Entrypoint.from_dict(job.config["entrypoint"])


def supervised(job, node, attempt: int, node_rank: int, workdir, cmd, watch, config_path):
    """Run ``cmd`` under the engine's supervisor with this node's watches (the elastic watch, the fault-risk
    loop), its heartbeats (answering a cancel) and its live log; the outcome."""
    from workers.training.launch import torchrun_env

    user_run = is_user_run(job.config)
    stop_asked: list[float] = []  # when the ranks of a user's code were asked to stop cleanly

    def beat() -> bool:
        close_old_connections()
        try:
            wants_cancel = heartbeat(node=node)
        except DatabaseError:  # a database blip must not stop the training: the next beat retries
            log.warning("job %s node %s: heartbeat not recorded", job.pk, node_rank, exc_info=True)
            return False
        if wants_cancel and user_run and watch is not None:
            # a user's code stops itself (the SDK's should_stop: it snapshots and exits 0) within the grace
            # period; after it, the process group is stopped as any other
            if not stop_asked:
                from workers.training.supervision.stop_now import request_stop

                request_stop(watch.dir, reason="the job was cancelled or paused")
                stop_asked.append(time.monotonic())
                log.info("job %s node %s: cancel requested, the script asked to stop", job.pk, node_rank)
            return time.monotonic() - stop_asked[0] > settings.STOP_GRACE_S
        if wants_cancel:
            log.info("job %s node %s: cancel requested, stopping the process group", job.pk, node_rank)
        return wants_cancel

    # the fault-risk loop: this node's telemetry and its ranks' straggler scores, live on the job's stream
    risk = risk_watch_for(job, attempt, node_rank, watch, local_ranks=job.nproc_per_node) if watch else None

    def poll() -> None:
        try:
            watch.poll()
        finally:  # each watch goes on when the other fails
            risk.poll()

    cwd, own_env = settings.BASE_DIR, {}
    if user_run:  # a user's code: in its working directory, with its variables and the SDK's run config
        from workers.training.entrypoint import RUN_CONFIG_ENV

        entry = user_entrypoint(job)
        cwd, own_env = entry.cwd, {**entry.env, RUN_CONFIG_ENV: str(config_path)}
    if risk is not None:
        risk.start()
    try:
        outcome = supervisor.supervise(
            cmd,
            log_path=workdir / f"node{node_rank}.log",
            cwd=cwd,
            # the worker's environment scrubbed of the control plane's secrets (rank_env); CANN_TRAIN_REQUEST_ID:
            # the request that launched it, on the runtime's lifecycle events
            env={
                **torchrun_env(),
                **own_env,
                **(watch.env if watch is not None else {}),
                **logs.runtime_env(),
                # the ranks' appends wait for their stream's counter after a Redis that lost its data
                GUARD_ENV: "1",
            },
            on_poll=poll if watch is not None else None,
            on_start=lambda pid: until_the_database_answers(
                lambda: node_started(node=node, pid=pid),
                what=f"record that job {job.pk} node {node_rank} started",
            ),
            on_heartbeat=beat,
            # the heartbeat thread closes its own connection (resolved there: `connection` is per thread)
            after_heartbeats=lambda: connection.close(),
            # the live log: new lines (noise filtered, batched by the supervisor) as events on the job's stream
            on_output=lambda lines: publish_log(job, node_rank, attempt, lines),
        )
        if stop_asked and not outcome.cancelled:  # it stopped itself when asked: a cancel all the same
            outcome = dataclasses.replace(outcome, cancelled=True)
        return outcome
    finally:
        if risk is not None:
            try:
                risk.stop()
            except Exception:  # noqa: BLE001 - the run's outcome is recorded without its last samples
                log.warning(
                    "job %s node %s: the risk watch did not stop cleanly", job.pk, node_rank, exc_info=True
                )
