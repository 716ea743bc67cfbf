"""Serializers for rows that store one contract document (cluster.json, model.json, …) in ``spec``, and
the fields of request and response bodies that carry contract documents.

The API reads and writes the document itself (import/export round-trips unchanged, in JSON or YAML),
with ``id``, ``team`` and timestamps added; validation is the engine's own (one source of truth), and so
is the rule that a key which is not a field is an error naming it. :class:`StrictFieldsMixin` holds a
request body to the same rule.

OpenAPI: a contract document is described by the engine's own dataclass (``document_schema``: its fields,
types, docstrings and required fields) as a named component (``ModelJson``, ``ClusterJson``, …); any other
JSON field is an object, or an array where its column defaults to a list, never an untyped value."""

from __future__ import annotations

from collections.abc import Mapping

from django.core.exceptions import FieldDoesNotExist
from drf_spectacular.extensions import OpenApiSerializerExtension, OpenApiSerializerFieldExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.exceptions import ValidationError

from controlplane.common.api import TeamOwnedSerializer
from workers import planner
from workers.planner.search import CONSTRAINTS, OBJECTIVES
from workers.planner.specs import document_schema
from workers.training.config import JobConfig

META_FIELDS = {"id", "team", "created_at", "updated_at"}

# plan.json: strategy, feasible, reason, predicted (stored and sent plans may carry more: id, name, model)
PLAN_SCHEMA = document_schema(planner.Plan)
# a search's limits (workers.planner.search.CONSTRAINTS) and what it ranks by (OBJECTIVES)
SEARCH_CONSTRAINTS_SCHEMA = {
    "type": "object",
    "description": "Limits a plan must keep; a plan above one is rejected (absent or null: no limit).",
    "properties": {
        name: {"type": "number", "nullable": True, "description": text} for name, text in CONSTRAINTS.items()
    },
    "additionalProperties": False,
}
SEARCH_OBJECTIVE_SCHEMA = {
    "type": "string",
    "enum": list(OBJECTIVES),
    "default": "throughput",
    "description": "What the ranking (top plans, best plan) follows; ties go to throughput. "
    + "; ".join(f"{k}: {v}" for k, v in OBJECTIVES.items()),
}
# the request a search ran: the documents it searched and how many plans it kept
SEARCH_REQUEST_SCHEMA = {
    "type": "object",
    "description": "The documents the search ran on, the fixed strategy fields, how many plans it kept, "
    "what it ranked by and the limits it kept (searches stored before objectives have neither: throughput, "
    "no limits).",
    "properties": {
        "model": document_schema(planner.ModelSpec),
        "cluster": document_schema(planner.ClusterSpec),
        "training": document_schema(planner.TrainingConfig),
        "strategy": document_schema(planner.Strategy),
        "top_k": {"type": "integer"},
        "objective": SEARCH_OBJECTIVE_SCHEMA,
        "constraints": SEARCH_CONSTRAINTS_SCHEMA,
    },
}


@extend_schema_field(document_schema(planner.ModelSpec), component_name="ModelJson")
class ModelDocumentField(serializers.JSONField):
    """A ``model.json`` document."""


@extend_schema_field(document_schema(planner.ClusterSpec), component_name="ClusterJson")
class ClusterDocumentField(serializers.JSONField):
    """A ``cluster.json`` document."""


@extend_schema_field(document_schema(planner.TrainingConfig), component_name="TrainingJson")
class TrainingDocumentField(serializers.JSONField):
    """A ``training.json`` document."""


@extend_schema_field(document_schema(planner.Strategy), component_name="StrategyJson")
class StrategyDocumentField(serializers.JSONField):
    """A ``strategy.json`` document (a field left out or null: searched, or its plain value when run)."""


@extend_schema_field(PLAN_SCHEMA, component_name="PlanJson")
class PlanDocumentField(serializers.JSONField):
    """A ``plan.json`` document."""


@extend_schema_field(document_schema(JobConfig), component_name="JobConfig")
class JobConfigField(serializers.JSONField):
    """The runtime's job configuration (``workers.training.config.JobConfig``)."""


@extend_schema_field(SEARCH_CONSTRAINTS_SCHEMA, component_name="SearchConstraints")
class SearchConstraintsField(serializers.JSONField):
    """A search's limits: ``max_memory_GiB_per_device``, ``max_bubble_fraction`` (checked by the planner)."""


@extend_schema_field(SEARCH_OBJECTIVE_SCHEMA)
class SearchObjectiveField(serializers.CharField):
    """What a search ranks by (checked by the planner, whose message lists what is allowed)."""


