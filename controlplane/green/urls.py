"""Green-training API, mounted at /api/green/: carbon-aware schedules (apis.py)."""

from django.urls import path

from controlplane.green import apis

urlpatterns = [
    path("schedules/", apis.ScheduleListCreateApi.as_view(), name="green-schedule-list"),
    path("schedules/<id:pk>/", apis.ScheduleDetailApi.as_view(), name="green-schedule-detail"),
]
