# Who cancelled a job (issue 10: a user's cancel ends as a clean "cancelled by <user>").

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0002_commcomparison"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="trainingjob",
            name="cancelled_by",
            field=models.ForeignKey(
                blank=True,
                help_text="who asked to cancel the current attempt (its page says 'cancelled by <user>')",
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
    ]
