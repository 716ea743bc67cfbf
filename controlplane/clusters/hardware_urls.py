"""Pages of the hardware profiles."""

from django.urls import path

from controlplane.clusters import views

urlpatterns = [
    path("", views.hardware_list, name="hardware-list"),
    path("compare/", views.hardware_compare, name="hardware-compare"),
    path("<id:pk>/", views.hardware_detail, name="hardware-detail"),
]
