from django.contrib import admin

from controlplane.clusters.models import Cluster
from controlplane.common.admin import TeamScopedAdmin


@admin.register(Cluster)
class ClusterAdmin(TeamScopedAdmin):
    list_display = ("name", "team", "device_count", "created_at")
