"""URL map: pages, the REST API under /api/, OpenAPI, health, operators' /metrics, admin. Websockets:
controlplane/live/routing.py."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import include, path, re_path, register_converter
from django.views.decorators.csrf import csrf_exempt
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from controlplane.accounts import views as account_views
from controlplane.accounts.apis import MeApi, TokenListCreateApi, TokenRevokeApi
from controlplane.clusters.apis import CalibrationApi, ClusterViewSet, HardwareProfileViewSet
from controlplane.common import errors
from controlplane.common.api import IdConverter
from controlplane.common.health import healthz, livez, readyz
from controlplane.common.middleware import csp_update
from controlplane.dashboard.views import dashboard, green_page
from controlplane.failures import apis as failure_pattern_apis
from controlplane.failures import views as failure_views
from controlplane.green.certificate_apis import PublicCertificateVerifyApi
from controlplane.green.views import green_report
from controlplane.jobs.apis import TrainingJobViewSet
from controlplane.metrics import metrics_view, register_product_metrics
from controlplane.planning.apis import EvaluateApi, ModelSpecViewSet, PlanViewSet, StrategySearchViewSet

register_converter(IdConverter, "id")  # an object id: at most 18 digits, else no URL matches (a 404)
register_product_metrics()  # the product's series on /metrics, read from the database at scrape time

router = DefaultRouter()
router.register("hardware-profiles", HardwareProfileViewSet, basename="hardware-profile")
router.register("clusters", ClusterViewSet, basename="cluster")
router.register("models", ModelSpecViewSet, basename="model")
router.register("plans", PlanViewSet, basename="plan")
router.register("searches", StrategySearchViewSet, basename="search")
router.register("jobs", TrainingJobViewSet, basename="job")

# The API has its own namespace ("api:job-detail", "api:docs"): the router's names (job-detail, search-list,
# plan-detail, ...) are the pages' names too, and without it {% url 'job-detail' %} on a page reversed to
# the JSON of /api/jobs/<id>/ (the last pattern of a name wins).
api_patterns = [
    path("me/", MeApi.as_view(), name="me"),
    path("tokens/", TokenListCreateApi.as_view(), name="tokens"),
    path("tokens/<id:pk>/", TokenRevokeApi.as_view(), name="token-revoke"),
    path("plans/evaluate/", EvaluateApi.as_view(), name="plan-evaluate"),
    path("calibration/", CalibrationApi.as_view(), name="calibration"),
    path("green/", include("controlplane.green.urls")),
    path("certificates/", include("controlplane.green.certificate_urls")),
    # no login: a report's holder checks it by its printed code (rate-limited)
    path(
        "public/certificates/<str:code>/verify",
        PublicCertificateVerifyApi.as_view(),
        name="certificate-public-verify",
    ),
    # the failure-pattern knowledge base (incidents/ before <key>/: it is no pattern's key)
    path(
        "failure-patterns/",
        failure_pattern_apis.FailurePatternListApi.as_view(),
        name="failure-pattern-list",
    ),
    path(
        "failure-patterns/incidents/",
        failure_pattern_apis.IncidentListImportApi.as_view(),
        name="failure-incident-list",
    ),
    path(
        "failure-patterns/<str:key>/",
        failure_pattern_apis.FailurePatternDetailApi.as_view(),
        name="failure-pattern-detail",
    ),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    # no inline script (the Content-Security-Policy): Swagger UI's comes from its own URL (the split view),
    # Redoc's from frontend/static/js/redoc.js; Redoc's search runs in a worker made from a blob: URL
    path(
        "docs/",
        SpectacularSwaggerSplitView.as_view(url_name="api:schema", template_name="api/swagger_ui.html"),
        name="docs",
    ),
    path(
        "redoc/",
        csp_update(worker_src=["blob:"])(
            SpectacularRedocView.as_view(url_name="api:schema", template_name="api/redoc.html")
        ),
        name="redoc",
    ),
    path("", include(router.urls)),
    # any other path under /api/ is the API's JSON 404, also with DEBUG on and for a POST without a CSRF
    # token (Django's HTML debug or CSRF page is no answer for an API client)
    re_path(r"^", csrf_exempt(errors.page_not_found), name="not-found"),
]

urlpatterns = [
    path("", dashboard, name="dashboard"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("tokens/", account_views.tokens, name="tokens"),
    path("tokens/<id:pk>/revoke/", account_views.token_revoke_view, name="token-revoke"),
    path("jobs/", include("controlplane.jobs.urls")),
    path("planning/", include("controlplane.planning.urls")),
    path("clusters/", include("controlplane.clusters.urls")),
    path("models/", include("controlplane.planning.model_urls")),
    path("hardware/", include("controlplane.clusters.hardware_urls")),
    path("green/", green_page, name="green"),
    path("green/reports/<str:code>/", green_report, name="green-report"),
    path("failure-patterns/", failure_views.failure_pattern_list, name="failure-pattern-list"),
    path("failure-patterns/<str:key>/", failure_views.failure_pattern_detail, name="failure-pattern-detail"),
    # browsers ask for /favicon.ico where a page names none (the API's docs, a PDF): the app's icon
    path("favicon.ico", RedirectView.as_view(url=static("img/favicon.svg"), permanent=True), name="favicon"),
    path("healthz", healthz, name="healthz"),
    path("livez", livez, name="livez"),
    path("readyz", readyz, name="readyz"),
    # Prometheus, for operators (every team's figures): a bearer METRICS_TOKEN, or loopback only without one
    path("metrics", metrics_view, name="metrics"),
    path("api/", include((api_patterns, "api"))),
    path("admin/", admin.site.urls),
]

# the app's own error pages (JSON under /api/): controlplane/common/errors.py
handler404 = "controlplane.common.errors.page_not_found"
handler403 = "controlplane.common.errors.permission_denied"
handler500 = "controlplane.common.errors.server_error"
