"""Production settings: ``check --deploy`` and the OpenAPI schema clean with DEBUG=0, the TLS settings'
plain-HTTP overrides, and the Content-Security-Policy header (README "Production settings")."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRINT_SETTINGS = (
    "import json; from django.conf import settings as s; print(json.dumps({k: getattr(s, k) for k in ["
    "'SECURE_SSL_REDIRECT', 'SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE', 'SECURE_HSTS_SECONDS', "
    "'SECURE_HSTS_INCLUDE_SUBDOMAINS', 'SECURE_HSTS_PRELOAD', 'SECURE_PROXY_SSL_HEADER']}))"
)


def manage(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``manage.py ARGS`` with the project's own settings (not the tests') and ``env`` on top."""
    # not what the test session set for itself (the browser tests lift the async guard: async.E001)
    unset = {"DEBUG", "CANN_TRAIN_TEST_SQLITE", "DJANGO_ALLOW_ASYNC_UNSAFE"}
    environ = {k: v for k, v in os.environ.items() if k not in unset}
    environ |= {
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "CANN_TRAIN_VAR_DIR": str(tmp_path),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        **env,
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )


def production(**env: str) -> dict[str, str]:
    return {"DEBUG": "0", "SECRET_KEY": secrets.token_urlsafe(64), "ALLOWED_HOSTS": "cann.example.org", **env}


def test_check_deploy_is_clean_in_production_mode(tmp_path):
    # drf-spectacular's deploy check generates the schema too: its warnings would fail this
    run = manage(tmp_path, "check", "--deploy", "--fail-level", "WARNING", **production())
    assert run.returncode == 0, run.stdout + run.stderr
    assert "System check identified no issues" in run.stdout, run.stdout + run.stderr


def test_openapi_schema_validates_with_no_warning(tmp_path):
    run = manage(
        tmp_path, "spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml")
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "tokenAuth" in (tmp_path / "schema.yaml").read_text()


def test_production_defaults_to_tls_and_plain_http_is_four_variables(tmp_path):
    run = manage(tmp_path, "shell", "-c", PRINT_SETTINGS, **production())
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.splitlines()[-1]) == {
        "SECURE_SSL_REDIRECT": True,
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SECURE_HSTS_SECONDS": 31536000,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
        "SECURE_HSTS_PRELOAD": True,
        "SECURE_PROXY_SSL_HEADER": None,
    }
    plain_http = {"SECURE_SSL_REDIRECT": "0", "SESSION_COOKIE_SECURE": "0", "CSRF_COOKIE_SECURE": "0"}
    run = manage(
        tmp_path,
        "shell",
        "-c",
        PRINT_SETTINGS,
        **production(
            **plain_http, SECURE_HSTS_SECONDS="0", SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto: https"
        ),
    )
    assert run.returncode == 0, run.stderr
    values = json.loads(run.stdout.splitlines()[-1])  # after shell's "objects imported" line
    assert not any(values[k] for k in [*plain_http, "SECURE_HSTS_SECONDS"]), values
    assert values["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]


def test_a_malformed_proxy_header_setting_is_refused(tmp_path):
    run = manage(tmp_path, "check", **production(SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto"))
    assert run.returncode != 0
    assert "SECURE_PROXY_SSL_HEADER must read 'Header-Name: value'" in run.stderr


@pytest.mark.django_db
def test_pages_carry_the_policy_with_this_hosts_websocket(client):
    policy = client.get("/login/").headers["Content-Security-Policy"]
    assert policy.startswith("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline';"), (
        policy
    )
    assert "connect-src 'self' ws://testserver;" in policy
    assert "frame-ancestors 'none'" in policy and "object-src 'none'" in policy
    secure = client.get("/login/", secure=True).headers["Content-Security-Policy"]
    assert "connect-src 'self' wss://testserver;" in secure


@pytest.mark.django_db
def test_redoc_alone_may_start_a_blob_worker(client, make_member):
    client.force_login(make_member("docs", "Team Docs"))
    redoc = client.get("/api/redoc/")
    assert redoc.status_code == 200
    assert "worker-src 'self' blob:" in redoc.headers["Content-Security-Policy"]
    assert b"<script>" not in redoc.content
    docs = client.get("/api/docs/")
    assert "worker-src" not in docs.headers["Content-Security-Policy"]
    assert b"<script>" not in docs.content  # the split view: Swagger UI's start-up script is a URL of its own
