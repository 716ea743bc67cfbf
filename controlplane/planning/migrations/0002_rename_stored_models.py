"""The Django rows get their own names (``StoredModelSpec``, ``StoredPlan``), so that they are told apart
from the planner's dataclasses ``ModelSpec`` and ``Plan`` without aliasing. Tables are renamed, data kept."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("planning", "0001_initial"),
        ("jobs", "0002_commcomparison"),
        ("clusters", "0001_initial"),
        ("accounts", "0001_initial"),
    ]

    operations = [
        migrations.RenameModel("ModelSpec", "StoredModelSpec"),
        migrations.RenameModel("Plan", "StoredPlan"),
    ]
