"""URL map: pages, the REST API under /api/, OpenAPI, health, admin. Websockets: controlplane/live/routing.py."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from controlplane.accounts import views as account_views
from controlplane.accounts.apis import MeApi, TokenListCreateApi, TokenRevokeApi
from controlplane.clusters.apis import ClusterViewSet, HardwareProfileViewSet
from controlplane.common.health import healthz
from controlplane.dashboard.views import dashboard
from controlplane.jobs.apis import TrainingJobViewSet
from controlplane.planning.apis import EvaluateApi, ModelSpecViewSet, PlanViewSet, StrategySearchViewSet

router = DefaultRouter()
router.register("hardware-profiles", HardwareProfileViewSet, basename="hardware-profile")
router.register("clusters", ClusterViewSet, basename="cluster")
router.register("models", ModelSpecViewSet, basename="model")
router.register("plans", PlanViewSet, basename="plan")
router.register("searches", StrategySearchViewSet, basename="search")
router.register("jobs", TrainingJobViewSet, basename="job")

api = [
    path("me/", MeApi.as_view(), name="api-me"),
    path("tokens/", TokenListCreateApi.as_view(), name="api-tokens"),
    path("tokens/<int:pk>/", TokenRevokeApi.as_view(), name="api-token-revoke"),
    path("plans/evaluate/", EvaluateApi.as_view(), name="api-plan-evaluate"),
    path("green/", include("controlplane.green.urls")),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("redoc/", SpectacularRedocView.as_view(url_name="api-schema"), name="api-redoc"),
    path("", include(router.urls)),
]

urlpatterns = [
    path("", dashboard, name="dashboard"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("tokens/", account_views.tokens, name="tokens"),
    path("tokens/<int:pk>/revoke/", account_views.token_revoke_view, name="token-revoke"),
    path("jobs/", include("controlplane.jobs.urls")),
    path("planning/", include("controlplane.planning.urls")),
    path("healthz", healthz, name="healthz"),
    path("api/", include(api)),
    path("admin/", admin.site.urls),
]
