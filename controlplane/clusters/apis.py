"""API: hardware profiles and cluster topologies (the ``cluster.json`` contract)."""

from __future__ import annotations

from rest_framework import serializers

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


class ClusterViewSet(TeamScopedViewSet):
    queryset = Cluster.objects.select_related("team")
    serializer_class = ClusterSerializer

    def get_queryset(self):
        qs = super().get_queryset()
        if device := self.request.query_params.get("device"):
            qs = qs.filter(spec__device__name=device)
        return qs


class HardwareProfileViewSet(TeamScopedViewSet):
    queryset = HardwareProfile.objects.select_related("team")
    serializer_class = HardwareProfileSerializer
