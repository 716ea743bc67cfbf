"""API: the failure-pattern knowledge base — the kinds of failure that interrupt training, each with its
published rate and source, its telemetry precursors (assumed) and its prevention action, extended with the
incidents the team imported. Mounted at /api/failure-patterns/."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, extend_schema_field, extend_schema_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.common.api import NameField, Pagination, TeamField, only_team_of
from controlplane.common.documents import StrictFieldsMixin
from controlplane.failures import selectors, services
from controlplane.failures.models import FailureIncident
from workers.reliability.risk.patterns import ACTIONS, pattern_key

DEFAULT_SOURCE = "pasted incident list"


# --- what the API answers -------------------------------------------------------------------------------
class PublishedSerializer(serializers.Serializer):
    """What Llama 3's Table 5 says of the kind (Dubey et al. 2024)."""

    count = serializers.IntegerField(help_text="interruptions of this kind among the 419 unexpected ones")
    percent_printed = serializers.FloatField(help_text="the percentage as Table 5 prints it")
    share = serializers.FloatField(help_text="count / 419")
    rate_per_node_day = serializers.FloatField(help_text="interruptions of this kind per node-day")
    source = serializers.CharField(help_text="where count and share come from")
    rate_source = serializers.CharField(help_text="where the per-node-day rate comes from")
    note = serializers.CharField(
        allow_blank=True, help_text="where the printed figure differs from its count"
    )


class SignalSerializer(serializers.Serializer):
    key = serializers.CharField()
    name = serializers.CharField()
    effect = serializers.CharField(help_text="how it drifts before the failure (assumed)")
    features = serializers.ListField(child=serializers.CharField(), help_text="the risk features it moves")
    metrics = serializers.ListField(
        child=serializers.CharField(), help_text="our telemetry names behind them (*: any device)"
    )


class XidCodeSerializer(serializers.Serializer):
    code = serializers.IntegerField()
    description = serializers.CharField(help_text="NVIDIA's Xid catalog")


class PrecursorSerializer(serializers.Serializer):
    """What the kind shows before it happens: assumptions of the fault simulator, labelled so."""

    share = serializers.FloatField(help_text="of the failures of this kind, the share with any precursor")
    lead_min_s = serializers.FloatField()
    lead_max_s = serializers.FloatField()
    signals = SignalSerializer(many=True)
    xid_codes = XidCodeSerializer(many=True)
    why = serializers.CharField()
    assumed = serializers.BooleanField()
    source = serializers.CharField()


class PreventionSerializer(serializers.Serializer):
    action = serializers.ChoiceField(choices=list(ACTIONS))
    summary = serializers.CharField()
    reason = serializers.CharField(help_text="why this action fits the kind")
    tiers = serializers.ListField(
        child=serializers.CharField(), help_text="what the risk watch does at each risk, for this kind"
    )


class IncidentSourceSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="the incident list's file name")
    count = serializers.IntegerField()


class ObservedSerializer(serializers.Serializer):
    """The kind among the incidents your teams imported."""

    count = serializers.IntegerField()
    share = serializers.FloatField(help_text="of all your teams' imported incidents")
    first_seen = serializers.DateTimeField()
    last_seen = serializers.DateTimeField()
    nodes = serializers.ListField(child=serializers.CharField(), help_text="at most 100 (node_count: all)")
    node_count = serializers.IntegerField()
    spellings = serializers.ListField(
        child=serializers.CharField(), help_text="the kind as the lists wrote it"
    )
    sources = IncidentSourceSerializer(many=True)


@extend_schema_serializer(component_name="FailurePattern")
class FailurePatternSerializer(serializers.Serializer):
    key = serializers.CharField()
    component = serializers.CharField()
    category = serializers.CharField()
    origin = serializers.ChoiceField(
        choices=["published", "imported"], help_text="imported: only your incident lists name it"
    )
    published = PublishedSerializer(allow_null=True, help_text="null: no published rate")
    precursor = PrecursorSerializer(allow_null=True, help_text="null: no known precursor")
    prevention = PreventionSerializer()
    observed = ObservedSerializer(allow_null=True, help_text="null: none of your incidents is of this kind")
    note = serializers.CharField(allow_blank=True)


@extend_schema_serializer(component_name="FailureIncident")
class IncidentSerializer(serializers.ModelSerializer):
    team = serializers.CharField(source="team.slug")
    pattern = serializers.SerializerMethodField(help_text="the pattern the kind belongs to")

    class Meta:
        model = FailureIncident
        fields = ["id", "team", "node", "occurred_at", "kind", "pattern", "source", "line", "created_at"]

    @extend_schema_field(OpenApiTypes.STR)
    def get_pattern(self, incident) -> str:
        return pattern_key(incident.kind)


