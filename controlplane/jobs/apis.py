"""API: training jobs — create (and launch), list, cancel, relaunch, events, live probe."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.accounts.selectors import scoped
from controlplane.common.api import TeamField, TeamOwnedSerializer
from controlplane.jobs import services
from controlplane.jobs.comparisons import comparison_create
from controlplane.jobs.models import CommComparison, JobNode, TrainingJob
from controlplane.live.selectors import stored_events
from workers.training.comm_methods import COMPARE_METHODS, WEB_DEFAULT_METHODS


class JobNodeSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobNode
        fields = [
            "attempt",
            "node_rank",
            "node_name",
            "state",
            "pid",
            "exit_code",
            "started_at",
            "finished_at",
        ]


class TrainingJobSerializer(TeamOwnedSerializer):
    stream = serializers.CharField(read_only=True)
    world_size = serializers.IntegerField(read_only=True)
    predicted_step_time_s = serializers.FloatField(read_only=True, allow_null=True)
    nodes = serializers.SerializerMethodField()

    class Meta:
        model = TrainingJob
        fields = [
            "id",
            "team",
            "name",
            "state",
            "progress",
            "attempts",
            "nnodes",
            "nproc_per_node",
            "world_size",
            "config",
            "plan",
            "source_plan",
            "predicted_step_time_s",
            "measured",
            "stream",
            "exit_codes",
            "nodes",
            "log_tail",
            "error",
            "human_readable_error",
            "cancel_requested",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_nodes(self, job) -> list[dict]:
        return JobNodeSerializer(job.nodes.filter(attempt=job.attempts), many=True).data


class JobCreateSerializer(serializers.Serializer):
    """A job from a plan (its strategy) or a strategy, plus the model and the training config."""

    team = TeamField()
    name = serializers.CharField(max_length=200)
    plan_id = serializers.IntegerField(
        required=False, help_text="a stored plan: its strategy, model and training"
    )
    model = serializers.JSONField(required=False, help_text="model.json (default: the stored plan's)")
    plan = serializers.JSONField(required=False, help_text="plan.json (its strategy is used)")
    strategy = serializers.JSONField(required=False, help_text="strategy.json (when no plan is given)")
    training = serializers.JSONField(required=False, help_text="training.json")
    steps = serializers.IntegerField(min_value=1, max_value=1_000_000, default=20)
    lr = serializers.FloatField(min_value=0, required=False)
    seed = serializers.IntegerField(min_value=0, required=False)
    comm_hook = serializers.CharField(required=False, allow_null=True, max_length=50)
    profile_every = serializers.IntegerField(
        min_value=0, required=False, help_text="measure compute vs communication every N steps (0: never)"
    )
    device = serializers.ChoiceField(choices=["auto", "cpu", "cuda", "npu"], default="auto")
    nnodes = serializers.IntegerField(min_value=1, max_value=4096, default=1)
    bucket_cap_mb = serializers.FloatField(
        min_value=0.01,
        max_value=4096,
        required=False,
        help_text="DDP gradient bucket size; default: chosen from the plan's inter-node link",
    )

    def validate(self, attrs):
        for key in ("model", "plan", "strategy", "training"):
            if key in attrs and not isinstance(attrs[key], dict):
                raise serializers.ValidationError({key: ["must be a JSON object"]})
        return attrs


class CommCompareSerializer(serializers.Serializer):
    methods = serializers.ListField(
        child=serializers.CharField(),
        default=list(WEB_DEFAULT_METHODS),
        help_text=", ".join(COMPARE_METHODS),
    )
    steps = serializers.IntegerField(min_value=2, max_value=2000, default=20)
    nodes = serializers.IntegerField(min_value=2, max_value=4, default=2)
    ranks_per_node = serializers.IntegerField(min_value=1, max_value=4, default=2)
    inter_node_gbit = serializers.FloatField(min_value=0.01, max_value=100, default=1.0)


class CommComparisonSerializer(serializers.ModelSerializer):
    class Meta:
        model = CommComparison
        fields = [
            "id",
            "job",
            "plan",
            "state",
            "progress",
            "request",
            "result",
            "human_readable_error",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields


class EventsQuery(serializers.Serializer):
    after_seq = serializers.IntegerField(min_value=0, default=0)


class TrainingJobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = TrainingJob.objects.select_related("team")
    serializer_class = TrainingJobSerializer

    def get_queryset(self):
        qs = scoped(super().get_queryset(), self.request.user)
        if state := self.request.query_params.get("state"):
            qs = qs.filter(state=state)
        return qs

    @extend_schema(request=JobCreateSerializer, responses={201: TrainingJobSerializer})
    def create(self, request):
        data = JobCreateSerializer(data=request.data, context={"request": request})
        data.is_valid(raise_exception=True)
        job = services.job_submit(user=request.user, **data.validated_data)
        return Response(self.get_serializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: TrainingJobSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Stop the job: a queued job is cancelled at once, a running one within seconds."""
        job = services.job_cancel(job=self.get_object())
        return Response(self.get_serializer(job).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: TrainingJobSerializer})
    @action(detail=True, methods=["post"])
    def relaunch(self, request, pk=None):
        """Launch a failed or cancelled job again (a new attempt)."""
        job = services.job_launch(job=self.get_object())
        return Response(self.get_serializer(job).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=serializers.Serializer, responses={202: None})
    @action(detail=True, methods=["post"])
    def probe(self, request, pk=None):
        """Ask a Celery worker to publish one event on this job's live stream."""
        from controlplane.common.tasks import probe

        job = self.get_object()
        message = (
            str(request.data.get("message", "live probe"))[:200]
            if isinstance(request.data, dict)
            else "live probe"
        )
        result = probe.apply_async((job.stream, message), queue="default", ignore_result=True)
        return Response({"task_id": result.id, "stream": job.stream}, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=CommCompareSerializer,
        responses={201: CommComparisonSerializer, 200: CommComparisonSerializer(many=True)},
    )
    @action(detail=True, methods=["get", "post"], url_path="comm-compare")
    def comm_compare(self, request, pk=None):
        """Compare communication methods for this job's model on the emulated two-tier network (POST), or
        list the comparisons run so far (GET)."""
        job = self.get_object()
        if request.method == "GET":
            return Response(
                CommComparisonSerializer(job.comm_comparisons.order_by("-created_at"), many=True).data
            )
        data = CommCompareSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        comparison = comparison_create(job=job, created_by=request.user, **data.validated_data)
        return Response(CommComparisonSerializer(comparison).data, status=status.HTTP_201_CREATED)

    @extend_schema(parameters=[EventsQuery])
    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        """The stored history of this job's stream (``after_seq`` to page)."""
        job = self.get_object()
        query = EventsQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        return Response(stored_events(job.stream, after_seq=query.validated_data["after_seq"], limit=5000))
