"""API: hardware profiles and cluster topologies (the ``cluster.json`` contract)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.exceptions import APIException
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.clusters.models import Cluster, HardwareProfile
from controlplane.common.api import TeamScopedViewSet, error_response
from controlplane.common.documents import DocumentSerializer, checked
from workers import planner


class ClusterSerializer(DocumentSerializer):
    """Reads and writes the ``cluster.json`` document; ``id``, ``team`` and timestamps are added."""

    document = planner.ClusterSpec

    class Meta(DocumentSerializer.Meta):
        model = Cluster

    def validate_document(self, document):
        checked("cluster", document)
        return {}


class _Efficiency(serializers.Serializer):
    value = serializers.FloatField(min_value=0)
    source = serializers.CharField(allow_blank=False)


class HardwareProfileDocument(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    confidence = serializers.ChoiceField(choices=HardwareProfile.Confidence.choices, default="published")
    peak_tflops = serializers.DictField(child=serializers.FloatField(min_value=0.001), allow_empty=False)
    memory_GiB = serializers.FloatField(min_value=0.001)
    memory_bandwidth_GBps = serializers.FloatField(min_value=0.001, required=False)
    tdp_watts = serializers.FloatField(min_value=1, required=False)
    sources = serializers.DictField(
        child=serializers.CharField(),
        allow_empty=False,
        help_text="field -> citation; every number needs a source",
    )
    efficiency = serializers.DictField(child=_Efficiency(), required=False)


class HardwareProfileSerializer(DocumentSerializer):
    class Meta(DocumentSerializer.Meta):
        model = HardwareProfile

    def validate_document(self, document):
        checked_doc = HardwareProfileDocument(data=document)
        checked_doc.is_valid(raise_exception=True)
        return {"confidence": checked_doc.validated_data["confidence"]}


class ClusterCheckSerializer(serializers.Serializer):
    document = serializers.JSONField(help_text="the cluster.json document, as the planner read it")
    figures = serializers.JSONField(help_text="devices, peak, memory, bisection bandwidth, tiers")
    drawing = serializers.JSONField(help_text="the topology as boxes and edges (the cluster page's drawing)")


class ClusterViewSet(TeamScopedViewSet):
    queryset = Cluster.objects.select_related("team")
    serializer_class = ClusterSerializer

    @extend_schema(request=ClusterSerializer, responses={200: ClusterCheckSerializer})
    @action(detail=False, methods=["post"])
    def validate(self, request):
        """Check a cluster.json document as a create would (the planner's rules and messages, the team's
        names), without storing it: 200 with its totals and drawing, or 400 naming each field. With
        ``?id=<cluster>`` the check is an edit of that cluster (its own name is no clash)."""
        from workers.planner.topology import cluster_figures, topology_drawing

        instance = None
        if (pk := request.query_params.get("id", "")).isdigit():
            instance = self.get_queryset().filter(pk=int(pk)).first()
        data = ClusterSerializer(instance, data=request.data, context=self.get_serializer_context())
        data.is_valid(raise_exception=True)
        spec = planner.ClusterSpec.from_dict(data.validated_data["spec"])
        return Response(
            {
                "document": data.validated_data["spec"],
                "figures": cluster_figures(spec),
                "drawing": topology_drawing(spec),
            }
        )

    def get_queryset(self):
        qs = super().get_queryset()
        if device := self.request.query_params.get("device"):
            qs = qs.filter(spec__device__name=device)
        return qs


class HardwareProfileViewSet(TeamScopedViewSet):
    queryset = HardwareProfile.objects.select_related("team")
    serializer_class = HardwareProfileSerializer


# --- calibrating this machine ----------------------------------------------------------------------------


class CalibrationStatusSerializer(serializers.Serializer):
    calibrated = serializers.BooleanField(help_text="this machine's cpu profile is measured")
    measured_at = serializers.CharField(allow_null=True)
    origin = serializers.CharField(help_text="the calibration file, or the shipped default")
    state = serializers.CharField(
        allow_null=True,
        help_text="the newest calibration's: queued, running, done or failed (null: none ran)",
    )
    running = serializers.BooleanField()
    stage = serializers.CharField(allow_null=True)
    what = serializers.CharField(allow_null=True, help_text="what is being measured now")
    fraction = serializers.FloatField(allow_null=True, help_text="0 to 1, roughly by time")
    requested_at = serializers.CharField(allow_null=True)
    started_at = serializers.CharField(allow_null=True)
    finished_at = serializers.CharField(allow_null=True)
    error = serializers.CharField(allow_null=True)
    quick = serializers.BooleanField(allow_null=True)
    note = serializers.CharField(allow_null=True, help_text="e.g. measured while jobs trained here")


class CalibrationRequestSerializer(serializers.Serializer):
    quick = serializers.BooleanField(
        default=False, help_text="fewer shapes and repetitions (under a minute here; less exact)"
    )
    allreduce = serializers.BooleanField(
        default=True, help_text="measure gloo all-reduce and the runtime's layers between 2 processes"
    )


class CalibrationApi(APIView):
    """This machine's calibration for the cost model: GET its state and progress; POST starts one (202), 409
    while one is under way. Any signed-in user may start it: it measures the machine every team's
    ``this-machine-cpu`` plans run on."""

    @extend_schema(responses=CalibrationStatusSerializer)
    def get(self, request):
        from controlplane.clusters.calibration import calibration_status

        return Response(CalibrationStatusSerializer(calibration_status()).data)

    @extend_schema(
        request=CalibrationRequestSerializer,
        responses={
            202: CalibrationStatusSerializer,
            409: error_response(409, "This machine is being calibrated already: wait for it to finish."),
        },
    )
    def post(self, request):
        from controlplane.clusters.calibration import CalibrationRunning, calibration_start

        body = CalibrationRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            status = calibration_start(by=request.user.get_username(), **body.validated_data)
        except CalibrationRunning as exc:
            raise Conflict(str(exc)) from None
        return Response(CalibrationStatusSerializer(status).data, status=202)


class Conflict(APIException):
    status_code = 409
    default_code = "calibration_running"
