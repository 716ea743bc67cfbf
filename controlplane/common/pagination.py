"""The API's pagination, in a module of its own: settings name it (DEFAULT_PAGINATION_CLASS), and DRF
imports it while its own generics load, so it may import nothing that imports rest_framework.viewsets."""

from __future__ import annotations

from rest_framework import exceptions, pagination


class Pagination(pagination.LimitOffsetPagination):
    """DRF's ``limit``/``offset`` pages with their bounds checked: a ``limit`` of 10^27 reached the database
    (SQLite cannot bind it: a misleading 409; PostgreSQL: a 500) and a malformed one was silently ignored;
    now either is a 400 naming the parameter."""

    max_limit = 1000
    max_offset = 2**31 - 1

    def _bounded(self, request, name: str, default: int | None, low: int, high: int) -> int | None:
        raw = request.query_params.get(name)
        if raw is None or raw == "":
            return default
        try:
            value = int(raw)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise exceptions.ValidationError(
                {name: [f"must be a whole number from {low} to {high:,}; got {raw[:40]!r}"]}
            )
        return value

    def get_limit(self, request):
        return self._bounded(request, self.limit_query_param, self.default_limit, 1, self.max_limit)

    def get_offset(self, request):
        return self._bounded(request, self.offset_query_param, 0, 0, self.max_offset)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        bounds = {self.limit_query_param: (1, self.max_limit), self.offset_query_param: (0, self.max_offset)}
        for parameter in parameters:
            low, high = bounds[parameter["name"]]
            parameter["schema"] = {**parameter["schema"], "minimum": low, "maximum": high}
        return parameters
