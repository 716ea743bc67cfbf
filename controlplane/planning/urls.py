"""Pages of the planner: searches, plans, the strategy visualizer."""

from django.urls import path

from controlplane.planning import views

urlpatterns = [
    path("", views.search_list, name="search-list"),
]
