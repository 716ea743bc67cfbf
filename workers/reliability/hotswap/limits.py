"""Hot swap's periods, timeouts and limits (torchft's defaults where we keep them), the fault kinds it
fires, and the error a failed run raises."""

from __future__ import annotations

FAULT_KINDS = ("kill-replica",)
POLL_S = 0.005
"""Supervisor poll period: how late after a replica reports the fault's step the kill lands (5 ms, small
beside a step of the tiny models, ~20 ms on this machine)."""
HEARTBEAT_INTERVAL_MS = 100
"""Manager -> Lighthouse heartbeat period: torchft's default (``Manager(heartbeat_interval=100 ms)``)."""
QUORUM_TICK_MS = 100
"""How often the Lighthouse re-checks a pending quorum: torchft's default (``quorum_tick_ms``)."""
JOIN_TIMEOUT_MS = 5000
"""How long a new quorum waits for a replica that heartbeats but has not asked to join. torchft's
Lighthouse CLI default is 60 s; our replicas ask for a quorum within milliseconds of starting to heartbeat
(the start barrier holds them until all heartbeat), so 5 s only bounds a replica that died in between."""
COLLECTIVE_TIMEOUT_S = 30.0
"""torchft ``Manager(timeout=...)``: all-reduce, ``should_commit``, the heal's checkpoint fetch; and the
gloo group's timeout. A killed peer fails a collective at once (its sockets close); this bounds a peer
that hangs. torchft's default is 60 s; 30 s leaves a fetch of a ~100M-parameter AdamW state (1.2 GB over
loopback) ample room."""
QUORUM_TIMEOUT_S = 60.0
"""torchft ``Manager(quorum_timeout=...)``, its default: the longest a replica waits for a quorum."""
CONNECT_TIMEOUT_S = 10.0
"""torchft ``Manager(connect_timeout=...)``: gRPC connections to the Lighthouse and the peers' Managers."""
MAX_FAILED_COMMITS = 20
"""A replica whose step fails to commit this many times in a row exits with an error (torchft
``max_retries``) instead of retrying until the run's timeout: something is broken, not a peer lost."""
ASSIGN_AFTER_KILL_MAX_S = 5.0
"""A spare takes its slot when the survivors have committed a step without the killed replica, or at the
latest this long (plus two heartbeat timeouts) after the kill, should they be slow to."""
FINISH_GRACE_S = 30.0
"""After every replica is done: how long they may take to leave before they are killed."""
LOG_TAIL_CHARS = 4000


class HotSwapError(RuntimeError):
    """The hot-swap run failed (a replica died by itself, a timeout); the message has the logs' tails."""
