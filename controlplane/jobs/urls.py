"""Pages of training jobs (the API is in apis.py, mounted under /api/jobs/)."""

from django.urls import path

from controlplane.jobs import views

urlpatterns = [
    path("", views.job_list, name="job-list"),
    path("compare/", views.job_compare, name="job-compare"),
    path("<int:pk>/", views.job_detail, name="job-detail"),
    path("<int:pk>/eti/", views.job_eti_panel, name="job-eti"),
]
