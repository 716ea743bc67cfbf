"""API: carbon-aware schedules, the team's knowledge base of green schedules — compute and store one (POST),
list, read, delete. Mounted at /api/green/."""

from __future__ import annotations

import re

from django.conf import settings
from django.http import Http404
from drf_spectacular.utils import extend_schema, extend_schema_field, extend_schema_serializer
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.common.api import NameField, Pagination, TeamField, error_response, only_team_of
from controlplane.common.documents import StrictFieldsMixin
from controlplane.green import selectors, services
from workers.green.job import ZONE_PATTERN
from workers.green.schedule import OBJECTIVES
from workers.green.series import KINDS

MAX_HOURS = 168.0
"""A week: the longest window a schedule looks at (longer than the forecast horizon of the live providers
here, e.g. the UK Carbon Intensity API's 48 h)."""
MIN_HOURS = 1 / 60  # one minute: a shorter job has nothing to shift
MAX_KW = 1_000_000.0  # 1 GW: an input bound (a typo guard), not a figure of any site
MAX_PUE = 3.0  # an input bound: facility power / IT power above 3 is almost surely a typo
ZONE = ZONE_PATTERN  # one rule for a schedule's zone and a job's energy.zone
CURRENCY = re.compile(r"^[A-Za-z]{0,8}$")


def hours_field(what: str, **kwargs) -> serializers.FloatField:
    return serializers.FloatField(
        min_value=MIN_HOURS,
        max_value=MAX_HOURS,
        error_messages={
            "min_value": f"must be at least one minute ({MIN_HOURS:.4f} h): {what}",
            "max_value": f"must be at most {MAX_HOURS:g} h (a week): {what}",
        },
        help_text=what,
        **kwargs,
    )


def kw_field(what: str, **kwargs) -> serializers.FloatField:
    return serializers.FloatField(
        min_value=0.001,
        max_value=MAX_KW,
        error_messages={
            "min_value": f"must be more than 0 (at least 0.001 kW, 1 W): {what}",
            "max_value": f"must be at most {MAX_KW:,.0f} kW (1 GW): {what}",
        },
        help_text=what,
        **kwargs,
    )


# --- what the API answers -------------------------------------------------------------------------------
class IntensityProvenanceSerializer(serializers.Serializer):
    """Where the carbon intensity came from (``IntensitySeries.describe``)."""

    provider = serializers.CharField(
        help_text="history, csv, electricitymaps, watttime, uk-carbon-intensity, codecarbon"
    )
    zone = serializers.CharField()
    kind = serializers.ChoiceField(
        choices=KINDS, help_text="history: measured past figures used as a stand-in forecast (say so)"
    )
    unit = serializers.CharField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    points = serializers.IntegerField()
    source = serializers.CharField(help_text="a citation a person can follow")


class PriceProvenanceSerializer(serializers.Serializer):
    kind = serializers.CharField(help_text="flat")
    currency = serializers.CharField(allow_blank=True)
    source = serializers.CharField()
    price_per_kwh = serializers.FloatField(required=False)


class ScheduleResultSerializer(serializers.Serializer):
    """What the engine chose (``workers.green.schedule.Schedule.to_dict``)."""

    start = serializers.DateTimeField(help_text="the first slot's start")
    end = serializers.DateTimeField(help_text="the last slot's end")
    slots = serializers.ListField(
        child=serializers.ListField(child=serializers.DateTimeField(), min_length=2, max_length=2),
        help_text="[[start, end], ...]: where the job runs; one slot unless it is interruptible",
    )
    kgco2e = serializers.FloatField(help_text="location-based, over the chosen slots")
    kgco2e_now = serializers.FloatField(help_text="starting now and running without a break")
    saving_pct = serializers.FloatField(help_text="carbon saving vs starting now, percent")
    cost = serializers.FloatField(allow_null=True)
    cost_now = serializers.FloatField(allow_null=True)
    objective = serializers.ChoiceField(choices=OBJECTIVES)
    objective_value = serializers.FloatField()
    objective_value_now = serializers.FloatField()
    energy_kwh = serializers.FloatField(help_text="power_kw x PUE x duration")
    now = serializers.DateTimeField()
    finish_by = serializers.DateTimeField()
    duration_h = serializers.FloatField()
    interruptible = serializers.BooleanField()
    power_kw = serializers.FloatField()
    pue = serializers.FloatField()
    carbon_price_per_t = serializers.FloatField(allow_null=True)
    power_cap_kw = serializers.FloatField(allow_null=True)
    now_fits_cap = serializers.BooleanField(help_text="whether starting now would respect the site cap")
    intensity = IntensityProvenanceSerializer()
    history_used_as_forecast = serializers.BooleanField()
    price = PriceProvenanceSerializer(allow_null=True)
    method = serializers.CharField()
    notes = serializers.ListField(child=serializers.CharField())


