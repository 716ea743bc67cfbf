"""API: training jobs — create (and launch), list, cancel, relaunch, restore from a snapshot, events, live
probe."""

from __future__ import annotations

from django.http import FileResponse, Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import exceptions, mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from controlplane.accounts.selectors import scoped
from controlplane.common.api import (
    ID_PATTERN,
    QUEUE_FULL,
    NameField,
    Pagination,
    TeamField,
    TeamOwnedSerializer,
    error_response,
    stored_answer,
)
from controlplane.common.documents import (
    JobConfigField,
    ModelDocumentField,
    PlanDocumentField,
    StrategyDocumentField,
    StrictFieldsMixin,
    TrainingDocumentField,
)
from controlplane.common.models import JobState
from controlplane.common.row_cache import cached_page_rows
from controlplane.green import apis as green_apis
from controlplane.green.certificate_apis import CertificateRowSerializer
from controlplane.green.certificates import certificate_issue
from controlplane.green.selectors import job_energy
from controlplane.jobs import selectors, services
from controlplane.jobs.comparisons import comparison_cancel, comparison_create
from controlplane.jobs.detail_cache import LIST_HEAD, cached_detail, job_with_versions, row_key
from controlplane.jobs.models import (
    DEFAULT_HANG_TIMEOUT_S,
    DEFAULT_MAX_RESTARTS,
    HANG_TIMEOUT_RANGE_S,
    MAX_RESTARTS_LIMIT,
    CommComparison,
    FaultKind,
    JobNode,
    SnapshotKind,
    TrainingJob,
)
from controlplane.jobs.options import RunOptionsMixin
from controlplane.jobs.selectors import (
    elastic_index,
    fault_values,
    job_risk,
    model_source,
    queue_position,
    snapshot_rows,
)
from controlplane.jobs.services.export import hf_export_zip
from controlplane.jobs.services.recovery import job_restore
from controlplane.jobs.summaries import JOB_HEAD_FIELDS, TrainingJobSummarySerializer
from controlplane.live.selectors import stored_events
from controlplane.live.tasks import probe
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


class JobFaultSerializer(serializers.Serializer):
    """A fault of one attempt and its recovery (the recovery fields are null until training continues)."""

    id = serializers.IntegerField()
    attempt = serializers.IntegerField()
    restart = serializers.IntegerField(help_text="torchrun restart within the attempt")
    kind = serializers.ChoiceField(choices=FaultKind.choices)
    rank = serializers.IntegerField(allow_null=True)
    node_rank = serializers.IntegerField(allow_null=True, help_text="the node a node-lost fault hit")
    node_name = serializers.CharField(allow_null=True, help_text="that node's name")
    step = serializers.IntegerField(allow_null=True, help_text="last committed step before the fault")
    message = serializers.CharField()
    detected_at = serializers.DateTimeField()
    recovered_at = serializers.DateTimeField(allow_null=True)
    resumed_from_step = serializers.IntegerField(allow_null=True)
    snapshot = serializers.CharField(allow_null=True, help_text="the snapshot training continued from")
    steps_lost = serializers.IntegerField(allow_null=True, help_text="steps trained again")
    rto_s = serializers.FloatField(allow_null=True, help_text="seconds from detection to training again")


class JobSnapshotSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="step-00000020: what ``POST /api/jobs/<id>/restore/`` takes")
    attempt = serializers.IntegerField()
    step = serializers.IntegerField()
    kind = serializers.ChoiceField(choices=SnapshotKind.choices)
    bytes_written = serializers.IntegerField()
    raw_bytes = serializers.IntegerField()
    base = serializers.CharField(allow_null=True, help_text="the full snapshot a delta was taken against")
    created_at = serializers.DateTimeField()
    verified = serializers.BooleanField()
    problem = serializers.CharField(allow_null=True, help_text="why it did not verify")
    removed = serializers.BooleanField(help_text="retention (or a restore) took it away")
    on_disk = serializers.CharField(
        allow_null=True,
        help_text="present, removed (retention), corrupt or superseded (set aside); null: not visible here",
    )
    restorable = serializers.BooleanField()


