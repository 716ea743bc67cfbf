"""API: hardware profiles and cluster topologies (the ``cluster.json`` contract)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.clusters.models import Cluster, HardwareProfile
from controlplane.common.api import TeamScopedViewSet
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
