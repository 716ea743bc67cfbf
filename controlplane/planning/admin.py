from django.contrib import admin

from controlplane.common.admin import LongRunningJobAdmin
from controlplane.planning.models import StrategySearch

admin.site.register(StrategySearch, LongRunningJobAdmin)
