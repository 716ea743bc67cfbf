# A communication comparison can be cancelled (issue 10: progress, ETA and cancel for "Compare communication
# methods"): the task polls this flag between steps and stops the running method's processes.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0004_job_tags_notes"),
    ]

    operations = [
        migrations.AddField(
            model_name="commcomparison",
            name="cancel_requested",
            field=models.BooleanField(
                default=False,
                help_text="asked to stop: the running method's processes are stopped, the network torn down",
            ),
        ),
    ]
