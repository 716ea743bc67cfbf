from django.apps import AppConfig


class CommonConfig(AppConfig):
    name = "controlplane.common"
    verbose_name = "Common"
