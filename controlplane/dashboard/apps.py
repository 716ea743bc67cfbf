from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "controlplane.dashboard"
    verbose_name = "Dashboard"
