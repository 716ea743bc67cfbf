"""Energy and carbon accounting: carbon-aware schedules (the knowledge base of green schedules)."""

from __future__ import annotations

from django.db import models

from controlplane.common.models import TeamOwned


class GreenSchedule(TeamOwned):
    """One carbon-aware schedule: what was asked (a job's duration, power and deadline, the intensity it was
    scheduled on) and what the engine chose (``workers.green.schedule.Schedule.to_dict()``: the start, the
    slots, kgCO2e beside starting now, the cost, the intensity's provenance). Stored schedules are also the
    power already promised on a site: a later request of the team with a site power cap counts their slots
    as reservations (``services.schedule_create``)."""

    name = models.CharField(max_length=200)
    zone = models.CharField(max_length=64, help_text="the grid zone (GB, DE, US-CAL-CISO...)")
    request = models.JSONField(
        help_text="what was asked: the intensity source (zone or an uploaded forecast's provenance), now and "
        "where it came from, duration_h, power_kw, deadline_h, interruptible, pue, objective, prices, "
        "site_cap_kw"
    )
    result = models.JSONField(help_text="the engine's Schedule.to_dict()")
    intensity_window = models.JSONField(
        default=dict, help_text='{"times": [...], "values": [...]}: the series scheduled on, now to finish_by'
    )
    reservations = models.JSONField(
        default=list, help_text="the team's stored schedules whose slots the site power cap had to share"
    )
    skipped = models.JSONField(default=list, help_text="the better intensity sources not used, and why")
    # the span of the chosen slots and the power held over it: what a later capped request reads
    start = models.DateTimeField(db_index=True)
    end = models.DateTimeField()
    power_kw = models.FloatField()
    created_by = models.ForeignKey(
        "auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["team", "zone", "start"], name="green_schedule_team_zone")]

    def __str__(self) -> str:
        return self.name

    @property
    def slots(self) -> list[list[str]]:
        return self.result.get("slots", [])


from controlplane.green.certificate_models import GreenCertificate  # noqa: E402,F401  (its own module: the report)
