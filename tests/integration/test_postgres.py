"""PostgreSQL through DATABASE_URL: migrate and use the app on a fresh database (skipped without one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ADMIN_URL = os.environ.get("POSTGRES_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")

SCRIPT = """
import django; django.setup()
from django.db import connection
from rest_framework.test import APIClient
from controlplane.accounts.services import demo_setup
user, _ = demo_setup()
c = APIClient(); c.force_authenticate(user)
doc = {"name": "pg", "num_nodes": 2, "devices_per_node": 8,
       "device": {"name": "x", "peak_tflops": {"bf16": 100}, "memory_GiB": 80, "memory_bandwidth_GBps": 2000},
       "intra_node": {"kind": "nvlink", "bandwidth_GBps": 300, "latency_us": 3},
       "inter_node": {"kind": "ib", "bandwidth_GBps": 25, "latency_us": 5}}
r = c.post("/api/clusters/", doc, format="json"); assert r.status_code == 201, r.content
r = c.post("/api/clusters/", doc, format="json"); assert r.status_code == 400, r.content
print(connection.vendor, c.get("/api/clusters/").json()["count"])
"""


@pytest.mark.slow
def test_app_runs_on_postgresql():
    psycopg = pytest.importorskip("psycopg")
    try:
        admin = psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL at {ADMIN_URL}: {exc}")
    name = f"cann_train_pgtest_{os.getpid()}"
    admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = ADMIN_URL.rsplit("/", 1)[0] + "/" + name
        env = {
            **os.environ,
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "ALLOWED_HOSTS": "testserver",
        }
        env.pop("CANN_TRAIN_TEST_SQLITE", None)
        migrate = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert migrate.returncode == 0, migrate.stderr
        run = subprocess.run(
            [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout.split() == ["postgresql", "1"]
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()
