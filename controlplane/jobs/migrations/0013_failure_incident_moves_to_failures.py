"""FailureIncident is the failures app's now (``controlplane/failures/migrations/0001_initial.py``): removed
from the jobs app's state only; its table, ``jobs_failureincident``, is the failures app's model's."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0012_job_external_launcher"),
        ("failures", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="FailureIncident")],
            database_operations=[],
        ),
    ]
