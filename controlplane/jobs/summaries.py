"""A job as ``GET /api/jobs/`` lists it: a compact row from the job's own columns, the figures it shows read
out of its JSON documents by the database. The detail's serializer (``controlplane.jobs.apis``) shares its
first fields (:data:`JOB_HEAD_FIELDS`)."""

from __future__ import annotations

import math

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.common.api import TeamOwnedSerializer
from controlplane.jobs.models import TrainingJob

JOB_HEAD_FIELDS = (
    "id",
    "team",
    "name",
    "state",
    "progress",
    "attempts",
    "nnodes",
    "min_nodes",
    "max_nodes",
    "elastic",
    "nproc_per_node",
    "world_size",
)
"""What a job is and where it stands: the first fields of its detail and of its list row alike."""


SUMMARY_FIGURES = (
    "steps",
    "tokens_per_s",
    "step_time_s",
    "loss_first",
    "loss_last",
    "val_loss",
    "tflops_per_device",
    "mfu",
    "memory_GiB",
)
"""The scalar figures of a job's stored run summary (``measured``) that its list row carries."""


class TrainingJobSummarySerializer(TeamOwnedSerializer):
    """A job as ``GET /api/jobs/`` lists it: what it is and where it stands, from its own row (stored when its
    state changes) and nothing else; ``GET /api/jobs/<id>/`` has the rest (config, plan, nodes, faults,
    snapshots, energy, risk, ...). A list row used to be the detail (about 10 ms and 10 KB a job, computed from
    its events on every request: 3.3 lists a second at 50 users)."""

    stream = serializers.CharField(read_only=True)
    max_nodes = serializers.IntegerField(read_only=True)
    elastic = serializers.BooleanField(read_only=True)
    world_size = serializers.IntegerField(read_only=True)
    predicted_step_time_s = serializers.SerializerMethodField(
        help_text="the plan's predicted step time (null without a plan)"
    )
    figures = serializers.SerializerMethodField(
        help_text="the run summary's figures the attempt stored when it ended (steps, tokens_per_s, "
        "step_time_s, loss_first, loss_last, val_loss, tflops_per_device, mfu, memory_GiB); {} before"
    )
    url = serializers.SerializerMethodField(help_text="the job's detail in this API")

    class Meta:
        model = TrainingJob
        fields = [
            *JOB_HEAD_FIELDS,
            "source_plan",
            "predicted_step_time_s",
            "stream",
            "tags",
            "cancel_requested",
            "human_readable_error",
            "figures",
            "url",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    @staticmethod
    def _number(value) -> float | int | None:
        if value is None or isinstance(value, bool):
            return None
        # SQLite's json_extract gives the stored number itself, PostgreSQL's ->> its text: "300" is an int,
        # "5200.0" a float, on both alike
        if isinstance(value, str):
            value = value.strip()
            try:
                value = int(value) if value.lstrip("-").isdigit() else float(value)
            except ValueError:
                return None
        if not isinstance(value, int | float) or not math.isfinite(value):
            return None
        return value

    def get_predicted_step_time_s(self, job) -> float | None:
        return self._number(getattr(job, "predicted_figure", None))

    @extend_schema_field({"type": "object", "additionalProperties": True})
    def get_figures(self, job) -> dict:
        # read out of the JSON by the database (``list_queryset``): the summary's arrays (a loss per step, a
        # step time per step) are never sent here, nor decoded
        figures = {k: self._number(getattr(job, f"figure_{k}", None)) for k in SUMMARY_FIGURES}
        return {k: v for k, v in figures.items() if v is not None}

    @staticmethod
    def list_queryset(qs):
        """``qs`` as the list reads it: the job's JSON documents left in the database, the figures a row shows
        taken out of them there (SQLite's json_extract, PostgreSQL's ->>)."""
        from django.db.models.fields.json import KT

        return qs.defer("config", "plan", "measured", "log_tail", "error", "exit_codes", "goodput").annotate(
            predicted_figure=KT("plan__predicted__step_time_s"),
            **{f"figure_{k}": KT(f"measured__{k}") for k in SUMMARY_FIGURES},
        )

    def get_url(self, job) -> str:
        return f"/api/jobs/{job.pk}/"
