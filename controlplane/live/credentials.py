"""A stream's own Redis credential: what a job's training processes publish with, instead of the deployment's
``REDIS_URL`` (which can read and write everything: every queue, every stream, every counter).

Each job gets a Redis ACL user (``cann-<db>-job-<id>``) whose password is derived from ``SECRET_KEY`` (every
node of the job computes the same one; nothing to store) and whose rights are exactly what publishing onto
its own stream takes (``workers.events``' append script): the stream, its ``seq`` counter, the set of streams
and the publish tokens, with ``EVALSHA``/``SCRIPT`` and the commands that script runs. Another job's stream
is a ``NOPERM``. The user is removed when the job has ended (:func:`revoke_ended`, the relay's housekeeping).

What remains (said in README): ACL users are per server, not per database, so the credential also opens
the same key names in the server's other databases (another deployment's job of the same id); a Redis
without ACLs (before 6) or one that refuses ``ACL SETUSER`` to the deployment's user gets the deployment's
URL, logged. And the credential sits in the job's run config file, readable by processes of the Unix user
the workers run as: run each job's ranks as a user of their own (or a container: the Kubernetes launcher)
for isolation between jobs.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from urllib.parse import quote, urlsplit, urlunsplit

from django.conf import settings
from redis.exceptions import RedisError, ResponseError

from controlplane.common.redis import redis_client
from workers.events import KEY_PREFIX, SEQ_PREFIX, STREAMS_NEW, STREAMS_SET, TOKEN_PREFIX

log = logging.getLogger(__name__)

PUBLISH_COMMANDS = (
    "+evalsha", "+eval", "+script|load", "+script|exists", "+incr", "+xadd", "+sadd", "+get", "+set", "+ping",
    "+select", "+hello", "+auth", "+client|setname",
)  # fmt: skip
"""What redis-py's connection set-up and the append script (``workers.events``) run, nothing else."""


def _db() -> int:
    return int(urlsplit(settings.REDIS_URL).path.lstrip("/") or 0)


def username(stream: str) -> str:
    kind, _, ident = stream.partition("/")
    return f"cann-{_db()}-{kind}-{ident}"


def _password(user: str) -> str:
    return hmac.new(settings.SECRET_KEY.encode(), f"redis-acl/{user}".encode(), hashlib.sha256).hexdigest()


def _url_for(user: str, password: str, base_url: str | None = None) -> str:
    parts = urlsplit(base_url or settings.REDIS_URL)
    host = parts.hostname or "127.0.0.1"
    netloc = f"{quote(user, safe='')}:{password}@{'[' + host + ']' if ':' in host else host}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def publisher_url(stream: str, base_url: str | None = None) -> tuple[str, str | None]:
    """A Redis URL that can publish onto ``stream`` and nothing else, and None; or, where this Redis cannot
    make one, the deployment's URL and why (the caller logs it on the job). ``base_url``: the same Redis as
    the ranks reach it (a scheduler's nodes: ``EXTERNAL_REDIS_URL``), default ``REDIS_URL``."""
    user = username(stream)
    password = _password(user)
    keys = [
        f"~{KEY_PREFIX}{stream}",
        f"~{SEQ_PREFIX}{stream}",
        f"~{STREAMS_SET}",
        f"~{STREAMS_NEW}",
        f"~{TOKEN_PREFIX}*",
    ]
    try:
        redis_client().execute_command(
            "ACL", "SETUSER", user, "reset", "on", f">{password}", *keys, "-@all", *PUBLISH_COMMANDS
        )
    except ResponseError as exc:  # no ACLs (Redis < 6), or the deployment's user may not manage them
        return (
            base_url or settings.REDIS_URL,
            f"no per-job Redis credential ({exc}): the job publishes with the deployment's",
        )
    return _url_for(user, password, base_url), None


def _users() -> set[str]:
    return {u.decode() if isinstance(u, bytes) else u for u in redis_client().execute_command("ACL", "USERS")}


def keep(streams) -> int:
    """Make sure each of ``streams`` (the running jobs') still has its credential: ACL users live in the Redis
    server's memory, not in its data (neither an RDB snapshot nor the append-only file holds them), so a
    restarted Redis, empty or not, comes back without them and the ranks' publisher cannot authenticate until
    they are there again (it keeps its events meanwhile and sends them then). Run by the relay's
    housekeeping: one ``ACL USERS`` a round, and an ``ACL SETUSER`` only for a user that is missing. How many
    were made again."""
    try:
        present = _users()
        made = 0
        for stream in streams:
            if username(stream) not in present and publisher_url(stream)[1] is None:
                made += 1
        return made
    except (ResponseError, RedisError):  # no ACLs here, or Redis away: the next round tries again
        return 0


def revoke_ended(still_running) -> int:
    """Remove the credentials of this deployment's jobs that are no longer running (``still_running``: the
    set of job ids that are); how many were removed. Run by the relay's housekeeping."""
    prefix = f"cann-{_db()}-job-"
    try:
        users = _users()
    except (ResponseError, RedisError):
        return 0
    ended = [u for u in users if u.startswith(prefix) and u[len(prefix) :].isdigit()]
    ended = [u for u in ended if int(u[len(prefix) :]) not in still_running]
    for user in ended:
        try:
            redis_client().execute_command("ACL", "DELUSER", user)
        except ResponseError:
            log.warning("could not remove Redis user %s", user, exc_info=True)
    return len(ended)