@extend_schema_field(SEARCH_REQUEST_SCHEMA, component_name="SearchRequest")
class SearchRequestField(serializers.JSONField):
    """What a strategy search was asked."""


class JsonValueSchema(OpenApiSerializerFieldExtension):
    """Every other JSON field: an array where its model column defaults to a list, else an object (DRF's
    JSONField is any value, which generated clients type as a string)."""

    target_class = "rest_framework.fields.JSONField"
    match_subclasses = True

    def map_serializer_field(self, auto_schema, direction):
        field = self.target
        model = getattr(getattr(field.parent, "Meta", None), "model", None)
        default = None
        if model is not None:
            try:
                default = model._meta.get_field(field.source).default
            except FieldDoesNotExist:
                pass
        if default is list:
            return {"type": "array", "items": {}}
        return {"type": "object", "additionalProperties": True}


class StrictFieldsMixin:
    """A request body's keys that are none of the serializer's writable fields are a 400 naming each:
    DRF ignores them, so a typo (``stpes``, ``topk``) would silently run with the default instead."""

    strict_allows_read_only = False
    """True: a read-only field's key is let through (ignored), so a document this API wrote (an exported
    plan with its ``id`` and ``rank``) goes back in as it is; a key that is no field at all stays a 400."""

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            writable = [name for name, f in self.fields.items() if not f.read_only]
            allowed = set(self.fields) if self.strict_allows_read_only else set(writable)
            unknown = [key for key in data if key not in allowed]
            if unknown:
                known = ", ".join(writable)
                raise serializers.ValidationError(
                    {str(key): [f"is not a field of this request (known: {known})"] for key in unknown}
                )
        return super().to_internal_value(data)


class DocumentSerializer(TeamOwnedSerializer):
    """Subclasses set ``Meta.model`` and implement ``validate_document(doc) -> dict of extra row fields``;
    ``document``, the engine's dataclass of the document, describes its fields in the OpenAPI schema."""

    document: type | None = None

    class Meta:
        fields = ["id", "team", "created_at", "updated_at"]
        read_only_fields = ["id", "created_at", "updated_at"]

    def validate_document(self, document: dict) -> dict:
        raise NotImplementedError

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError(
                {"non_field_errors": ["Send the document as a JSON (or YAML) object."]}
            )
        attrs = super().to_internal_value({k: v for k, v in data.items() if k == "team"})
        document = {k: v for k, v in data.items() if k not in META_FIELDS}
        if self.partial and self.instance is not None:
            document = {**self.instance.spec, **document}
        attrs.update(self.validate_document(document))
        attrs["spec"] = document
        attrs.setdefault("name", document.get("name", ""))
        return attrs

    def validate(self, attrs):
        attrs = super().validate(attrs)
        team = attrs.get("team") or self.instance.team
        model = self.Meta.model
        clash = model.objects.filter(team=team, name=attrs["name"])
        if self.instance is not None:
            clash = clash.exclude(pk=self.instance.pk)
        if clash.exists():
            raise serializers.ValidationError(
                {"name": [f"Your team already has a {model._meta.verbose_name} named {attrs['name']!r}."]}
            )
        return attrs

    def to_representation(self, instance):
        return {**instance.spec, **super().to_representation(instance)}


class DocumentSerializerSchema(OpenApiSerializerExtension):
    """A stored document's schema: the document's own fields (``document_schema``) beside ``id``, ``team``
    and the timestamps, instead of the row's meta fields alone."""

    target_class = DocumentSerializer
    match_subclasses = True

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        document = getattr(self.target, "document", None)
        if document is None:
            return schema
        doc = document_schema(document)
        schema["properties"] = {**doc["properties"], **schema.get("properties", {})}
        required = [*doc.get("required", []), *schema.get("required", [])]
        if required:
            schema["required"] = required
        if doc.get("description"):
            schema["description"] = doc["description"]
        return schema


def checked(kind: str, document, prefix: str | None = None):
    """Parse a contract document with the planner; a SpecError becomes a field-level 400.

    ``kind`` is one of model, cluster, training, strategy. Field paths keep the planner's dotted names
    (``moe.top_k``), prefixed when the document sits inside a request (``model.moe.top_k``).
    """
    cls = {
        "model": planner.ModelSpec,
        "cluster": planner.ClusterSpec,
        "training": planner.TrainingConfig,
        "strategy": planner.Strategy,
    }[kind]
    if not isinstance(document, dict):
        raise ValidationError({prefix or kind: [f"must be a {kind}.json object"]})
    try:
        return cls.from_dict(document)
    except planner.SpecError as exc:
        errors = exc.prefixed(prefix).errors if prefix else exc.errors
        raise ValidationError(errors) from exc
