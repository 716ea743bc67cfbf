"""API: model specs, strategy searches, plans (the knowledge base) and what-if evaluation."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounts.selectors import scoped
from controlplane.clusters.models import Cluster
from controlplane.common.api import TeamField, TeamOwnedSerializer, TeamScopedViewSet, only_team_of
from controlplane.common.documents import DocumentSerializer
from controlplane.planning import services
from controlplane.planning.models import ModelSpec, Plan, StrategySearch
from controlplane.planning.specs import checked, evaluated, params_billion, plan_row_fields
from workers.planner.visual import plan_breakdown


class ModelSpecSerializer(DocumentSerializer):
    """Reads and writes the ``model.json`` document."""

    class Meta(DocumentSerializer.Meta):
        model = ModelSpec

    def validate_document(self, document):
        checked("model", document)
        return {"params_billion": params_billion(document)}


class ModelSpecViewSet(TeamScopedViewSet):
    queryset = ModelSpec.objects.select_related("team")
    serializer_class = ModelSpecSerializer


class StrategySearchSerializer(TeamOwnedSerializer):
    stream = serializers.CharField(read_only=True)
    best_plan_id = serializers.SerializerMethodField()

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


class SearchCreateSerializer(serializers.Serializer):
    """Cluster and model by id (from the knowledge base) or as documents; training; fixed strategy fields."""

    team = TeamField()
    cluster = serializers.IntegerField(required=False, help_text="id of a stored cluster")
    cluster_doc = serializers.JSONField(required=False, help_text="a cluster.json document instead")
    model = serializers.IntegerField(required=False, help_text="id of a stored model spec")
    model_doc = serializers.JSONField(required=False, help_text="a model.json document instead")
    training = serializers.JSONField(help_text="training.json")
    strategy = serializers.JSONField(required=False, default=dict, help_text="fixed fields of strategy.json")
    top_k = serializers.IntegerField(min_value=1, max_value=100, default=10)

    def validate(self, attrs):
        user = self.context["request"].user
        if "cluster" in attrs:
            attrs["cluster"] = scoped(Cluster.objects.all(), user).filter(pk=attrs["cluster"]).first()
            if attrs["cluster"] is None:
                raise serializers.ValidationError({"cluster": ["no such cluster among your teams'"]})
        if "model" in attrs:
            attrs["model"] = scoped(ModelSpec.objects.all(), user).filter(pk=attrs["model"]).first()
            if attrs["model"] is None:
                raise serializers.ValidationError({"model": ["no such model among your teams'"]})
        if "team" not in attrs:
            owner = attrs.get("cluster") or attrs.get("model")
            attrs["team"] = owner.team if owner is not None else only_team_of(user)
        return attrs


class WhatIfSerializer(serializers.Serializer):
    lose_nodes = serializers.IntegerField(min_value=1)


class StrategySearchViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = StrategySearch.objects.select_related("team")
    serializer_class = StrategySearchSerializer

    def get_queryset(self):
        return scoped(super().get_queryset(), self.request.user)

    @extend_schema(request=SearchCreateSerializer, responses={201: StrategySearchSerializer})
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
        )
        return Response(self.get_serializer(search).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: StrategySearchSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        search = services.search_cancel(search=self.get_object())
        return Response(self.get_serializer(search).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=WhatIfSerializer, responses={201: StrategySearchSerializer})
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

    @action(detail=True, methods=["get"])
    def candidates(self, request, pk=None):
        """Compact feasible candidates (strategy, tokens/s, memory, communication share) for a scatter plot."""
        return Response(self.get_object().candidates)


class PlanSerializer(TeamOwnedSerializer):
    """A plan.json plus its provenance. Create = import a plan (with its model, cluster and training)."""

    model = serializers.JSONField(source="model_doc", help_text="model.json")
    cluster = serializers.JSONField(source="cluster_doc", help_text="cluster.json")
    predicted = serializers.JSONField(required=False)

    class Meta:
        model = Plan
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
        plan = evaluated(model, cluster, training, attrs.get("strategy"))
        if attrs.get("source", Plan.Source.IMPORTED) == Plan.Source.SEARCH:
            raise serializers.ValidationError({"source": ["imported plans are 'imported' or 'measured'"]})
        attrs.setdefault("source", Plan.Source.IMPORTED)
        # the stored prediction is always the planner's own for this scenario; a given one is ignored
        attrs.update(plan_row_fields(plan, model, cluster))
        return attrs


class PlanViewSet(
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    queryset = Plan.objects.select_related("team")
    serializer_class = PlanSerializer

    def get_queryset(self):
        qs = scoped(super().get_queryset(), self.request.user)
        params = self.request.query_params
        for param, lookup in (
            ("search", "search_id"),
            ("cluster", "cluster_id"),
            ("model", "model_spec_id"),
            ("device", "device_name"),
            ("source", "source"),
        ):
            if value := params.get(param):
                qs = qs.filter(**{lookup: value})
        if params.get("measured") in {"1", "true"}:
            qs = qs.filter(measured__isnull=False)
        return qs

    @action(detail=True, methods=["get"], url_path="plan-json")
    def plan_json(self, request, pk=None):
        """Export as the plan.json contract document (``?format=yaml`` for YAML)."""
        return Response(self.get_object().to_contract())


class EvaluateSerializer(serializers.Serializer):
    model = serializers.JSONField()
    cluster = serializers.JSONField()
    training = serializers.JSONField()
    strategy = serializers.JSONField()


class EvaluateApi(APIView):
    """What-if: cost one complete strategy on a scenario; returns the plan and its visual breakdowns."""

    @extend_schema(request=EvaluateSerializer)
    def post(self, request):
        data = EvaluateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        d = data.validated_data
        model, cluster = checked("model", d["model"], "model"), checked("cluster", d["cluster"], "cluster")
        training = checked("training", d["training"], "training")
        plan = evaluated(model, cluster, training, d["strategy"]).to_dict()
        plan["breakdown"] = plan_breakdown(plan.get("predicted"), cluster.device.memory_GiB)
        return Response({"plan": plan, "visuals": plan_visuals_or_none(d, plan)})


def plan_visuals_or_none(documents: dict, plan: dict) -> dict | None:
    """The visualizer's breakdowns (pipeline schedule, placement, memory, step time) for a plan."""
    from workers.planner.visual import plan_visuals

    if not plan.get("feasible", True) and not plan.get("predicted"):
        return None
    return plan_visuals(documents["model"], documents["cluster"], documents["training"], plan)
