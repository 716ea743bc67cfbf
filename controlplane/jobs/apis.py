"""API: training jobs."""

from __future__ import annotations

from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.accounts.selectors import scoped
from controlplane.common.api import TeamOwnedSerializer
from controlplane.jobs.models import TrainingJob
from controlplane.live.selectors import stored_events


class TrainingJobSerializer(TeamOwnedSerializer):
    stream = serializers.CharField(read_only=True)

    class Meta:
        model = TrainingJob
        fields = [
            "id",
            "team",
            "name",
            "state",
            "progress",
            "config",
            "stream",
            "error",
            "human_readable_error",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = ["state", "progress", "error", "human_readable_error", "started_at", "finished_at"]


class ProbeSerializer(serializers.Serializer):
    message = serializers.CharField(max_length=200, default="live probe")


class TrainingJobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = TrainingJob.objects.select_related("team")
    serializer_class = TrainingJobSerializer

    def get_queryset(self):
        return scoped(super().get_queryset(), self.request.user)

    @extend_schema(request=ProbeSerializer, responses={202: None})
    @action(detail=True, methods=["post"])
    def probe(self, request, pk=None):
        """Ask a Celery worker to publish one event on this job's live stream."""
        from workers.tasks.health import probe

        job = self.get_object()
        data = ProbeSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        result = probe.apply_async(
            (job.stream, data.validated_data["message"]), queue="default", ignore_result=True
        )
        return Response({"task_id": result.id, "stream": job.stream}, status=status.HTTP_202_ACCEPTED)

    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        """The stored history of this job's stream (``after_seq`` to page)."""
        job = self.get_object()
        try:
            after = int(request.query_params.get("after_seq", 0))
        except ValueError:
            return Response({"after_seq": ["must be an integer"]}, status=status.HTTP_400_BAD_REQUEST)
        return Response(stored_events(job.stream, after_seq=after, limit=5000))


def job_create(*, team, name: str, config: dict, created_by=None) -> TrainingJob:
    with transaction.atomic():
        return TrainingJob.objects.create(team=team, name=name, config=config, created_by=created_by)
