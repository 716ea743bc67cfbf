"""The API's parsers and renderers: JSON and YAML in, JSON and YAML out, hardened against what a hostile
or broken client sends (nesting thousands deep, Python object tags, error bodies YAML cannot represent).

Why not the stock classes alone: DRF's JSONParser lets a RecursionError through (a 500), and
djangorestframework-yaml catches only ``ParserError`` (a constructor or scanner error is a 500) and its
SafeDumper cannot represent DRF's ``ErrorDetail`` (every error answer asked for as YAML was a 500).
"""

from __future__ import annotations

import re

import yaml
from django.conf import settings
from rest_framework.exceptions import ErrorDetail, ParseError, ValidationError
from rest_framework.parsers import JSONParser
from rest_framework_yaml.encoders import SafeDumper
from rest_framework_yaml.parsers import YAMLParser
from rest_framework_yaml.renderers import YAMLRenderer

# The contract documents nest four levels at most (cluster.tiers[i].name); 32 leaves room for any request.
MAX_DEPTH = 32


def _too_deep(data, limit: int = MAX_DEPTH) -> bool:
    """Whether ``data`` nests lists/objects deeper than ``limit`` (iterative: no recursion to exhaust)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return False


def _depth_error() -> ParseError:
    return ParseError(f"The document nests deeper than {MAX_DEPTH} levels; no contract document does.")


_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogates(data, path: str = "") -> list[str]:
    """The places (``model.name``, ``tags[2]``) in a parsed document whose text holds a lone UTF-16 surrogate
    (JSON's ``"\\ud800"``): no text is made of one, and neither a database nor a page can hold it."""
    found: list[str] = []
    if isinstance(data, str):
        if _SURROGATE.search(data):
            found.append(path or "(the document)")
    elif isinstance(data, dict):
        for key, value in data.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and _SURROGATE.search(key):
                found.append(f"{path or '(the document)'}: a key")
            found += _lone_surrogates(value, where)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found += _lone_surrogates(value, f"{path}[{i}]")
    return found


def _check_text(data):
    if bad := _lone_surrogates(data):
        raise ValidationError(
            {where.split(":")[0]: ["holds a lone UTF-16 surrogate (an escape like \\ud800 without its pair): not text"]
             for where in bad[:20]}
        )  # fmt: skip
    return data


class SafeJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise _depth_error() from None
        if _too_deep(data):
            raise _depth_error()
        return _check_text(data)


class SafeYAMLParser(YAMLParser):
    """``yaml.safe_load`` with every YAML error a 400 (a ``!!python/...`` tag is refused, never built) and
    the nesting depth checked on the event stream before anything is built."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = stream.read().decode(encoding)
            depth = 0
            for event in yaml.parse(text, Loader=yaml.SafeLoader):
                if isinstance(event, yaml.CollectionStartEvent):
                    depth += 1
                    if depth > MAX_DEPTH:
                        raise _depth_error()
                elif isinstance(event, yaml.CollectionEndEvent):
                    depth -= 1
            return _check_text(yaml.safe_load(text))
        except (ParseError, ValidationError):
            raise
        except yaml.YAMLError as exc:
            raise ParseError(f"YAML parse error: {str(exc)[:500]}") from None
        except (ValueError, RecursionError) as exc:
            raise ParseError(f"Could not read the YAML body: {str(exc)[:200]}") from None


class ApiDumper(SafeDumper):
    """SafeDumper that writes DRF's ErrorDetail (a str subclass) as the plain string it is."""


ApiDumper.add_representer(ErrorDetail, lambda dumper, value: dumper.represent_str(str(value)))
# any other str or int subclass too: a model's TextChoices value (``JobState.QUEUED`` in a view's dict) was a
# RepresenterError, a 500, in YAML only
ApiDumper.add_multi_representer(str, lambda dumper, value: dumper.represent_str(str(value)))
ApiDumper.add_multi_representer(int, lambda dumper, value: dumper.represent_int(int(value)))
# a string that YAML 1.2 reads as a number (a token prefix "138007e8" is 1.38e13 there, though PyYAML's YAML
# 1.1 reads a string) is written quoted, so every YAML reader gets the string back
ApiDumper.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


if yaml.__with_libyaml__:

    class _FastApiDumper(yaml._yaml.CEmitter, ApiDumper):
        """``ApiDumper``'s representers and resolvers in front of libyaml's emitter (what ``yaml.CSafeDumper``
        is to ``yaml.SafeDumper``): the same bytes, ~5x faster -- a search's page data as YAML took ~1.8 s
        with the pure-Python emitter, 0.36 s with this one, on this box."""

        def __init__(self, stream, default_style=None, default_flow_style=False, canonical=None, indent=None,
                     width=None, allow_unicode=None, line_break=None, encoding=None, explicit_start=None,
                     explicit_end=None, version=None, tags=None, sort_keys=True):  # fmt: skip
            yaml._yaml.CEmitter.__init__(
                self, stream, canonical=canonical, indent=indent, width=width, encoding=encoding,
                allow_unicode=allow_unicode, line_break=line_break, explicit_start=explicit_start,
                explicit_end=explicit_end, version=version, tags=tags,
            )  # fmt: skip
            yaml.representer.SafeRepresenter.__init__(
                self, default_style=default_style, default_flow_style=default_flow_style, sort_keys=sort_keys
            )
            yaml.resolver.Resolver.__init__(self)

    _RENDER_DUMPER: type = _FastApiDumper
else:  # PyYAML built without libyaml
    _RENDER_DUMPER = ApiDumper


class SafeYAMLRenderer(YAMLRenderer):
    encoder = _RENDER_DUMPER


def document_download(document: dict, filename: str, fmt: str):
    """A stored contract document as a file to download (``fmt``: json or yaml): what the API's create takes
    back unchanged (the knowledge-base pages' ``cluster.json`` / ``model.yaml`` links)."""
    import json

    from django.http import HttpResponse

    if fmt == "yaml":
        body, kind = yaml.safe_dump(document, sort_keys=False, allow_unicode=True), "application/yaml"
    else:
        body, kind = json.dumps(document, indent=2, ensure_ascii=False) + "\n", "application/json"
    response = HttpResponse(body, content_type=f"{kind}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}.{fmt}"'
    return response