class ScheduleRequestSerializer(serializers.Serializer):
    """What was asked, as the engine took it."""

    source = serializers.DictField(
        help_text='{"kind": "zone", "zone"} or {"kind": "forecast_csv", "rows", "start", "end", "sha256", '
        '"series_kind"}: the uploaded forecast\'s provenance'
    )
    zone = serializers.CharField()
    now = serializers.DateTimeField()
    now_source = serializers.CharField(
        help_text="given with the request, the current time, or the forecast's start"
    )
    duration_h = serializers.FloatField()
    power_kw = serializers.FloatField()
    deadline_h = serializers.FloatField()
    interruptible = serializers.BooleanField()
    pue = serializers.FloatField()
    objective = serializers.ChoiceField(choices=OBJECTIVES)
    price_per_kwh = serializers.FloatField(allow_null=True)
    currency = serializers.CharField(allow_blank=True)
    carbon_price_per_t = serializers.FloatField(allow_null=True)
    site_cap_kw = serializers.FloatField(allow_null=True)


class ReservationSerializer(serializers.Serializer):
    """Power a stored schedule of the team held in the window (a site cap shares it)."""

    schedule = serializers.IntegerField()
    name = serializers.CharField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    kw = serializers.FloatField()


class SkippedSourceSerializer(serializers.Serializer):
    provider = serializers.CharField()
    reason = serializers.CharField()


class IntensityWindowSerializer(serializers.Serializer):
    """The series scheduled on, from now to finish_by: ``values[i]`` holds from ``times[i]`` to the next
    time (the last to ``end``)."""

    times = serializers.ListField(child=serializers.DateTimeField())
    values = serializers.ListField(child=serializers.FloatField())
    end = serializers.DateTimeField()
    unit = serializers.CharField()


@extend_schema_serializer(component_name="GreenScheduleRow")
class ScheduleRowSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    team = serializers.CharField(source="team.slug")
    name = serializers.CharField()
    zone = serializers.CharField()
    created_by = serializers.CharField(source="created_by.username", allow_null=True)
    created_at = serializers.DateTimeField()
    request = ScheduleRequestSerializer()
    result = ScheduleResultSerializer()
    reservations = ReservationSerializer(many=True)
    skipped = SkippedSourceSerializer(many=True, help_text="the better intensity sources not used, and why")
    job = serializers.SerializerMethodField(
        help_text="the training job that runs under it: {id, name, state}"
    )

    @extend_schema_field({"type": "object", "nullable": True, "additionalProperties": True})
    def get_job(self, schedule) -> dict | None:
        from django.core.exceptions import ObjectDoesNotExist

        try:
            job = schedule.job
        except ObjectDoesNotExist:
            return None
        return {"id": job.pk, "name": job.name, "state": job.state, "url": f"/jobs/{job.pk}/"}


@extend_schema_serializer(component_name="GreenSchedule")
class ScheduleDetailSerializer(ScheduleRowSerializer):
    intensity_window = IntensityWindowSerializer()