class IncidentImportSerializer(serializers.Serializer):
    team = serializers.CharField()
    source = serializers.CharField()
    rows = serializers.IntegerField(help_text="incidents in the list")
    imported = serializers.IntegerField(help_text="new ones stored")
    duplicates = serializers.IntegerField(help_text="ones the team already had (or listed twice)")
    patterns = serializers.DictField(
        child=serializers.IntegerField(), help_text="the new incidents per pattern key"
    )


# --- the operations -------------------------------------------------------------------------------------
class FailurePatternListApi(APIView):
    """Every failure pattern: Table 5's kinds in its order, then the kinds only your incidents name."""

    pagination_class = Pagination

    @extend_schema(responses=FailurePatternSerializer(many=True))
    def get(self, request):
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(selectors.failure_patterns_of(request.user), request, view=self)
        return paginator.get_paginated_response(FailurePatternSerializer(page, many=True).data)


class FailurePatternDetailApi(APIView):
    @extend_schema(responses=FailurePatternSerializer)
    def get(self, request, key: str):
        """One pattern by its key (``gpu_hbm3``) or its kind as written (``GPU HBM3 Memory``)."""
        pattern = selectors.failure_pattern_of(request.user, key)
        if pattern is None:
            raise NotFound(
                f"No failure pattern {key!r}: neither a kind of the published taxonomy (GET "
                "/api/failure-patterns/ lists them) nor a kind your teams' incidents name."
            )
        return Response(FailurePatternSerializer(pattern).data)


class _ImportInput(StrictFieldsMixin, serializers.Serializer):
    team = TeamField()
    source_name = NameField(
        required=False, help_text="the name the incidents are filed under (default: the file's name)"
    )

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if "team" not in attrs:
            attrs["team"] = only_team_of(self.context["request"].user)
        return attrs


@extend_schema_serializer(component_name="IncidentListText")
class IncidentTextSerializer(_ImportInput):
    """An incident list as text."""

    csv = serializers.CharField(
        max_length=services.MAX_INCIDENT_CSV_CHARS,
        trim_whitespace=False,
        error_messages={
            "blank": "the incident list is empty: a header 'node,time,kind' and one line per incident",
            "max_length": f"the incident list is longer than {services.MAX_INCIDENT_CSV_CHARS:,} characters: "
            "split it",
        },
        help_text="CSV with a header naming node, time, kind (other columns are ignored): node as your "
        "telemetry names it, time in ISO 8601 with a zone or Unix seconds, kind free text (a published "
        "kind's key or name where one fits); lines starting with # are comments",
    )


@extend_schema_serializer(component_name="IncidentListUpload")
class IncidentUploadSerializer(_ImportInput):
    """An incident list as an uploaded CSV file."""

    file = serializers.FileField(help_text="the CSV file (UTF-8), as in csv")


class IncidentListImportApi(APIView):
    """The incidents your teams imported, newest first; POST imports an incident list (CSV), which extends
    the failure patterns: counts per kind, and new patterns for kinds the taxonomy lacks."""

    pagination_class = Pagination

    @extend_schema(responses=IncidentSerializer(many=True))
    def get(self, request):
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(selectors.incidents_of(request.user), request, view=self)
        return paginator.get_paginated_response(IncidentSerializer(page, many=True).data)

    @extend_schema(
        request={
            "application/json": IncidentTextSerializer,
            "application/yaml": IncidentTextSerializer,
            "application/x-www-form-urlencoded": IncidentTextSerializer,
            "multipart/form-data": IncidentUploadSerializer,
        },
        responses={201: IncidentImportSerializer},
    )
    def post(self, request):
        upload = (request.content_type or "").startswith("multipart/form-data")
        serializer_class = IncidentUploadSerializer if upload else IncidentTextSerializer
        data = serializer_class(data=request.data, context={"request": request})
        data.is_valid(raise_exception=True)
        attrs = data.validated_data
        field = "file" if upload else "csv"
        if upload:
            text, name = self._read(attrs["file"])
        else:
            text, name = attrs["csv"], DEFAULT_SOURCE
        source = attrs.get("source_name") or name
        try:
            result = services.incidents_import(
                team=attrs["team"], text=text, source=source, created_by=request.user
            )
        except ValueError as exc:
            raise ValidationError({field: str(exc).split("\n")}) from None
        return Response(IncidentImportSerializer(result).data, status=status.HTTP_201_CREATED)

    @staticmethod
    def _read(upload) -> tuple[str, str]:
        from workers.planner.specs import name_problem

        if upload.size > services.MAX_INCIDENT_CSV_CHARS:
            raise ValidationError(
                {"file": [f"at most {services.MAX_INCIDENT_CSV_CHARS:,} bytes: split the incident list"]}
            )
        try:
            text = upload.read().decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ValidationError(
                {"file": [f"not UTF-8 text (byte {exc.start}): save the incident list as UTF-8 CSV"]}
            ) from None
        name = upload.name or "uploaded.csv"
        return text, (name if not name_problem(name) else "uploaded.csv")
