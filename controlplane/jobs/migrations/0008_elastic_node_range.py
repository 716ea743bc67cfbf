# Elastic node range: TrainingJob.min_nodes (existing jobs: their nnodes, i.e. not elastic) and the node a
# node-lost fault hit.

import django.core.validators
from django.db import migrations, models
from django.db.models import F


def not_elastic(apps, schema_editor):
    apps.get_model("jobs", "TrainingJob").objects.update(min_nodes=F("nnodes"))


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0007_snapshot_kind_log"),
    ]

    operations = [
        migrations.AddField(
            model_name="trainingjob",
            name="min_nodes",
            field=models.PositiveIntegerField(
                default=1,
                help_text="the fewest nodes it goes on with (elastic when fewer than nnodes); default: nnodes",
                validators=[django.core.validators.MinValueValidator(1)],
            ),
            preserve_default=False,
        ),
        migrations.RunPython(not_elastic, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="trainingjob",
            name="min_nodes",
            field=models.PositiveIntegerField(
                default=None,
                help_text="the fewest nodes it goes on with (elastic when fewer than nnodes); default: nnodes",
                validators=[django.core.validators.MinValueValidator(1)],
            ),
        ),
        migrations.AlterField(
            model_name="trainingjob",
            name="nnodes",
            field=models.PositiveIntegerField(
                default=1,
                help_text="the most nodes it runs on (max_nodes in the API); the world size divides over them",
            ),
        ),
        migrations.AddField(
            model_name="jobfault",
            name="node_rank",
            field=models.IntegerField(blank=True, help_text="the node it hit (node-lost)", null=True),
        ),
        migrations.AddField(
            model_name="jobfault",
            name="node_name",
            field=models.CharField(blank=True, default="", help_text="that node's name", max_length=200),
        ),
        migrations.AlterField(
            model_name="jobfault",
            name="kind",
            field=models.CharField(
                choices=[
                    ("rank-killed", "Rank Killed"),
                    ("rank-hung", "Rank Hung"),
                    ("rank-failed", "Rank Failed"),
                    ("worker-lost", "Worker Lost"),
                    ("node-lost", "Node Lost"),
                ],
                max_length=16,
            ),
        ),
    ]