# --- the operations -------------------------------------------------------------------------------------
class ScheduleListCreateApi(APIView):
    """The team's green schedules, newest first; POST computes one and stores it."""

    pagination_class = Pagination

    @extend_schema_serializer(component_name="GreenScheduleCreate")
    class InputSerializer(StrictFieldsMixin, serializers.Serializer):
        """A job to schedule: its duration and power, its deadline, and the carbon intensity to schedule on (a
        zone, or an uploaded forecast CSV)."""

        team = TeamField()
        name = NameField(required=False, help_text="default: '<zone> <duration> h at <power> kW'")
        zone = serializers.CharField(
            required=False,
            max_length=64,
            help_text="the grid zone (GB, DE, FR, US-CAL-CISO...; default: the deployment's "
            "CANN_TRAIN_GRID_ZONE). Its series: a configured live provider, else the shipped 2020 history (GB, "
            "DE) moved onto the requested dates and labelled history, else CodeCarbon's annual country "
            "average. With forecast_csv: the zone the forecast describes",
        )
        forecast_csv = serializers.CharField(
            required=False,
            max_length=services.MAX_FORECAST_CSV_CHARS,
            trim_whitespace=False,
            error_messages={
                "blank": "the forecast CSV is empty: a header such as 'time,gco2_per_kwh' and one row per time",
                "max_length": f"the forecast CSV is longer than {services.MAX_FORECAST_CSV_CHARS:,} characters: "
                "send only the rows from now to now + deadline",
            },
            help_text="a carbon-intensity forecast to schedule on instead of the zone's series: a header naming "
            "a time column (time, datetime) and an intensity column in gCO2e/kWh (gco2_per_kwh, "
            "carbon_intensity, Carbon Intensity), one row per time (ISO 8601, UTC without an offset); each "
            "value holds until the next time",
        )
        now = serializers.DateTimeField(
            required=False,
            allow_null=True,
            help_text="when the job is ready (default or null: the current time; with forecast_csv, its first "
            "timestamp when it does not cover the current time)",
        )
        duration_h = hours_field("the job's predicted run time in hours")
        power_kw = kw_field(
            "the job's average IT power in kW (devices and hosts, without the facility's PUE)"
        )
        deadline_h = hours_field("the job must finish by now + deadline_h")
        interruptible = serializers.BooleanField(
            default=False, help_text="the job resumes from snapshots: it may run in several slots"
        )
        pue = serializers.FloatField(
            default=1.0,
            min_value=1.0,
            max_value=MAX_PUE,
            error_messages={
                "min_value": "PUE is facility power / IT power, so at least 1",
                "max_value": f"a PUE above {MAX_PUE:g} is almost surely a typo (facility power / IT power)",
            },
            help_text="the facility's power usage effectiveness (default 1: IT power only)",
        )
        objective = serializers.ChoiceField(
            choices=OBJECTIVES,
            default="carbon",
            help_text="carbon (kgCO2e), cost (needs price_per_kwh) or mix (cost + carbon_price_per_t x tCO2e)",
        )
        price_per_kwh = serializers.FloatField(
            required=False,
            allow_null=True,
            min_value=0,
            max_value=100,
            error_messages={
                "min_value": "a price per kWh is never below 0",
                "max_value": "at most 100 per kWh",
            },
            help_text="flat electricity price, currency per kWh (the cost beside the carbon)",
        )
        currency = serializers.CharField(
            required=False, default="", allow_blank=True, max_length=8, help_text="e.g. EUR, GBP"
        )
        carbon_price_per_t = serializers.FloatField(
            required=False,
            allow_null=True,
            min_value=0,
            max_value=100_000,
            error_messages={
                "min_value": "a carbon price is never below 0",
                "max_value": "at most 100,000 per t",
            },
            help_text="internal carbon price for objective mix, currency per tCO2e",
        )
        site_cap_kw = kw_field(
            "the power the site's scheduled jobs may draw together, in kW (the team's stored schedules in "
            "the same zone hold their power over their slots)",
            required=False,
            allow_null=True,
        )

        def validate_zone(self, value: str) -> str:
            value = value.strip()
            if not ZONE.match(value):
                raise serializers.ValidationError(
                    "a grid zone is a code such as GB, DE, FR, US-CAL-CISO or CAISO_NORTH: letters, digits, "
                    "'-' and '_', starting with a letter"
                )
            return value.upper()

        def validate_currency(self, value: str) -> str:
            if not CURRENCY.match(value):
                raise serializers.ValidationError("a currency is up to 8 letters, e.g. EUR or GBP")
            return value.upper()

        def validate_now(self, value):
            if value is not None and not 2000 <= value.year <= 2100:
                raise serializers.ValidationError(
                    f"now must lie between the years 2000 and 2100 (got {value.isoformat()})"
                )
            return value

        def validate(self, attrs):
            attrs = super().validate(attrs)
            errors = {}
            if attrs["deadline_h"] < attrs["duration_h"]:
                errors["deadline_h"] = [
                    f"the job must finish by now + deadline_h, so deadline_h ({attrs['deadline_h']:g} h) must be "
                    f"at least its duration_h ({attrs['duration_h']:g} h)"
                ]
            objective = attrs["objective"]
            if objective in ("cost", "mix") and attrs.get("price_per_kwh") is None:
                errors["price_per_kwh"] = [f"objective {objective} needs an electricity price per kWh"]
            if objective == "mix" and attrs.get("carbon_price_per_t") is None:
                errors["carbon_price_per_t"] = [
                    "objective mix needs an internal carbon price (currency per tCO2e)"
                ]
            if objective != "mix" and attrs.get("carbon_price_per_t") is not None:
                errors["carbon_price_per_t"] = [
                    "a carbon price only enters objective mix: choose it or drop this"
                ]
            cap = attrs.get("site_cap_kw")
            if cap is not None and cap < attrs["power_kw"]:
                errors["site_cap_kw"] = [
                    f"the job draws {attrs['power_kw']:g} kW, more than the site cap of {cap:g} kW: lower the "
                    "job's power or raise the cap"
                ]
            if errors:
                raise serializers.ValidationError(errors)
            if "team" not in attrs:
                attrs["team"] = only_team_of(self.context["request"].user)
            attrs.setdefault("zone", settings.GREEN_DEFAULT_ZONE)
            return attrs

    @extend_schema(responses=ScheduleRowSerializer(many=True))
    def get(self, request):
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(selectors.schedules_of(request.user), request, view=self)
        return paginator.get_paginated_response(ScheduleRowSerializer(page, many=True).data)

    @extend_schema(
        request=InputSerializer,
        responses={
            201: ScheduleDetailSerializer,
            409: error_response(
                409,
                "The site power cap, with what the team's stored schedules in the zone already reserve, leaves "
                "the job no room before its deadline: the answer names them and what to change.",
            ),
        },
    )
    def post(self, request):
        data = self.InputSerializer(data=request.data, context={"request": request})
        data.is_valid(raise_exception=True)
        row = services.schedule_create(created_by=request.user, **data.validated_data)
        return Response(ScheduleDetailSerializer(row).data, status=status.HTTP_201_CREATED)


class ScheduleDetailApi(APIView):
    """One green schedule of the user's teams (another team's is a 404, like one that does not exist)."""

    def _schedule(self, request, pk: int):
        row = selectors.schedule_of(request.user, pk)
        if row is None:
            raise Http404("No such schedule among your teams' schedules.")
        return row

    @extend_schema(responses=ScheduleDetailSerializer)
    def get(self, request, pk: int):
        return Response(ScheduleDetailSerializer(self._schedule(request, pk)).data)

    @extend_schema(
        request=None,
        responses={
            204: None,
            409: error_response(409, "A job runs under the schedule: it is kept as its record."),
        },
    )
    def delete(self, request, pk: int):
        services.schedule_delete(schedule=self._schedule(request, pk))
        return Response(status=status.HTTP_204_NO_CONTENT)
