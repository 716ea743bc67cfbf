# Tags and notes on training jobs (issue 10: a sortable, filterable run table).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0003_trainingjob_cancelled_by"),
    ]

    operations = [
        migrations.AddField(
            model_name="trainingjob",
            name="tags",
            field=models.JSONField(
                blank=True, default=list, help_text="short labels (at most 20, 1-40 characters each)"
            ),
        ),
        migrations.AddField(
            model_name="trainingjob",
            name="notes",
            field=models.TextField(
                blank=True, default="", help_text="free text about the run (at most 10,000 characters)"
            ),
        ),
    ]
