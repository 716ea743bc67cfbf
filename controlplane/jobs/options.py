"""The job API's run options as DRF fields, made from the runtime's options table
(``workers/training/options.py``): the same names, types, bounds, defaults and help as the job config and
the CLIs' flags, so a new option is one line there and the OpenAPI schema and ``--help`` never drift."""

from __future__ import annotations

from collections.abc import Iterable

from rest_framework import serializers

from workers.training.options import OPTIONS, Option, api_options


def _checked_by(option: Option):
    """A DRF validator: the table's own rules for the value (exclusive bounds, the fault grammar, a comm
    hook's name, the energy settings), each problem as the field's 400."""

    def validate(value):
        if problems := option.problems(value):
            raise serializers.ValidationError(problems)

    return validate


def option_field(option: Option) -> serializers.Field:
    """One option as a request field: not required (the job config's default applies), or with the API's
    own default where it has one (``steps``: 20)."""
    kw = {"help_text": option.help, "validators": [_checked_by(option)]}
    if option.api_default is not ...:
        kw["default"] = option.api_default
    else:
        kw["required"] = False
    if option.nullable:
        kw["allow_null"] = True
    bounds = {"min_value": option.minimum, "max_value": option.maximum}
    if option.choices is not None:
        return serializers.ChoiceField(choices=list(option.choices), **kw)
    if option.kind is bool:
        return serializers.BooleanField(**kw)
    if option.kind is int:
        return serializers.IntegerField(**bounds, **kw)
    if option.kind is float:
        return serializers.FloatField(**bounds, **kw)
    if option.kind is dict:
        return serializers.JSONField(**kw)
    return serializers.CharField(max_length=option.max_length, **kw)


def option_fields(table: Iterable[Option] = OPTIONS) -> dict[str, serializers.Field]:
    """The request fields of every option a job request may set (``api``), by name."""
    return {o.name: option_field(o) for o in api_options(table)}


class RunOptionsMixin:
    """A serializer with a field for each run option of ``OPTIONS_TABLE`` (a subclass may set its own)."""

    OPTIONS_TABLE: tuple[Option, ...] = OPTIONS

    def get_fields(self):
        return {**super().get_fields(), **option_fields(self.OPTIONS_TABLE)}
