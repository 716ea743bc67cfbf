"""Shared API pieces: team-scoped viewsets, the team field, and an exception handler that never 500s
on bad input or a missing backing service."""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError, IntegrityError
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema_field
from rest_framework import exceptions, serializers, status, viewsets
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from controlplane.accounts.models import Team
from controlplane.accounts.selectors import scoped, teams_of
from controlplane.common.middleware import UNAVAILABLE_ERRORS, describe_unavailable
from controlplane.common.pagination import Pagination  # noqa: F401 - re-exported for the viewsets

log = logging.getLogger(__name__)


def exception_handler(exc, context):
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(
            {"detail": f"The request body is larger than {limit / 2**20:.1f} MiB; no contract document is."},
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(
            getattr(exc, "message_dict", None) or {"non_field_errors": exc.messages}
        )
    elif _is_value_out_of_range(exc):
        # a number the database cannot hold (SQLite: "datatype mismatch", PostgreSQL: "out of range"): a
        # value validation should have bounded, not a clash with another object (it used to be a 409)
        log.warning("database refused a value, turned into 400: %s", exc)
        return Response(
            {"detail": f"A number in this request is too large for the database to store ({exc})."},
            status=status.HTTP_400_BAD_REQUEST,
        )
    elif isinstance(exc, IntegrityError) and _is_unique_violation(exc):
        log.info("integrity error turned into 409: %s", exc)
        return Response(
            {"detail": "This conflicts with an existing object (a name must be unique within a team)."},
            status=status.HTTP_409_CONFLICT,
        )
    elif isinstance(exc, UNAVAILABLE_ERRORS):
        service, detail = describe_unavailable(exc)
        return Response({"detail": f"{service} is unavailable: {detail}", "service": service}, status=503)
    elif isinstance(exc, exceptions.ParseError) and str(exc.detail).startswith("Multipart form parse error"):
        # DRF's words name the parser's internals ("Invalid boundary in multipart: None"): say what to send
        return Response(
            {
                "detail": "The body is not a readable multipart/form-data upload ("
                + str(exc.detail).removeprefix("Multipart form parse error - ")
                + "): send the file as multipart/form-data with its boundary in the Content-Type header "
                "(curl -F file=@<path> does both), or the document as JSON."
            },
            status=status.HTTP_400_BAD_REQUEST,
        )
    return drf_exception_handler(exc, context)


def _is_unique_violation(exc: IntegrityError) -> bool:
    """SQLite says "UNIQUE constraint failed", PostgreSQL "duplicate key value violates unique constraint";
    any other integrity error (a NOT NULL one, say) is a bug and stays a 500."""
    text = str(exc).lower()
    return "unique" in text or "duplicate key" in text


def _is_value_out_of_range(exc: Exception) -> bool:
    if isinstance(exc, OverflowError):  # SQLite's driver, binding an integer wider than 64 bits
        return True
    if not isinstance(exc, IntegrityError | DataError):
        return False
    text = str(exc).lower()
    return "datatype mismatch" in text or "out of range" in text or "numeric field overflow" in text


class TooMuchQueuedWork(exceptions.APIException):
    """429: the team already has the most work of this kind one team may have queued or running at once."""

    status_code = 429
    default_code = "too_much_queued_work"


class NameField(serializers.CharField):
    """A name a person reads in lists: 1 to 200 characters, no control or bidirectional-override characters
    (the planner's rule for document names, so every name follows one)."""

    def __init__(self, **kwargs):
        kwargs.setdefault("max_length", 200)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        from workers.planner.specs import name_problem

        value = super().to_internal_value(data)
        if problem := name_problem(value):
            raise serializers.ValidationError(problem)
        return value


def stored_answer(obj, data, code: int) -> Response:
    """The answer for a request that stored ``obj`` and sent its work to a worker: ``code`` (201 / 202), or,
    when the broker was away at the commit (``obj.dispatch_deferred``, set by the task outbox of
    ``controlplane.live.services.enqueue_after_commit``), 202 and a ``dispatch`` saying the work is kept and
    goes to a worker when Redis is back: nothing to resend (a resend would store a second one)."""
    why = getattr(obj, "dispatch_deferred", None)
    if not why:
        return Response(data, status=code)
    note = {
        "deferred": True,
        "detail": (
            "Stored and queued, but the broker (Redis) cannot be reached now; it is sent to a worker as soon "
            f"as Redis is back. Do not send this request again. ({why})"
        ),
    }
    return Response({**data, "dispatch": note}, status=status.HTTP_202_ACCEPTED)


def only_team_of(user) -> Team:
    """The team an object goes to when the request names none: the user's only team, else a 400."""
    teams = list(teams_of(user)[:2])
    if len(teams) != 1:
        raise serializers.ValidationError(
            {"team": ["You belong to several teams (or none): say which team owns this object."]}
        )
    return teams[0]


@extend_schema_field(OpenApiTypes.STR)
class TeamField(serializers.SlugRelatedField):
    """The owning team, by slug. Optional when the user belongs to exactly one team."""

    def __init__(self, **kwargs):
        kwargs.setdefault("slug_field", "slug")
        kwargs.setdefault("required", False)
        kwargs.setdefault(
            "help_text", "Slug of the owning team; may be omitted when you belong to exactly one team."
        )
        super().__init__(**kwargs)

    def get_queryset(self):
        request = self.context.get("request")
        return teams_of(request.user if request else None)


class TeamOwnedSerializer(serializers.ModelSerializer):
    team = TeamField()

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if self.instance is None and "team" not in attrs:
            attrs["team"] = only_team_of(self.context["request"].user)
        return attrs


# an object id in a URL: a database id has at most 18 digits (a bigint); a longer one matches no URL (a 404)
# instead of reaching the database as a number it cannot bind
ID_PATTERN = "[0-9]{1,18}"


class IdConverter:
    """``<id:pk>`` in a URL pattern: an object id of at most 18 digits (``ID_PATTERN``), as an int."""

    regex = ID_PATTERN

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value) -> str:
        return str(value)


