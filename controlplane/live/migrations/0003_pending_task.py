from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("live", "0002_pending_event"),
    ]

    operations = [
        migrations.CreateModel(
            name="PendingTask",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("task", models.CharField(max_length=200)),
                ("args", models.JSONField(default=list)),
                ("queue", models.CharField(max_length=100)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("attempts", models.PositiveIntegerField(default=0)),
                ("last_error", models.TextField(blank=True, default="")),
            ],
            options={
                "ordering": ["id"],
            },
        ),
    ]
