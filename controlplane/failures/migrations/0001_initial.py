"""The failure incidents move from the jobs app to their own, in Django's state only: the table stays
``jobs_failureincident`` (``db_table``), so nothing is copied and no row is lost."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("accounts", "0001_initial"),
        ("jobs", "0012_job_external_launcher"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="FailureIncident",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("updated_at", models.DateTimeField(auto_now=True)),
                        ("node", models.CharField(max_length=200)),
                        ("occurred_at", models.DateTimeField()),
                        ("kind", models.CharField(help_text="as the incident list wrote it", max_length=200)),
                        (
                            "source",
                            models.CharField(help_text="the incident list's file name", max_length=200),
                        ),
                        ("line", models.PositiveIntegerField(help_text="its line in that file")),
                        (
                            "created_by",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "team",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="+",
                                to="accounts.team",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "jobs_failureincident",
                        "ordering": ["-occurred_at", "pk"],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("team", "node", "occurred_at", "kind"), name="unique_team_incident"
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
