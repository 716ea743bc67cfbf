from django.apps import AppConfig


class FailuresConfig(AppConfig):
    name = "controlplane.failures"
    label = "failures"
