from django.contrib import admin

from controlplane.common.admin import LongRunningJobAdmin
from controlplane.jobs.models import CommComparison, TrainingJob

admin.site.register(TrainingJob, LongRunningJobAdmin)
admin.site.register(CommComparison, LongRunningJobAdmin)
