"""Team-aware admin: staff who are not superusers see and assign only their own teams' objects."""

from __future__ import annotations

from django.contrib import admin

from controlplane.accounts.selectors import scoped, teams_of


class TeamScopedAdmin(admin.ModelAdmin):
    list_filter = ("team",)

    def get_queryset(self, request):
        qs = super().get_queryset(request)
        return qs if request.user.is_superuser else scoped(qs, request.user)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "team" and not request.user.is_superuser:
            kwargs["queryset"] = teams_of(request.user)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class LongRunningJobAdmin(TeamScopedAdmin):
    list_display = ("__str__", "team", "state", "progress", "created_at", "finished_at")
    list_filter = ("team", "state")
    readonly_fields = ("created_at", "updated_at", "started_at", "finished_at")
