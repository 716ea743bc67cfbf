"""``/metrics``: Prometheus metrics of the web process, for operators (a project module, not an app: it
reads every app's figures).

Two kinds of series: django-prometheus' request and response figures (its middleware pair in settings), and
the product's own, computed from the database and Redis each time Prometheus scrapes (``ProductCollector``:
nothing is kept in the process, so every web process answers the same). They cover every team: ``/metrics``
is for the operators of the deployment, never a team's view, so it is guarded (``metrics_view``):

- ``METRICS_TOKEN`` set: the request must carry ``Authorization: Bearer <METRICS_TOKEN>``;
- unset: only a client on this machine's loopback that did not come through a proxy (no ``X-Forwarded-For``,
  ``Forwarded`` or ``X-Real-IP``) is answered; everyone else gets 403.

Names follow Prometheus' conventions: the unit in the name, ``_total`` for counters, ``_ratio`` for
fractions. Per-job series carry ``job_id`` and ``team`` (the team's slug) and exist for the active jobs and
the ones that finished in the last ``METRICS_RECENT_S`` seconds, so old jobs drop out instead of adding
series for ever.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
from datetime import timedelta

from django.conf import settings
from django.http import HttpResponse
from django.utils import timezone
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from controlplane.common.redis import redis_client
from controlplane.green.selectors import energy_by_stream
from controlplane.jobs.selectors import job_counts_by_state, jobs_for_metrics
from controlplane.live.relay import GROUP
from controlplane.live.selectors import relay_backlog
from controlplane.planning.selectors import search_durations_s

log = logging.getLogger(__name__)

# jobs that finished this long ago still have their per-job series (their last figures, their totals)
METRICS_RECENT_S = float(os.environ.get("METRICS_RECENT_S", "3600"))
# seconds: a search on this machine takes a fraction of a second to minutes; a large cluster's up to an hour
SEARCH_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
JOULES_PER_KWH = 3.6e6
PROXY_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP")

# every family the collector exports, by name: the Grafana dashboard's test checks its queries against these
PRODUCT_METRICS = {
    "cann_train_jobs": "Training jobs by state and team.",
    "cann_train_job_tokens_per_second": "A running job's tokens per second (mean over its latest steady steps).",
    "cann_train_job_step_time_seconds": "A running job's step time (mean over its latest steady steps).",
    "cann_train_job_mfu_ratio": "A running job's newest model FLOPs utilisation (where the device's peak is known).",
    "cann_train_job_goodput_ratio": "Productive time over wall time of a job's latest attempt.",
    "cann_train_node_fault_risk_ratio": "Fault risk (0-1) of each node of a running job, from its newest risk event.",
    "cann_train_job_energy_joules": "Energy a job used so far (facility, with PUE), every attempt.",
    "cann_train_job_carbon_kgco2e": "Carbon a job emitted so far (location-based kgCO2e), every attempt.",
    "cann_train_search_duration_seconds": "Start to end of the succeeded strategy searches.",
    "cann_train_stream_backlog_events": "Live events in Redis the relay has not stored yet.",
    "cann_train_relay_lag_seconds": "Age of the oldest live event the relay has not stored yet (0: none).",
    "cann_train_metrics_scrape_errors": "Parts of this scrape that failed (the database or Redis did not answer).",
}


class ProductCollector(Collector):
    """The product's series, read from the database and Redis at scrape time (a custom collector: no state in
    the process). A part whose backing service fails is left out and counted in ``scrape_errors``."""

    def collect(self):
        errors = GaugeMetricFamily(
            "cann_train_metrics_scrape_errors",
            PRODUCT_METRICS["cann_train_metrics_scrape_errors"],
            labels=["part"],
        )
        for part, families in (("jobs", self._jobs), ("searches", self._searches), ("relay", self._relay)):
            try:
                built = list(families())
            except Exception:  # noqa: BLE001 - one unreachable service must not blank the whole scrape
                log.warning("metrics: the %s part failed", part, exc_info=True)
                errors.add_metric([part], 1)
                continue
            errors.add_metric([part], 0)
            yield from built
        yield errors

    def describe(self):
        return []  # collected lazily: describing would query the database at registration

    @staticmethod
    def _jobs():
        counts = GaugeMetricFamily(
            "cann_train_jobs", PRODUCT_METRICS["cann_train_jobs"], labels=["state", "team"]
        )
        for team, state, n in job_counts_by_state():
            counts.add_metric([state, team], n)
        yield counts
        jobs = jobs_for_metrics(finished_since=timezone.now() - timedelta(seconds=METRICS_RECENT_S))
        labels = ["job_id", "team"]
        families = {
            name: GaugeMetricFamily(name, PRODUCT_METRICS[name], labels=labels)
            for name in (
                "cann_train_job_tokens_per_second",
                "cann_train_job_step_time_seconds",
                "cann_train_job_mfu_ratio",
                "cann_train_job_goodput_ratio",
            )
        }
        risk = GaugeMetricFamily(
            "cann_train_node_fault_risk_ratio",
            PRODUCT_METRICS["cann_train_node_fault_risk_ratio"],
            labels=[*labels, "node"],
        )
        energy = CounterMetricFamily(
            "cann_train_job_energy_joules", PRODUCT_METRICS["cann_train_job_energy_joules"], labels=labels
        )
        carbon = CounterMetricFamily(
            "cann_train_job_carbon_kgco2e", PRODUCT_METRICS["cann_train_job_carbon_kgco2e"], labels=labels
        )
        totals = energy_by_stream([j.stream for j in jobs])
        for job in jobs:
            key = [str(job.job_id), job.team_slug]
            for name, value in (
                ("cann_train_job_tokens_per_second", job.tokens_per_s),
                ("cann_train_job_step_time_seconds", job.step_time_s),
                ("cann_train_job_mfu_ratio", job.mfu),
                ("cann_train_job_goodput_ratio", job.goodput),
            ):
                if value is not None:
                    families[name].add_metric(key, value)
            for node, value in sorted(job.node_risk.items()):
                risk.add_metric([*key, node], value)
            total = totals.get(job.stream) or {}
            if total.get("kwh") is not None:
                energy.add_metric(key, total["kwh"] * JOULES_PER_KWH)
            if total.get("kgco2e") is not None:
                carbon.add_metric(key, total["kgco2e"])
        yield from families.values()
        yield from (risk, energy, carbon)

    @staticmethod
    def _searches():
        durations = search_durations_s()
        buckets = [(str(b), sum(1 for d in durations if d <= b)) for b in SEARCH_BUCKETS_S]
        histogram = HistogramMetricFamily(
            "cann_train_search_duration_seconds", PRODUCT_METRICS["cann_train_search_duration_seconds"]
        )
        histogram.add_metric([], [*buckets, ("+Inf", len(durations))], sum_value=sum(durations))
        yield histogram

    @staticmethod
    def _relay():
        backlog = relay_backlog(redis_client(), group=GROUP)
        yield GaugeMetricFamily(
            "cann_train_stream_backlog_events",
            PRODUCT_METRICS["cann_train_stream_backlog_events"],
            value=backlog.events,
        )
        yield GaugeMetricFamily(
            "cann_train_relay_lag_seconds",
            PRODUCT_METRICS["cann_train_relay_lag_seconds"],
            value=backlog.lag_s,
        )


_registered: list[ProductCollector] = []


def register_product_metrics(registry=REGISTRY) -> None:
    """Register ``ProductCollector`` once per process (``controlplane.urls`` calls it)."""
    if not _registered:
        collector = ProductCollector()
        registry.register(collector)
        _registered.append(collector)


def _is_loopback(address: str | None) -> bool:
    try:
        return ipaddress.ip_address((address or "").strip("[]")).is_loopback
    except ValueError:
        return False


def scrape_allowed(request) -> bool:
    """``METRICS_TOKEN`` set: the bearer token must match; unset: only an unproxied loopback client."""
    token = getattr(settings, "METRICS_TOKEN", "")
    if token:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())
    proxied = any(request.META.get(h) for h in PROXY_HEADERS)
    return not proxied and _is_loopback(request.META.get("REMOTE_ADDR"))


def metrics_view(request):
    """The Prometheus text exposition of this process' registry (django-prometheus' and ours)."""
    if not scrape_allowed(request):
        detail = (
            "Send Authorization: Bearer <METRICS_TOKEN>."
            if getattr(settings, "METRICS_TOKEN", "")
            else "Only loopback clients may scrape while METRICS_TOKEN is unset."
        )
        response = HttpResponse(f"Forbidden. {detail}\n", status=403, content_type="text/plain")
        if getattr(settings, "METRICS_TOKEN", ""):
            response.status_code = 401 if "Authorization" not in request.headers else 403
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
