from django.apps import AppConfig


class PlanningConfig(AppConfig):
    name = "controlplane.planning"
    label = "planning"
