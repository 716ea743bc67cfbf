"""API: model specs, strategy searches, plans (the knowledge base) and what-if evaluation."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounts.selectors import scoped, teams_of
from controlplane.clusters.models import Cluster
from controlplane.common.api import (
    ID_PATTERN,
    QUEUE_FULL,
    Pagination,
    TeamField,
    TeamOwnedSerializer,
    TeamScopedViewSet,
    error_response,
    only_team_of,
    stored_answer,
)
from controlplane.common.documents import (
    PLAN_SCHEMA,
    ClusterDocumentField,
    DocumentSerializer,
    ModelDocumentField,
    PlanDocumentField,
    SearchConstraintsField,
    SearchObjectiveField,
    SearchRequestField,
    StrategyDocumentField,
    StrictFieldsMixin,
    TrainingDocumentField,
)
from controlplane.common.row_cache import cached_page_rows
from controlplane.planning import selectors, services
from controlplane.planning.models import StoredModelSpec, StoredPlan, StrategySearch
from controlplane.planning.planner_adapters import (
    checked,
    checked_ranking,
    evaluated,
    params_billion,
    plan_row_fields,
)
from workers import planner


class ModelSpecSerializer(DocumentSerializer):
    """Reads and writes the ``model.json`` document."""

    document = planner.ModelSpec

    class Meta(DocumentSerializer.Meta):
        model = StoredModelSpec

    def validate_document(self, document):
        checked("model", document)
        return {"params_billion": params_billion(document)}


class HFConfigImportSerializer(serializers.Serializer):
    """A Hugging Face ``config.json`` (pasted, or uploaded as the ``file``) to store as a model."""

    team = TeamField()
    config = serializers.JSONField(required=False, help_text="the config.json document")
    file = serializers.FileField(required=False, help_text="the config.json file (multipart upload)")
    name = serializers.CharField(required=False, max_length=200, help_text="default: the config's name")
    seq_length = serializers.IntegerField(required=False, min_value=2, max_value=1 << 20)

    def validate(self, attrs):
        import json

        if "file" in attrs:
            raw = attrs.pop("file").read(1 << 20)
            try:
                attrs["config"] = json.loads(raw)
            except ValueError as exc:
                raise serializers.ValidationError({"file": [f"not a JSON document: {exc}"]}) from exc
        if not isinstance(attrs.get("config"), dict):
            raise serializers.ValidationError(
                {"config": ["give the config.json document (or upload it as file)"]}
            )
        return attrs


class ModelCheckSerializer(serializers.Serializer):
    document = serializers.JSONField(help_text="the model.json document, as the planner read it")
    figures = serializers.JSONField(help_text="parameters by part, active per token, FLOPs per token")


class ModelSpecViewSet(TeamScopedViewSet):
    queryset = StoredModelSpec.objects.select_related("team")
    serializer_class = ModelSpecSerializer

    @extend_schema(request=ModelSpecSerializer, responses={200: ModelCheckSerializer})
    @action(detail=False, methods=["post"])
    def validate(self, request):
        """Check a model.json document as a create would (the planner's rules and messages, the team's
        names), without storing it: 200 with its parameters by part and FLOPs per token, or 400 naming each
        field. With ``?id=<model>`` the check is an edit of that model (its own name is no clash)."""
        from workers.planner.model_summary import model_figures

        instance = None
        if (pk := request.query_params.get("id", "")).isdigit():
            instance = self.get_queryset().filter(pk=int(pk)).first()
        data = ModelSpecSerializer(instance, data=request.data, context=self.get_serializer_context())
        data.is_valid(raise_exception=True)
        document = data.validated_data["spec"]
        return Response(
            {"document": document, "figures": model_figures(planner.ModelSpec.from_dict(document))}
        )

    @extend_schema(request=HFConfigImportSerializer, responses={201: ModelSpecSerializer})
    @action(detail=False, methods=["post"], url_path="from-hf-config")
    def from_hf_config(self, request):
        """A model from a Hugging Face ``config.json`` of a family the runtime trains (Llama, Mistral, Qwen2,
        Qwen3, Mixtral, Qwen2-MoE, Qwen3-MoE): ``model.json`` with its ``architecture``, stored like any."""
        from workers.planner.specs import SpecError
        from workers.planner.specs.hf import spec_from_hf_config

        data = HFConfigImportSerializer(data=request.data, context={"request": request})
        data.is_valid(raise_exception=True)
        v = data.validated_data
        try:
            doc = spec_from_hf_config(
                v["config"], seq_length=v.get("seq_length"), name=v.get("name")
            ).to_dict()
        except SpecError as exc:
            raise serializers.ValidationError(exc.prefixed("config").errors) from exc
        team = {"team": v["team"].slug} if v.get("team") else {}
        stored = ModelSpecSerializer(data={**doc, **team}, context={"request": request})
        stored.is_valid(raise_exception=True)
        stored.save()
        return Response(stored.data, status=status.HTTP_201_CREATED)


class StrategySearchSerializer(TeamOwnedSerializer):
    stream = serializers.CharField(read_only=True)
    best_plan_id = serializers.SerializerMethodField()
    request = SearchRequestField(read_only=True)

    class Meta:
        model = StrategySearch
        fields = [
            "id",
            "team",
            "state",
            "progress",
            "cluster",
            "model_spec",
            "request",
            "stats",
            "stream",
            "best_plan_id",
            "similar_plans",
            "parent",
            "what_if",
            "error",
            "human_readable_error",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_best_plan_id(self, search) -> int | None:
        best = search.best_plan
        return best.pk if best else None


class SearchCreateSerializer(StrictFieldsMixin, serializers.Serializer):
    """Cluster and model by id (from the knowledge base) or as documents; training; fixed strategy fields;
    what to rank by and the limits a plan must keep (the planner checks both: its message names the field
    and what is allowed)."""

    team = TeamField()
    cluster = serializers.IntegerField(required=False, help_text="id of a stored cluster")
    cluster_doc = ClusterDocumentField(required=False, help_text="a cluster.json document instead")
    model = serializers.IntegerField(required=False, help_text="id of a stored model spec")
    model_doc = ModelDocumentField(required=False, help_text="a model.json document instead")
    training = TrainingDocumentField(help_text="training.json")
    strategy = StrategyDocumentField(required=False, default=dict, help_text="fixed fields of strategy.json")
    top_k = serializers.IntegerField(min_value=1, max_value=100, default=10)
    objective = SearchObjectiveField(required=False, default="throughput", help_text="what to rank by")
    constraints = SearchConstraintsField(
        required=False, default=dict, help_text="limits: max_memory_GiB_per_device, max_bubble_fraction"
    )

    def validate(self, attrs):
        attrs["objective"], attrs["constraints"] = checked_ranking(
            attrs.get("objective"), attrs.get("constraints")
        )
        user = self.context["request"].user
        if "cluster" in attrs:
            attrs["cluster"] = scoped(Cluster.objects.all(), user).filter(pk=attrs["cluster"]).first()
            if attrs["cluster"] is None:
                raise serializers.ValidationError({"cluster": ["no such cluster among your teams'"]})
        if "model" in attrs:
            attrs["model"] = scoped(StoredModelSpec.objects.all(), user).filter(pk=attrs["model"]).first()
            if attrs["model"] is None:
                raise serializers.ValidationError({"model": ["no such model among your teams'"]})
        if "team" not in attrs:
            owner = attrs.get("cluster") or attrs.get("model")
            attrs["team"] = owner.team if owner is not None else only_team_of(user)
        return attrs


class SavePlanSerializer(serializers.Serializer):
    strategy = StrategyDocumentField(help_text="a complete strategy.json of the search's scenario")

    def validate_strategy(self, value):
        if not isinstance(value, dict):
            raise serializers.ValidationError("must be a strategy.json object")
        return value


class WhatIfSerializer(serializers.Serializer):
    lose_nodes = serializers.IntegerField(min_value=1)


class StrategySearchViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = StrategySearch.objects.select_related("team")
    serializer_class = StrategySearchSerializer
    pagination_class = Pagination
    lookup_value_regex = ID_PATTERN

    def get_queryset(self):
        return selectors.searches_of(self.request.user)

    @extend_schema(request=SearchCreateSerializer, responses={201: StrategySearchSerializer, 429: QUEUE_FULL})
    def create(self, request):
        data = SearchCreateSerializer(data=request.data, context={"request": request})
        data.is_valid(raise_exception=True)
        d = data.validated_data
        search = services.search_create(
            team=d["team"],
            created_by=request.user,
            cluster=d.get("cluster"),
            cluster_doc=d.get("cluster_doc"),
            model=d.get("model"),
            model_doc=d.get("model_doc"),
            training=d["training"],
            fixed=d.get("strategy") or None,
            top_k=d["top_k"],
            objective=d["objective"],
            constraints=d["constraints"],
        )
        return stored_answer(search, self.get_serializer(search).data, status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: StrategySearchSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        search = services.search_cancel(search=self.get_object())
        return Response(self.get_serializer(search).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=WhatIfSerializer, responses={201: StrategySearchSerializer, 429: QUEUE_FULL})
    @action(detail=True, methods=["post"], url_path="what-if")
    def what_if(self, request, pk=None):
        """Search again on the same cluster minus ``lose_nodes`` nodes."""
        data = WhatIfSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        child = services.search_what_if(
            search=self.get_object(), lose_nodes=data.validated_data["lose_nodes"], created_by=request.user
        )
        body = self.get_serializer(child).data
        body["url"] = f"/planning/searches/{child.pk}/"
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=SavePlanSerializer, responses={201: OpenApiTypes.OBJECT, 200: OpenApiTypes.OBJECT})
    @action(detail=True, methods=["post"], url_path="save-plan")
    def save_plan(self, request, pk=None):
        """Keep one strategy of this search's scenario (e.g. a point of the Pareto view) as a plan of the
        search's team: 201 with the new plan, 200 with the stored one when the search already holds it."""
        data = SavePlanSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        plan, created = services.plan_save_from_search(
            search=self.get_object(), strategy=data.validated_data["strategy"]
        )
        body = {**PlanSerializer(plan).data, "url": f"/planning/plans/{plan.pk}/"}
        return Response(body, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(responses={200: {"type": "array", "items": {"type": "object"}}})
    @action(detail=True, methods=["get"])
    def candidates(self, request, pk=None):
        """Compact feasible candidates (strategy, tokens/s, memory, communication share) for a scatter plot."""
        return Response(self.get_object().candidates)

    # The search page's data is an action here rather than a page-data view beside the page: it gets the
    # API's token and session authentication, its team scoping (another team's search is a 404) and its
    # schema for free, and the page already talks to /api/searches/<id>/ for everything else.
    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    @action(detail=True, methods=["get"], url_path="page-data")
    def page_data(self, request, pk=None):
        """Everything the search page draws: the JSON it renders into itself, refreshed when the search
        ends (docs/visualizer.md, "Data contracts")."""
        return Response(selectors.search_page_data(self.get_object()))


class PlanSerializer(StrictFieldsMixin, TeamOwnedSerializer):
    """A plan.json plus its provenance. Create = import a plan (with its model, cluster and training); a key
    that is none of its fields is a 400 naming it (an exported plan's read-only keys are let through)."""

    strict_allows_read_only = True

    model = ModelDocumentField(source="model_doc", help_text="model.json")
    cluster = ClusterDocumentField(source="cluster_doc", help_text="cluster.json")
    training = TrainingDocumentField(required=False, help_text="training.json")
    strategy = StrategyDocumentField(help_text="a complete strategy.json")
    predicted = serializers.JSONField(required=False)

    class Meta:
        model = StoredPlan
        fields = [
            "id",
            "team",
            "name",
            "source",
            "search",
            "rank",
            "in_pareto",
            "model",
            "cluster",
            "training",
            "strategy",
            "feasible",
            "reason",
            "predicted",
            "measured",
            "measured_source",
            "device_name",
            "device_count",
            "params_billion",
            "created_at",
        ]
        read_only_fields = [
            "id",
            "search",
            "rank",
            "in_pareto",
            "feasible",
            "reason",
            "device_name",
            "device_count",
            "params_billion",
            "created_at",
        ]

    def validate(self, attrs):
        attrs = super().validate(attrs)
        model = checked("model", attrs.get("model_doc"), "model")
        cluster = checked("cluster", attrs.get("cluster_doc"), "cluster")
        training = checked("training", attrs.get("training") or {}, "training")
        team = attrs.get("team") or getattr(self.instance, "team", None)
        expert_load = selectors.measured_expert_load(
            teams=[team] if team else [], model_doc=attrs.get("model_doc")
        )
        plan = evaluated(model, cluster, training, attrs.get("strategy"), expert_load=expert_load)
        if attrs.get("source", StoredPlan.Source.IMPORTED) == StoredPlan.Source.SEARCH:
            raise serializers.ValidationError({"source": ["imported plans are 'imported' or 'measured'"]})
        attrs.setdefault("source", StoredPlan.Source.IMPORTED)
        # the stored prediction is always the planner's own for this scenario; a given one is ignored
        attrs.update(plan_row_fields(plan, model, cluster))
        return attrs


class ScaleDownSerializer(serializers.Serializer):
    """The steps and name of the scaled-down job; any other key is a run option of ``POST /api/jobs/``
    (``comm_hook``, ``hang_timeout_s``, ``energy``, ``risk_policy``, ``carbon_aware``, ...), checked as that API
    checks it. Not the node count nor the device: it runs on one node of this machine's CPU ranks."""

    steps = serializers.IntegerField(min_value=1, max_value=100_000, default=20)
    name = serializers.CharField(
        max_length=200, required=False, help_text='default "scaled-down from plan #N"'
    )


class PlanViewSet(
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    queryset = StoredPlan.objects.select_related("team")
    serializer_class = PlanSerializer
    pagination_class = Pagination
    lookup_value_regex = ID_PATTERN

    def get_queryset(self):
        return selectors.plans_of(self.request.user, self.request.query_params)

    def list(self, request, *args, **kwargs):
        # a plan's row changes only with its row (its measured figures: ``updated_at`` moves): kept in the
        # cache; the page is read as its heads first, and only the plans not kept are loaded
        qs = self.filter_queryset(self.get_queryset())
        heads = self.paginate_queryset(qs.values_list("pk", "updated_at", named=True))
        if heads is None:
            return super().list(request, *args, **kwargs)
        return self.get_paginated_response(
            cached_page_rows(
                heads,
                lambda plan: f"plan-row:{plan.pk}:{plan.updated_at.timestamp()}",
                qs.in_bulk,
                lambda plans: self.get_serializer(plans, many=True).data,
            )
        )

    @extend_schema(
        methods=["GET"],
        responses={
            200: OpenApiTypes.OBJECT,
            400: error_response(400, "This plan cannot be scaled down (the answer says why)."),
        },
    )
    @extend_schema(
        methods=["POST"], request=ScaleDownSerializer, responses={201: OpenApiTypes.OBJECT, 429: QUEUE_FULL}
    )
    @action(detail=True, methods=["get", "post"], url_path="scale-down")
    def scale_down(self, request, pk=None):
        """A version of this plan that runs on this machine: the same kinds of parallelism at degree 2 as
        far as ``CANN_TRAIN_MAX_CPU_RANKS`` allows, a small model. GET: what would change (field, original,
        scaled, why) and the scaled plan's prediction. POST: store it ("scaled-down from plan #N") and
        launch it as a job on this machine's CPU ranks, with the run options of ``POST /api/jobs/`` given."""
        plan = self.get_object()
        if request.method == "GET":
            return Response(selectors.scale_down_preview(services.plan_scaled_down(plan=plan), plan))
        data = ScaleDownSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        options = {k: v for k, v in request.data.items() if k not in data.fields}
        row, job, scaled = services.plan_scale_down_launch(
            plan=plan,
            user=request.user,
            steps=data.validated_data["steps"],
            name=data.validated_data.get("name"),
            options=options,
        )
        return Response(
            {
                **selectors.scale_down_preview(scaled, plan),
                "plan": {**PlanSerializer(row).data, "url": f"/planning/plans/{row.pk}/"},
                "job": {"id": job.pk, "name": job.name, "state": job.state, "url": f"/jobs/{job.pk}/"},
            },
            status=status.HTTP_201_CREATED,
        )

    @extend_schema(responses={200: PLAN_SCHEMA})
    @action(detail=True, methods=["get"], url_path="plan-json")
    def plan_json(self, request, pk=None):
        """Export as the plan.json contract document (``?format=yaml`` for YAML)."""
        return Response(self.get_object().to_contract())


class EvaluateSerializer(serializers.Serializer):
    """A scenario and a complete strategy; the documents are checked by the planner's own validators."""

    model = ModelDocumentField(help_text="model.json")
    cluster = ClusterDocumentField(help_text="cluster.json")
    training = TrainingDocumentField(help_text="training.json")
    strategy = StrategyDocumentField(help_text="a complete strategy.json")

    def validate(self, attrs):
        scenario = {kind: checked(kind, attrs[kind], kind) for kind in ("model", "cluster", "training")}
        # an MoE model the user's teams trained before: the expert load their runs measured
        teams = teams_of(self.context["request"].user) if "request" in self.context else []
        expert_load = selectors.measured_expert_load(teams=teams, model_doc=attrs["model"])
        return {**scenario, "strategy": attrs["strategy"], "expert_load": expert_load}


class EvaluationSerializer(serializers.Serializer):
    plan = PlanDocumentField(help_text="plan.json with its memory / step-time breakdown")
    visuals = serializers.JSONField(allow_null=True, help_text="schedule, placement, memory, step time")


class EvaluateApi(APIView):
    """What-if: cost one complete strategy on a scenario; returns the plan and its visual breakdowns."""

    @extend_schema(request=EvaluateSerializer, responses={200: EvaluationSerializer})
    def post(self, request):
        data = EvaluateSerializer(data=request.data, context={"request": request})
        data.is_valid(raise_exception=True)
        evaluation = selectors.strategy_evaluation(**data.validated_data)
        return Response(EvaluationSerializer(evaluation).data)