class UniqueNameSchema(AutoSchema):
    """The schema of a view whose objects have a name unique within a team: its writes may answer 409 (two
    requests racing for one name; a name already taken is a 400 naming it)."""

    def get_operation(self, *args, **kwargs):
        operation = super().get_operation(*args, **kwargs)
        if operation is not None and self.method in ("POST", "PUT", "PATCH"):
            operation["responses"].setdefault("409", {"description": ""})
        return operation


class TeamScopedViewSet(viewsets.ModelViewSet):
    """CRUD over the objects of the user's teams only; another team's object is a 404, not a 403."""

    pagination_class = Pagination
    lookup_value_regex = ID_PATTERN
    schema = UniqueNameSchema()

    def get_queryset(self):
        return scoped(super().get_queryset(), self.request.user)


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """``Authorization: Token ct_…`` in the OpenAPI schema (the API's own token authentication)."""

    target_class = "controlplane.accounts.authentication.ApiTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <token>`: create a token under /tokens/ or with POST /api/tokens/.",
        }


# --- the error answers every operation shares (OpenAPI) ----------------------------------------------
# The bodies are DRF's: ``{"detail": "..."}`` for most errors; for a 400, the field errors (``{"field":
# ["problem"], "model.num_layers": [...]}``), a ``detail`` (a body that does not parse) or a list of
# problems; the 503 of a missing backing service names it (``common.middleware``).
ERROR_SCHEMAS = {
    "Error": {
        "type": "object",
        "description": "What went wrong, for a person.",
        "properties": {"detail": {"type": "string"}},
        "required": ["detail"],
    },
    "ValidationErrors": {
        "description": "The problems of the request: per field (nested fields joined by dots), a `detail`, "
        "or a list of messages.",
        "anyOf": [
            {"type": "object", "additionalProperties": True},
            {"type": "array", "items": {"type": "string"}},
        ],
    },
    "Unavailable": {
        "type": "object",
        "description": "A backing service (the database or Redis) cannot be reached.",
        "properties": {"detail": {"type": "string"}, "service": {"type": "string"}},
        "required": ["detail", "service"],
    },
}
# code -> (schema, description, which operations may answer it: "all", "input" (POST/PUT/PATCH, or a GET
# with query parameters), "body" (an operation with a request body) or "declared" (the view lists the code
# itself, e.g. ``429: QUEUE_FULL``; its body is filled in here))
ERROR_RESPONSES = {
    "400": ("ValidationErrors", "The request is invalid; the answer names each problem.", "input"),
    "401": (
        "Error",
        "No credentials, or an invalid or revoked token: send `Authorization: Token <token>`.",
        "all",
    ),
    "403": ("Error", "Signed in with a session but without the CSRF token, or not allowed.", "all"),
    "404": (
        "Error",
        "No such object among your teams' (another team's object is a 404 too), or a `format` this API "
        "does not render.",
        "all",
    ),
    "406": ("Error", "The `Accept` header asks for a representation this API does not render.", "all"),
    "409": ("Error", "Conflicts with an existing object: a name is unique within a team.", "declared"),
    "413": ("Error", "The request body is larger than the upload limit.", "body"),
    "415": ("Error", "The body's content type is none of JSON, YAML or a form.", "body"),
    "429": (
        "Error",
        "Your team has as much work queued or running as one team may (`CANN_TRAIN_MAX_ACTIVE_JOBS`): "
        "nothing was started or stored.",
        "declared",
    ),
    "503": ("Unavailable", "The database or Redis cannot be reached; retry when it is back.", "all"),
}
ERROR_MEDIA_TYPES = ("application/json", "application/yaml")


