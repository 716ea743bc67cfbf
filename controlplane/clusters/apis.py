"""API: cluster topologies in the ``cluster.json`` contract format."""

from __future__ import annotations

from rest_framework import serializers

from controlplane.clusters.models import Cluster
from controlplane.clusters.validation import validate_cluster_document
from controlplane.common.api import TeamOwnedSerializer, TeamScopedViewSet


class ClusterSerializer(TeamOwnedSerializer):
    """Reads and writes the ``cluster.json`` document; ``id``, ``team`` and timestamps are added."""

    class Meta:
        model = Cluster
        fields = ["id", "team", "created_at", "updated_at"]
        read_only_fields = ["id", "created_at", "updated_at"]

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError(
                {"non_field_errors": ["Send the cluster.json document as a JSON object."]}
            )
        attrs = super().to_internal_value({k: v for k, v in data.items() if k == "team"})
        document = {k: v for k, v in data.items() if k not in {"team", "id", "created_at", "updated_at"}}
        if self.partial and self.instance is not None:
            document = {**self.instance.spec, **document}
        attrs["spec"] = validate_cluster_document(document)
        attrs["name"] = attrs["spec"]["name"]
        return attrs

    def validate(self, attrs):
        attrs = super().validate(attrs)
        team = attrs.get("team") or self.instance.team
        clash = Cluster.objects.filter(team=team, name=attrs["name"])
        if self.instance is not None:
            clash = clash.exclude(pk=self.instance.pk)
        if clash.exists():
            raise serializers.ValidationError(
                {"name": [f"Your team already has a cluster named {attrs['name']!r}."]}
            )
        return attrs

    def to_representation(self, instance):
        base = super().to_representation(instance)
        return {**instance.spec, **base}


class ClusterViewSet(TeamScopedViewSet):
    queryset = Cluster.objects.select_related("team")
    serializer_class = ClusterSerializer
