from django.contrib import admin

from controlplane.common.admin import LongRunningJobAdmin
from controlplane.jobs.models import CommComparison, JobFault, JobSnapshot, TrainingJob

admin.site.register(TrainingJob, LongRunningJobAdmin)
admin.site.register(CommComparison, LongRunningJobAdmin)


@admin.register(JobFault)
class JobFaultAdmin(admin.ModelAdmin):
    list_display = ("job", "attempt", "restart", "kind", "rank", "step", "steps_lost", "rto_s", "detected_at")
    list_filter = ("kind",)


@admin.register(JobSnapshot)
class JobSnapshotAdmin(admin.ModelAdmin):
    list_display = ("job", "name", "step", "kind", "bytes_written", "verified", "removed", "created_at")
    list_filter = ("kind", "verified", "removed")
