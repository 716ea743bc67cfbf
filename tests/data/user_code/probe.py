"""A user's script that looks for what it must not have: the control plane's secrets in its environment, and
a way onto another job's stream. It reports what it found as figures of its one step."""

import os

import redis

import cann_train
from workers.events import EventWriter, build_event, seq_key, stream_key

run = cann_train.init()
other = run.hyperparameters["other_stream"]
seen = {name: name in os.environ for name in ("SECRET_KEY", "DATABASE_URL", "REDIS_URL", "METRICS_TOKEN")}
client = redis.Redis.from_url(run.config["redis_url"])
refused = []
try:  # the append script onto the other job's stream
    EventWriter(client).publish(other, "event", {"from": "probe"})
except redis.exceptions.NoPermissionError:
    refused.append("publish")
try:  # a raw entry onto the other job's stream
    client.xadd(stream_key(other), {"event": build_event(other, "event", 1, {"from": "probe"})})
except redis.exceptions.NoPermissionError:
    refused.append("xadd")
try:  # the deployment's own keys
    client.get("cann:deployment")
except redis.exceptions.NoPermissionError:
    refused.append("read")
run.report(
    1, loss=0.0, **{f"env_{k}": v for k, v in seen.items()}, refused=",".join(refused), cwd=os.getcwd()
)
run.finish()  # (its events are in Redis once this returns)
# its own stream takes what it writes there, e.g. an entry that claims to be the other job's event and one
# that is not JSON (ids just above the last event's, so the stream's own numbering goes on): the relay must
# drop both, neither storing the first in the other job's history nor stopping on the second
last = int(client.get(seq_key(run.stream)))
forged = build_event(other, "event", 1, {"from": "probe"})[:-1] + ',"seq":999}'
client.xadd(stream_key(run.stream), {"event": forged}, id=f"{last}-2")
client.xadd(stream_key(run.stream), {"event": b"not json"}, id=f"{last}-3")
