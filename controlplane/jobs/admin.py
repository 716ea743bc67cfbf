from django.contrib import admin

from controlplane.common.admin import LongRunningJobAdmin
from controlplane.jobs.models import TrainingJob

admin.site.register(TrainingJob, LongRunningJobAdmin)
