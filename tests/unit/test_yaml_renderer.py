"""The API's YAML renderer: libyaml's emitter where PyYAML has it, the same bytes as the pure-Python one."""

from __future__ import annotations

import yaml
from rest_framework.exceptions import ErrorDetail

from controlplane.common.formats import ApiDumper, SafeYAMLRenderer


def test_the_fast_renderer_writes_what_the_pure_python_dumper_writes():
    doc = {
        "detail": ErrorDetail("not found", code="not_found"),  # DRF's str subclass
        "token_prefix": "138007e8",  # a float to YAML 1.2 readers: must come out quoted
        "steps": [1, 2.5, None, True],
        "nested": {"b": {"c": "ü"}, "a": []},
    }
    fast = SafeYAMLRenderer().render(doc)
    slow = yaml.dump(doc, Dumper=ApiDumper, encoding="utf-8", allow_unicode=True, default_flow_style=False)
    assert fast == slow
    assert b"'138007e8'" in fast
    assert yaml.safe_load(fast) == {**doc, "detail": "not found"}
    if yaml.__with_libyaml__:
        assert issubclass(SafeYAMLRenderer.encoder, yaml._yaml.CEmitter)
