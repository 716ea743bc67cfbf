"""Project-level promises: docker-compose names its services, settings refuse an insecure production
start, and `make run` on a busy port says which port and how to change it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_compose_file_parses_and_names_the_services():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "web", "worker"} <= set(services)
    for name in ("web", "worker", "relay"):
        assert services[name]["build"] == "."
        assert services[name]["environment"]["DATABASE_URL"].startswith("postgres://")
        assert services[name]["environment"]["REDIS_URL"] == "redis://redis:6379/0"
    assert "daphne" in services["web"]["command"] and "celery" in services["worker"]["command"]
    assert (ROOT / "Dockerfile").read_text().startswith("# One image")


def _python(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "DEBUG"}}
    full_env.update(env, DJANGO_SETTINGS_MODULE="controlplane.settings")
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=60
    )


def test_production_mode_requires_a_secret_key():
    r = _python("import django; django.setup()", DEBUG="0")
    assert r.returncode != 0
    assert "SECRET_KEY must be set in the environment when DEBUG=0" in r.stderr
    r = _python(
        "import django; django.setup(); from django.conf import settings; print(settings.SESSION_COOKIE_SECURE)",
        DEBUG="0",
        SECRET_KEY="x" * 50,
    )
    assert r.returncode == 0 and r.stdout.strip() == "True"


def test_bad_debug_value_is_a_clear_error():
    r = _python("import django; django.setup()", DEBUG="maybe")
    assert "DEBUG must be one of" in r.stderr


def test_make_run_on_a_busy_port_names_the_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run(
            [sys.executable, "-m", "controlplane.stack", "--port", str(port)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert r.returncode != 0
    assert f"Port {port} on 127.0.0.1 is already in use" in r.stderr
    assert f"make run PORT={port + 1}" in r.stderr
