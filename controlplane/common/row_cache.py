"""API rows kept in Django's cache (per process) under a key that changes whenever the row would (issue 36,
item 7: lists of unchanged objects serialized again on every request were the API's bottleneck). The caller
says what the key is (an object's ``updated_at`` where every write of the row moves it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.core.cache import cache

TTL_S = 300
"""How long a kept row lives at most (bounds what a key could miss)."""


def plain(value: Any) -> Any:
    """``value`` with DRF's ReturnDict/ReturnList as plain dicts and lists (they hold their serializer, which
    is no value to keep)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def cached_rows(items: Sequence, key: Callable[[Any], str | None], build: Callable[[list], list]) -> list:
    """``build(items)`` (rows, in order), each item whose ``key(item)`` is not None kept under it: only the
    items missing from the cache are built."""
    keys = {i: k for i, item in enumerate(items) if (k := key(item)) is not None}
    kept = cache.get_many(list(keys.values())) if keys else {}
    todo = [i for i in range(len(items)) if keys.get(i) not in kept]
    built = dict(zip(todo, map(plain, build([items[i] for i in todo])), strict=True)) if todo else {}
    if fresh := {keys[i]: row for i, row in built.items() if i in keys and row is not None}:
        cache.set_many(fresh, TTL_S)
    return [built[i] if i in built else kept[keys[i]] for i in range(len(items))]


def cached_page_rows(
    heads: Sequence,
    key: Callable[[Any], str | None],
    load: Callable[[list], dict],
    build: Callable[[list], list],
) -> list:
    """The rows of a page read as its heads (a few columns each: ``pk`` and what ``key`` reads, from
    ``values_list(..., named=True)``): the kept ones without loading their objects at all (a model instance of
    a wide row costs more than its cached row); ``load(pks)`` -> ``{pk: object}`` for the rest, and
    ``build(objects)`` their rows. A head whose object is gone by the second read (deleted between the two)
    has no row."""

    def build_heads(missing: list) -> list:
        objects = load([head.pk for head in missing])
        rows = iter(build([objects[head.pk] for head in missing if head.pk in objects]))
        return [next(rows) if head.pk in objects else None for head in missing]

    return [row for row in cached_rows(heads, key, build_heads) if row is not None]
