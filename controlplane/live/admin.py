from django.contrib import admin

from controlplane.live.models import StreamEvent


@admin.register(StreamEvent)
class StreamEventAdmin(admin.ModelAdmin):
    """Events are team-scoped through their stream's job/search; only superusers browse them raw."""

    list_display = ("stream", "seq", "kind", "step", "time")
    list_filter = ("kind",)
    search_fields = ("stream",)

    def has_module_permission(self, request):
        return request.user.is_superuser

    def has_view_permission(self, request, obj=None):
        return request.user.is_superuser