class BadputSerializer(serializers.Serializer):
    startup_s = serializers.FloatField(required=False)
    restore_s = serializers.FloatField(required=False)
    snapshot_stall_s = serializers.FloatField(required=False)
    lost_progress_s = serializers.FloatField(required=False)
    fault_wait_s = serializers.FloatField(required=False)
    other_s = serializers.FloatField(required=False)


class GoodputSerializer(serializers.Serializer):
    """Wall time of the latest attempt split into productive training and badput."""

    attempt = serializers.IntegerField()
    restarts = serializers.IntegerField(allow_null=True)
    wall_s = serializers.FloatField(allow_null=True)
    productive_s = serializers.FloatField(allow_null=True)
    goodput = serializers.FloatField(help_text="productive_s / wall_s, 0..1")
    badput = BadputSerializer()
    steps_kept = serializers.IntegerField(
        allow_null=True, required=False, help_text="steps whose result was kept"
    )


class TrainingJobSerializer(TeamOwnedSerializer):
    stream = serializers.CharField(read_only=True)
    max_nodes = serializers.IntegerField(read_only=True, help_text="the most nodes it runs on (its nnodes)")
    elastic = serializers.BooleanField(
        read_only=True, help_text="min_nodes < max_nodes: it goes on when a node is lost, and grows back"
    )
    world_size = serializers.IntegerField(read_only=True)
    predicted_step_time_s = serializers.FloatField(read_only=True, allow_null=True)
    queue_position = serializers.SerializerMethodField(
        help_text="launched jobs waiting ahead of this one for a worker slot; null when not waiting"
    )
    nodes = serializers.SerializerMethodField()
    config = JobConfigField(read_only=True)
    plan = PlanDocumentField(read_only=True, allow_null=True)
    cancelled_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True, help_text="who cancelled the current attempt"
    )
    faults = serializers.SerializerMethodField(help_text="every attempt's faults, oldest first")
    snapshots = serializers.SerializerMethodField(help_text="the snapshots its ranks published, newest first")
    goodput = serializers.SerializerMethodField()
    energy = serializers.SerializerMethodField(
        help_text="energy, carbon and cost so far, summed over attempts (kwh with PUE, kwh_it, kgco2e "
        "location-based, kgco2e_market, cost, tokens, tokens_per_kwh), the power now, the intensity in force "
        "(provider, zone, kind) and the meter (method; estimate true when not measured); null before the "
        "first sample"
    )
    schedule = serializers.SerializerMethodField(
        help_text="the carbon-aware schedule it runs under (null when none): id, zone, start, end, slots, "
        "interruptible, the predicted kgco2e in its window beside kgco2e_now and saving_pct, and slot_end_at "
        "(when the current slot ends: it pauses then, if a later slot is to come)"
    )
    risk = serializers.SerializerMethodField(
        help_text="fault risk now (null before the first risk event of the current attempt): risk 0-1 and level "
        "(low / medium at 0.6 / high at 0.85) of the riskiest node, protected (takes snapshots), badge (high, "
        "medium, else unprotected or low), per node its newest score with flagged ranks and reasons, straggler "
        "and failure-model details, the straggler flags raised in the attempt, and the prevention actions (warn, "
        "snapshot-now: requested, done with its outcome, refused, observed or unanswered)"
    )
    model_source = serializers.SerializerMethodField(
        help_text="what it trains on: the model's family, its Hugging Face checkpoint (hf_model), tokenizer and "
        "corpus (data, data_field, val_fraction), tokens_seen, the newest val_loss and export_ready (its "
        "trained model, GET /api/jobs/<id>/export/)"
    )
    elastic_index = serializers.SerializerMethodField(
        help_text="ETI = scaling efficiency x goodput x device utilisation (each factor with its inputs, null "
        "with the reason when unknown) and the maturity level L0-L5 with each criterion met or not"
    )

    class Meta:
        model = TrainingJob
        fields = [
            *JOB_HEAD_FIELDS,
            "config",
            "plan",
            "source_plan",
            "predicted_step_time_s",
            "queue_position",
            "measured",
            "stream",
            "exit_codes",
            "nodes",
            "log_tail",
            "error",
            "human_readable_error",
            "cancel_requested",
            "cancelled_by",
            "tags",
            "notes",
            "max_restarts",
            "hang_timeout_s",
            "faults",
            "snapshots",
            "goodput",
            "energy",
            "schedule",
            "risk",
            "elastic_index",
            "model_source",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    @extend_schema_field(JobFaultSerializer(many=True))
    def get_faults(self, job) -> list[dict]:
        return [fault_values(f) for f in job.faults.all()]

    @extend_schema_field(JobSnapshotSerializer(many=True))
    def get_snapshots(self, job) -> list[dict]:
        return snapshot_rows(job)

    @extend_schema_field(GoodputSerializer(allow_null=True))
    def get_goodput(self, job) -> dict | None:
        return job.goodput

    @extend_schema_field({"type": "object", "nullable": True, "additionalProperties": True})
    def get_energy(self, job) -> dict | None:
        return job_energy(job)

    @extend_schema_field({"type": "object", "nullable": True, "additionalProperties": True})
    def get_risk(self, job) -> dict | None:
        return job_risk(job)

    @extend_schema_field({"type": "object", "additionalProperties": True})
    def get_model_source(self, job) -> dict:
        return model_source(job)

    @extend_schema_field({"type": "object", "nullable": True, "additionalProperties": True})
    def get_schedule(self, job) -> dict | None:
        schedule = job.green_schedule
        if schedule is None:
            return None
        r = schedule.result
        return {
            "id": schedule.pk,
            "name": schedule.name,
            "zone": schedule.zone,
            "start": r.get("start"),
            "end": r.get("end"),
            "slots": r.get("slots", []),
            "interruptible": r.get("interruptible"),
            "kgco2e": r.get("kgco2e"),
            "kgco2e_now": r.get("kgco2e_now"),
            "saving_pct": r.get("saving_pct"),
            "intensity_kind": (r.get("intensity") or {}).get("kind"),
            "slot_end_at": job.slot_end_at.isoformat() if job.slot_end_at else None,
        }

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_elastic_index(self, job) -> dict:
        return elastic_index(job)

    def get_queue_position(self, job) -> int | None:
        return queue_position(job)

    def get_nodes(self, job) -> list[dict]:
        return JobNodeSerializer(job.nodes.filter(attempt=job.attempts), many=True).data


class CarbonAwareSerializer(StrictFieldsMixin, serializers.Serializer):
    """Schedule the job on the least carbon before its deadline (a green schedule named after it)."""

    deadline_h = green_apis.hours_field("the job must finish by now + deadline_h")
    interruptible = serializers.BooleanField(
        default=False,
        help_text="it may run in several slots, pausing between them (it needs snapshot_every > 0)",
    )
    zone = serializers.CharField(
        required=False, max_length=64, help_text="the grid zone (default: the job's energy zone)"
    )
    duration_h = green_apis.hours_field(
        "its predicted run time (default: steps x its plan's predicted step time)", required=False
    )
    power_kw = green_apis.kw_field(
        "its average IT power (default: its plan's predicted devices x watts)", required=False
    )
    site_cap_kw = green_apis.kw_field(
        "the power the team's scheduled jobs may draw together in the zone", required=False, allow_null=True
    )
    forecast_csv = serializers.CharField(
        required=False,
        max_length=green_apis.services.MAX_FORECAST_CSV_CHARS,
        trim_whitespace=False,
        help_text="a carbon-intensity forecast to schedule on instead of the zone's series (the format of "
        "POST /api/green/schedules/ forecast_csv)",
    )

    def validate_zone(self, value: str) -> str:
        value = value.strip()
        if not green_apis.ZONE.match(value):
            raise serializers.ValidationError(
                "a grid zone is a code such as GB, DE or FR: letters, digits, '-' and '_', starting with a letter"
            )
        return value.upper()

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if "duration_h" in attrs and attrs["deadline_h"] < attrs["duration_h"]:
            raise serializers.ValidationError(
                {
                    "deadline_h": [
                        f"deadline_h ({attrs['deadline_h']:g} h) must be at least duration_h "
                        f"({attrs['duration_h']:g} h)"
                    ]
                }
            )
        return attrs


class EntrypointSerializer(StrictFieldsMixin, serializers.Serializer):
    """Your own training code instead of cann-train's runtime (it imports the SDK, ``cann_train``)."""

    script = serializers.CharField(
        required=False, max_length=4096, help_text="absolute path of a .py file under CANN_TRAIN_CODE_ROOTS"
    )
    module = serializers.CharField(
        required=False, max_length=400, help_text="or a module: python -m <module>"
    )
    args = serializers.ListField(
        child=serializers.CharField(max_length=4096, allow_blank=True), required=False, max_length=200
    )
    workdir = serializers.CharField(
        required=False, max_length=4096, help_text="where the ranks run (default: the script's directory)"
    )
    env = serializers.DictField(
        child=serializers.CharField(max_length=4096, allow_blank=True),
        required=False,
        help_text="variables added to the ranks' scrubbed environment",
    )
    nproc_per_node = serializers.IntegerField(min_value=1, max_value=16, default=1)


class JobCreateSerializer(RunOptionsMixin, StrictFieldsMixin, serializers.Serializer):
    """A job from a plan (its strategy) or a strategy, plus the model and the training config, and its run
    options (``steps``, ``snapshot_every``, ...: one field each, made from the runtime's options table)."""

    team = TeamField()
    name = NameField()
    plan_id = serializers.IntegerField(
        required=False, help_text="a stored plan: its strategy, model and training"
    )
    model = ModelDocumentField(required=False, help_text="model.json (default: the stored plan's)")
    plan = PlanDocumentField(required=False, help_text="plan.json (its strategy is used)")
    strategy = StrategyDocumentField(required=False, help_text="strategy.json (when no plan is given)")
    training = TrainingDocumentField(required=False, help_text="training.json")
    nnodes = serializers.IntegerField(
        min_value=1,
        max_value=4096,
        required=False,
        help_text="nodes it runs on (default 1); max_nodes is its alias",
    )
    max_nodes = serializers.IntegerField(
        min_value=1,
        max_value=4096,
        required=False,
        help_text="the most nodes it runs on: another name for nnodes (given both, they must agree)",
    )
    min_nodes = serializers.IntegerField(
        min_value=1,
        max_value=4096,
        required=False,
        help_text="the fewest nodes it goes on with (default: max_nodes, not elastic). Below max_nodes the job "
        "is elastic: a node lost for good leaves it running on the others (it needs snapshot_every > 0 and "
        "max_restarts > 0), and a node worker that comes online joins it again",
    )
    max_restarts = serializers.IntegerField(
        min_value=0,
        max_value=MAX_RESTARTS_LIMIT,
        default=DEFAULT_MAX_RESTARTS,
        help_text="automatic recoveries from faults (a killed or hung rank, a lost worker)",
    )
    hang_timeout_s = serializers.FloatField(
        min_value=HANG_TIMEOUT_RANGE_S[0],
        max_value=HANG_TIMEOUT_RANGE_S[1],
        default=DEFAULT_HANG_TIMEOUT_S,
        help_text="a rank that commits no step for this long is hung",
    )
    green_schedule = serializers.IntegerField(
        min_value=1,
        required=False,
        help_text="a stored green schedule of the team (GET /api/green/schedules/): the job waits in "
        "'scheduled' and starts when its slot opens (an interruptible one pauses between slots)",
    )
    carbon_aware = CarbonAwareSerializer(
        required=False,
        help_text="schedule the job now on the least carbon before its deadline, then wait for that window",
    )
    entrypoint = EntrypointSerializer(
        required=False,
        help_text="run your own training script under the SDK instead of cann-train's runtime (model optional)",
    )
    hyperparameters = serializers.JSONField(
        required=False, help_text="with an entrypoint: any JSON object, run.hyperparameters in the script"
    )

    def validate(self, attrs):
        for key in ("model", "plan", "strategy", "training"):
            if key in attrs and not isinstance(attrs[key], dict):
                raise serializers.ValidationError({key: ["must be a JSON object"]})
        if "entrypoint" in attrs or "hyperparameters" in attrs:
            services.check_user_run_request(self.initial_data)
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
            "cancel_requested",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields


class JobAnnotateSerializer(serializers.Serializer):
    """PATCH: a job's tags and notes (each replaces what was there). The rules (at most 20 tags of 1-40
    characters, notes up to 10,000 characters, no control characters) are ``services.clean_tags`` /
    ``clean_notes``."""

    tags = serializers.ListField(child=serializers.CharField(trim_whitespace=False), required=False)
    notes = serializers.CharField(allow_blank=True, trim_whitespace=False, required=False)

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            return super().to_internal_value(data)  # "expected a dictionary"
        if unknown := sorted(set(data) - set(self.fields)):
            raise serializers.ValidationError(
                {key: ["unknown field: only a job's tags and notes can be changed"] for key in unknown}
            )
        # the values as sent: the service checks them (DRF would turn a number into a string tag)
        return {key: data[key] for key in self.fields if key in data}


class JobRowsQuery(serializers.Serializer):
    ids = serializers.RegexField(
        r"^\d+(,\d+)*$", required=False, help_text="comma-separated job ids (default: the newest jobs)"
    )
    limit = serializers.IntegerField(
        min_value=1, max_value=selectors.LIST_LIMIT, default=selectors.LIST_LIMIT
    )

    def validate_ids(self, value: str) -> list[int]:
        ids = [int(i) for i in value.split(",")]
        if len(ids) > selectors.LIST_LIMIT:
            raise serializers.ValidationError(f"at most {selectors.LIST_LIMIT} ids, got {len(ids)}")
        return ids


class JobRowSerializer(serializers.Serializer):
    """One row of the job lists: the figures the jobs page and the dashboard show."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    team = serializers.CharField()
    team_slug = serializers.CharField()
    state = serializers.CharField()
    attempts = serializers.IntegerField()
    model = serializers.CharField()
    strategy = serializers.CharField()
    nnodes = serializers.IntegerField()
    nproc_per_node = serializers.IntegerField()
    world_size = serializers.IntegerField()
    step = serializers.IntegerField(allow_null=True, help_text="latest step reported")
    steps = serializers.IntegerField(allow_null=True, help_text="last step of the run")
    progress = serializers.FloatField(allow_null=True, help_text="0..1")
    tokens_per_s = serializers.FloatField(allow_null=True)
    predicted_step_time_s = serializers.FloatField(allow_null=True)
    measured_step_time_s = serializers.FloatField(allow_null=True)
    measured_is_final = serializers.BooleanField(
        help_text="true: the run summary; false: the mean over the latest steady steps"
    )
    measured_is_live = serializers.BooleanField(
        help_text="true: the job trains now and its figures move; false with measured_is_final false: the "
        "mean of its last steady steps before it stopped"
    )
    steady = serializers.ListField(
        child=serializers.ListField(child=serializers.FloatField()),
        help_text="[step_time_s, tokens_per_s] of the latest steady steps (a page goes on from them)",
    )
    last_step = serializers.IntegerField(allow_null=True)
    last_seq = serializers.IntegerField(help_text="newest stored seq of the job's stream")
    tags = serializers.ListField(child=serializers.CharField())
    notes = serializers.CharField()
    created_at = serializers.DateTimeField()
    stream = serializers.CharField()
    url = serializers.CharField()


class EventsQuery(serializers.Serializer):
    after_seq = serializers.IntegerField(min_value=0, max_value=2**63 - 1, default=0)


class StreamEventSerializer(serializers.Serializer):
    """One stored event of a live stream, as published (``StreamEvent.as_event``)."""

    stream = serializers.CharField()
    seq = serializers.IntegerField()
    time = serializers.CharField(help_text="ISO 8601, UTC, milliseconds")
    kind = serializers.CharField(help_text="train, event, log, system, ...")
    step = serializers.IntegerField(allow_null=True)
    values = serializers.DictField(help_text="the event's figures or message")


class JobRestoreSerializer(StrictFieldsMixin, serializers.Serializer):
    snapshot = serializers.RegexField(
        r"^step-\d{8,12}$",
        max_length=20,
        help_text="the name of one of the job's verified snapshots, e.g. step-00000020",
        error_messages={"invalid": "a snapshot name looks like step-00000020 (see the job's snapshots)"},
    )


class ProbeSerializer(serializers.Serializer):
    message = serializers.CharField(
        required=False, default="live probe", help_text="the event's message (its first 200 characters)"
    )


class ProbeAcceptedSerializer(serializers.Serializer):
    task_id = serializers.CharField()
    stream = serializers.CharField()


class TrainingJobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = TrainingJob.objects.select_related("team", "cancelled_by").prefetch_related(
        "faults", "snapshots"
    )
    serializer_class = TrainingJobSerializer
    pagination_class = Pagination
    lookup_value_regex = ID_PATTERN

    def get_serializer_class(self):
        return TrainingJobSummarySerializer if self.action == "list" else super().get_serializer_class()

    def list(self, request, *args, **kwargs):
        # the page is read as its heads first: the ended jobs' rows come from the cache while their row is
        # unchanged (detail_cache), and only the others' jobs are loaded
        qs = self.filter_queryset(self.get_queryset())
        heads = self.paginate_queryset(qs.values_list(*LIST_HEAD, named=True))
        if heads is None:
            return super().list(request, *args, **kwargs)
        return self.get_paginated_response(
            cached_page_rows(
                heads, row_key, qs.in_bulk, lambda jobs: self.get_serializer(jobs, many=True).data
            )
        )

    def retrieve(self, request, *args, **kwargs):
        # an ended job's detail comes from the cache while nothing about it changed (detail_cache)
        job = job_with_versions(kwargs["pk"], request.user)
        if job is None:
            raise Http404
        # (the elastic index rests on the team's one-device runs too: the key holds their version)
        return Response(cached_detail(job, lambda: self.get_serializer(self.get_object()).data))

    def get_queryset(self):
        qs = scoped(super().get_queryset(), self.request.user)
        if self.action == "list":  # a row is the job's own columns: no faults or snapshots to fetch
            qs = TrainingJobSummarySerializer.list_queryset(qs.prefetch_related(None).select_related("team"))
        if state := self.request.query_params.get("state"):
            if state not in JobState.values:  # a typo is not "no such jobs"
                raise exceptions.ValidationError(
                    {"state": [f"unknown state {state[:40]!r}; one of {', '.join(JobState.values)}"]}
                )
            qs = qs.filter(state=state)
        return qs

    @extend_schema(request=JobAnnotateSerializer, responses={200: TrainingJobSerializer})
    def partial_update(self, request, pk=None):
        """Set the job's ``tags`` and/or ``notes``."""
        job = self.get_object()
        data = JobAnnotateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        job = services.job_annotate(job=job, **data.validated_data)
        return Response(self.get_serializer(job).data)

    @extend_schema(parameters=[JobRowsQuery], responses={200: JobRowSerializer(many=True)})
    @action(detail=False, methods=["get"], pagination_class=None)
    def rows(self, request):
        """The job list's rows (newest first): state, progress, tokens/s and step time as the jobs page
        shows them; a page re-reads the rows a live notice names."""
        query = JobRowsQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        rows = selectors.job_rows(
            request.user, limit=query.validated_data["limit"], ids=query.validated_data.get("ids")
        )
        return Response([row.as_dict() for row in rows])

    @extend_schema(request=JobCreateSerializer, responses={201: TrainingJobSerializer, 429: QUEUE_FULL})
    def create(self, request):
        data = JobCreateSerializer(data=request.data, context={"request": request})
        data.is_valid(raise_exception=True)
        job = services.job_submit(user=request.user, **data.validated_data)
        return stored_answer(job, self.get_serializer(job).data, status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: TrainingJobSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Stop the job: a queued job is cancelled at once, a running one within seconds."""
        job = services.job_cancel(job=self.get_object(), user=request.user)
        return Response(self.get_serializer(job).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: TrainingJobSerializer, 429: QUEUE_FULL})
    @action(detail=True, methods=["post"])
    def relaunch(self, request, pk=None):
        """Launch a failed or cancelled job again (a new attempt)."""
        job = services.job_launch(job=self.get_object())
        return stored_answer(job, self.get_serializer(job).data, status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=JobRestoreSerializer,
        responses={
            202: TrainingJobSerializer,
            409: error_response(409, "The job is still queued or running: cancel it first."),
            429: QUEUE_FULL,
        },
    )
    @action(detail=True, methods=["post"])
    def restore(self, request, pk=None):
        """Continue the job from one of its snapshots: a new attempt resumes from exactly that snapshot
        (the newer ones are set aside). The job must have ended (failed, cancelled or succeeded)."""
        job = self.get_object()
        data = JobRestoreSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        job = job_restore(job=job, snapshot=data.validated_data["snapshot"])
        return stored_answer(job, self.get_serializer(job).data, status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=None,
        responses={
            200: CertificateRowSerializer,
            201: CertificateRowSerializer,
            409: error_response(409, "The job has not succeeded, or it has no energy summary to report."),
        },
    )
    @action(detail=True, methods=["post"])
    def certificate(self, request, pk=None):
        """Issue the job's energy and carbon report (PDF and document with a verification code), or answer
        the one issued before (200). The job must have succeeded with energy metering on."""
        report, created = certificate_issue(job=self.get_object(), user=request.user)
        return Response(
            CertificateRowSerializer(report).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )

    @extend_schema(request=ProbeSerializer, responses={202: ProbeAcceptedSerializer})
    @action(detail=True, methods=["post"])
    def probe(self, request, pk=None):
        """Ask a Celery worker to publish one event on this job's live stream."""
        job = self.get_object()
        message = (
            str(request.data.get("message", "live probe"))[:200]
            if isinstance(request.data, dict)
            else "live probe"
        )
        result = probe.apply_async((job.stream, message), queue="default", ignore_result=True)
        return Response({"task_id": result.id, "stream": job.stream}, status=status.HTTP_202_ACCEPTED)

    @extend_schema(methods=["GET"], responses={200: CommComparisonSerializer(many=True)})
    @extend_schema(
        methods=["POST"],
        request=CommCompareSerializer,
        responses={201: CommComparisonSerializer, 429: QUEUE_FULL},
    )
    @action(detail=True, methods=["get", "post"], url_path="comm-compare", pagination_class=None)
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
        return stored_answer(comparison, CommComparisonSerializer(comparison).data, status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: CommComparisonSerializer})
    @action(detail=True, methods=["post"], url_path=rf"comm-compare/(?P<comparison_id>{ID_PATTERN})/cancel")
    def comm_compare_cancel(self, request, pk=None, comparison_id=None):
        """Stop a comparison of this job: the running method's processes are stopped and the emulated
        network removed; the methods measured before are kept."""
        comparison = self.get_object().comm_comparisons.filter(pk=comparison_id).first()
        if comparison is None:
            raise NotFound("No such comparison of this job.")
        comparison = comparison_cancel(comparison=comparison, user=request.user)
        return Response(CommComparisonSerializer(comparison).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        responses={
            (200, "application/zip"): OpenApiTypes.BINARY,
            404: error_response(
                404, "The job did not start from a Hugging Face checkpoint, or its export is missing."
            ),
            409: error_response(409, "The job has not succeeded: its export is written when it does."),
        }
    )
    @action(detail=True, methods=["get"])
    def export(self, request, pk=None):
        """The trained model of a job that started from a Hugging Face checkpoint, as a Hugging Face directory
        (config.json, safetensors, the tokenizer's files) in a zip."""
        job = self.get_object()
        path = hf_export_zip(job)
        return FileResponse(
            path.open("rb"),
            as_attachment=True,
            filename=f"job-{job.pk}-hf.zip",
            content_type="application/zip",
        )

    @extend_schema(parameters=[EventsQuery], responses={200: StreamEventSerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=None)
    def events(self, request, pk=None):
        """The stored history of this job's stream (``after_seq`` to page)."""
        job = self.get_object()
        query = EventsQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        return Response(stored_events(job.stream, after_seq=query.validated_data["after_seq"], limit=5000))
