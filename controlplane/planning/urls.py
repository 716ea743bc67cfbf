"""Pages of the planner: searches, plans, the strategy visualizer."""

from django.urls import path

from controlplane.planning import views

urlpatterns = [
    path("", views.search_list, name="search-list"),
    path("seed/", views.seed_view, name="planning-seed"),
    path("searches/<int:pk>/", views.search_detail, name="search-detail"),
    path("plans/", views.plan_list, name="plan-list"),
    path("plans/diff/", views.plan_diff, name="plan-diff"),
    path("plans/<int:pk>/", views.plan_detail, name="plan-detail"),
]
