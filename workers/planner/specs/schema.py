"""The JSON schema (OpenAPI 3.0 dialect) of each contract document, read from its dataclass: the types
from the annotations, the descriptions from the docstring under each field."""

from __future__ import annotations

import dataclasses
from typing import Any

from .model import ACTIVATIONS, ROTARY_LAYOUTS, ROUTERS
from .strategy import RECOMPUTE_MODES
from .training import DTYPES, OPTIMIZERS
from .validation import SpecError

# fields whose value is one of a fixed set, wherever they appear
FIELD_CHOICES = {
    "activation": ACTIVATIONS,
    "dtype": DTYPES,
    "optimizer": OPTIMIZERS,
    "recompute": RECOMPUTE_MODES,
    "rotary": ROTARY_LAYOUTS,
    "router": ROUTERS,
}
_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}


def document_schema(cls: type) -> dict[str, Any]:
    """The JSON schema (OpenAPI 3.0 dialect) of the document a dataclass is read from: a property per field,
    typed from its annotation and described by the docstring under it. With a ``from_dict`` parser, the
    required fields are the ones it reports as missing from an empty document and no other key is allowed
    (the parser rejects it); without one (``plan.json``), the fields without a default are required.

    ``document_schema(ModelSpec)`` describes ``model.json``; the API's OpenAPI schema is built from it."""
    import typing

    hints = typing.get_type_hints(cls)
    docs = _field_docs(cls)
    properties: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        prop = _type_schema(hints[f.name])
        if f.name in FIELD_CHOICES:
            prop["enum"] = [*FIELD_CHOICES[f.name], *([None] if prop.get("nullable") else [])]
        if f.name in docs:
            prop["description"] = docs[f.name]
        properties[f.name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if (cls.__doc__ or "").strip():
        schema["description"] = " ".join(cls.__doc__.split("\n\n")[0].split())
    if hasattr(cls, "from_dict"):
        try:
            cls.from_dict({})
            required = []
        except SpecError as exc:
            required = [k for k, msgs in exc.errors.items() if "is required" in msgs]
        schema["additionalProperties"] = False
    else:
        missing = (dataclasses.MISSING,)
        required = [
            f.name for f in dataclasses.fields(cls) if f.default in missing and f.default_factory in missing
        ]
    if required:
        schema["required"] = required
    return schema


def _type_schema(annotation) -> dict[str, Any]:
    import types
    import typing

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in args if a is not type(None)]
        return {**(_type_schema(inner[0]) if len(inner) == 1 else {}), "nullable": True}
    if dataclasses.is_dataclass(annotation):
        return document_schema(annotation)
    if origin in (list, tuple):
        return {"type": "array", "items": _type_schema(args[0]) if args else {}}
    if origin is dict or annotation is dict:
        values = _type_schema(args[1]) if len(args) == 2 and args[1] is not Any else {}
        return {"type": "object", "additionalProperties": values or True}
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    return {}


def _field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass and of its dataclass bases, read from the source (Python
    keeps no attribute docstrings at run time); none when the source is not there."""
    import ast
    import inspect
    import textwrap

    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        except (OSError, TypeError, IndexError, AttributeError):
            continue
        for stmt, following in zip(body, body[1:], strict=False):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[stmt.target.id] = " ".join(following.value.value.split())
    return docs