def _answers(code: str, method: str, operation: dict) -> bool:
    scope = ERROR_RESPONSES[code][2]
    if scope == "all":
        return True
    if scope == "body":
        return "requestBody" in operation
    if scope == "input":
        query = [
            p for p in operation.get("parameters", []) if p.get("in") == "query" and p["name"] != "format"
        ]
        return method in ("post", "put", "patch") or (method == "get" and bool(query))
    return False


def add_error_responses(result, generator, request, public):
    """drf-spectacular post-processing hook (``SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]``): every
    operation documents the error answers it can give (``ERROR_RESPONSES``), with their bodies; one a view
    declares without a body (``429: QUEUE_FULL``) gets its body here; an id in a path is an integer."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in ERROR_SCHEMAS.items():
        schemas.setdefault(name, schema)
    for path_item in result.get("paths", {}).values():
        for method, operation in path_item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            responses = operation["responses"]
            for code, (schema, description, _scope) in ERROR_RESPONSES.items():
                declared = responses.get(code)
                if declared is None and not _answers(code, method, operation):
                    continue
                declared = declared or {}
                if "content" not in declared:
                    ref = {"$ref": f"#/components/schemas/{schema}"}
                    declared["content"] = {media: {"schema": ref} for media in ERROR_MEDIA_TYPES}
                if not declared.get("description") or declared["description"] == "No response body":
                    declared["description"] = description
                responses[code] = declared
            operation["responses"] = dict(sorted(responses.items()))
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "path" and parameter["schema"].get("pattern") == f"^{ID_PATTERN}$":
                    # an object id (``lookup_value_regex = ID_PATTERN``) is the integer it is
                    parameter["schema"] = {"type": "integer", "minimum": 0, "maximum": 10**18 - 1}
    return result


def error_response(code: int, description: str | None = None) -> OpenApiResponse:
    """An error answer a view declares itself (one that not every operation gives, or with a more precise
    description): ``responses={202: ..., 429: error_response(429)}``; ``add_error_responses`` adds the body."""
    return OpenApiResponse(description=description or ERROR_RESPONSES[str(code)][1])


QUEUE_FULL = error_response(429)
