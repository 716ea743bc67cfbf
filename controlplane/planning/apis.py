"""API: strategy searches (read side; searching arrives with the knowledge-base work)."""

from __future__ import annotations

from rest_framework import mixins, serializers, viewsets

from controlplane.accounts.selectors import scoped
from controlplane.common.api import TeamOwnedSerializer
from controlplane.planning.models import StrategySearch


class StrategySearchSerializer(TeamOwnedSerializer):
    stream = serializers.CharField(read_only=True)

    class Meta:
        model = StrategySearch
        fields = [
            "id",
            "team",
            "state",
            "progress",
            "request",
            "stream",
            "error",
            "human_readable_error",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields


class StrategySearchViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = StrategySearch.objects.select_related("team")
    serializer_class = StrategySearchSerializer

    def get_queryset(self):
        return scoped(super().get_queryset(), self.request.user)
