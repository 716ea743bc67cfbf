"""``{% small_example as ex %}``: the shipped example that runs on this machine (names and training), for
the new-search form wherever it is included (planner page, dashboard)."""

from __future__ import annotations

import json

from django import template

from workers.planner.examples import small_example as load_small_example

register = template.Library()


@register.simple_tag
def small_example() -> dict:
    docs = load_small_example()
    return {
        "model": docs["model"],
        "cluster": docs["cluster"],
        "training_json": json.dumps(docs["training"]),
    }
