from django.apps import AppConfig


class GreenConfig(AppConfig):
    name = "controlplane.green"
    label = "green"
