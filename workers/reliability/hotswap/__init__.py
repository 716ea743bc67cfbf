"""Hot swap: data-parallel replicas that survive a killed replica without restarting (torchft).

:func:`run_hot_swap` supervises one job of ``replicas`` replica processes on this node: a torchft
Lighthouse (the quorum service, its own process) and one process per replica, each a replica group of one
rank with its own torchft ``Manager``. Every step, each replica

1. joins the step's quorum (``Manager.start_quorum``, synchronous): the Lighthouse answers with the
   replicas alive now; a replica that is behind (a restarted one, at step 0) *heals* first: it fetches the
   model and optimizer state from a healthy peer over HTTP (torchft's checkpoint transport) and jumps to the
   peers' step;
2. runs forward and backward on its slice of the step's global batch: the normal runtime's model
   (:class:`~workers.training.model.Transformer`, same seeded init), data order
   (:class:`~workers.training.data.ShardedTokenLoader`, replica ``r`` of ``R`` takes the ``r``-th slice of
   step ``s``'s samples, as DP rank ``r`` does), LR schedule (:func:`~workers.training.trainer.lr_at`),
   clipping and AdamW;
3. averages gradients and loss over the replicas of the quorum with **one flat** ``Manager.allreduce``
   (torchft's own ``DistributedDataParallel`` crashes the survivor when a kill lands inside its
   all-reduce: the failed future is swallowed and ``assert fut._fut`` fires, measured here, issue 12);
4. steps the optimizer only if ``Manager.should_commit()`` says so: a step whose all-reduce lost a peer is
   not committed and is tried again in the next quorum, so no step is committed twice or skipped. The
   survivors do not compute it again: their local gradients (on their own slices of the step, from the same
   parameters) are still in ``p.grad`` -- the failed all-reduce worked on a flat copy -- and are what a
   second forward and backward would give bit for bit; only the all-reduce is repeated, with the new quorum.

The supervisor (this process) fires the faults from outside: ``("kill-replica", s)`` SIGKILLs the target
replica's process when it reports step ``s`` committed, and starts a replacement at once. The survivors
never stop: their next quorum drops the dead replica after the Lighthouse heartbeat timeout, and they go
on with a smaller global batch (their slices only) until the replacement has healed and joined.

Each replica writes its progress to ``run_dir/replica<N>.json`` (pid, attempt, state, step, loss, time;
atomic replace) and appends every committed step, failed attempt and heal to
``run_dir/replica<N>.events.jsonl``; the supervisor fires faults from the first and measures from the
second. ``run_dir/replica<N>.log`` and ``run_dir/lighthouse.log`` hold the processes' output.

Network: the Lighthouse, each Manager's gRPC server and each checkpoint HTTP server listen on ``host`` only
(the node's address, ``CANN_TRAIN_NODE_ADDR``, default 127.0.0.1) — torchft binds ``[::]`` by default. Gloo
binds the interface ``GLOO_SOCKET_IFNAME`` names (``lo`` when ``host`` is a loopback address and nothing
is set). Each replica's TCPStore (torch's c10d store, rendezvous of the cross-replica gloo group) still
listens on all interfaces: torch offers no bind address for it, as for ``torchrun``'s own store.

The package, one job a module: :mod:`.supervisor` (:func:`run_hot_swap`, the processes, the faults),
:mod:`.replica` (a replica process), :mod:`.lighthouse` (the Lighthouse process), :mod:`.results` (the
run's figures), :mod:`.checks` (the input), :mod:`.network` (the bound servers), :mod:`.limits` (periods,
timeouts, the error), :mod:`.cli` (the processes' command line, ``python -m workers.reliability.hotswap``).

Pure engine: torch, torchft; no Django, no Celery.
"""

from workers.reliability.hotswap.checks import check_hot_swap_input
from workers.reliability.hotswap.cli import main
from workers.reliability.hotswap.lighthouse import lighthouse_main
from workers.reliability.hotswap.limits import (
    ASSIGN_AFTER_KILL_MAX_S,
    COLLECTIVE_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    FAULT_KINDS,
    FINISH_GRACE_S,
    HEARTBEAT_INTERVAL_MS,
    JOIN_TIMEOUT_MS,
    LOG_TAIL_CHARS,
    MAX_FAILED_COMMITS,
    POLL_S,
    QUORUM_TICK_MS,
    QUORUM_TIMEOUT_S,
    HotSwapError,
)
from workers.reliability.hotswap.replica import replica_main
from workers.reliability.hotswap.results import read_events, read_status, summarize
from workers.reliability.hotswap.supervisor import run_hot_swap

__all__ = [
    "ASSIGN_AFTER_KILL_MAX_S",
    "COLLECTIVE_TIMEOUT_S",
    "CONNECT_TIMEOUT_S",
    "FAULT_KINDS",
    "FINISH_GRACE_S",
    "HEARTBEAT_INTERVAL_MS",
    "JOIN_TIMEOUT_MS",
    "LOG_TAIL_CHARS",
    "MAX_FAILED_COMMITS",
    "POLL_S",
    "QUORUM_TICK_MS",
    "QUORUM_TIMEOUT_S",
    "HotSwapError",
    "check_hot_swap_input",
    "lighthouse_main",
    "main",
    "read_events",
    "read_status",
    "replica_main",
    "run_hot_swap",
    "summarize",
]
