"""Every numeric field of a contract document has a physical upper bound and must be finite, and a name
cannot hide control or bidirectional-override characters: a typo or a hostile value is an error naming
the field, not a stored document that makes pages huge or searches endless."""

from __future__ import annotations

import copy

import pytest

from workers.planner import ClusterSpec, ModelSpec, SpecError, TrainingConfig
from workers.planner.examples import contract


@pytest.mark.parametrize(
    ("doc", "path", "value", "message"),
    [
        ("model.json", ("hidden_size",), 10**12, "must be <= 262,144"),
        ("model.json", ("vocab_size",), 10**300, "must be <= 16,777,216"),
        ("model.json", ("seq_length",), 10**9, "must be <="),
        ("cluster.json", ("num_nodes",), 10**30, "must be <= 1,048,576"),
        ("cluster.json", ("device", "memory_GiB"), float("inf"), "must be a finite number"),
        ("cluster.json", ("device", "memory_GiB"), float("nan"), "must be a finite number"),
        ("cluster.json", ("device", "peak_tflops", "bf16"), 1e300, "must be a number > 0 and <="),
        ("cluster.json", ("inter_node", "bandwidth_GBps"), 1e12, "must be <="),
        ("training.json", ("global_batch_size",), 10**20, "must be <="),
    ],
)
def test_values_beyond_any_real_system_name_their_field(doc, path, value, message):
    parse = {"model.json": ModelSpec, "cluster.json": ClusterSpec, "training.json": TrainingConfig}[doc]
    data = copy.deepcopy(contract(doc))
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(SpecError) as exc:
        parse.from_dict(data)
    field = ".".join(path)
    assert any(k == field and any(message in m for m in msgs) for k, msgs in exc.value.errors.items()), (
        exc.value.errors
    )


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("x" * 10_000, "at most 200 characters"),
        ("gpt\x00-3", "U+0000"),
        ("evil\u202eexe.json", "U+202E"),
        ("two\nlines", "U+000A"),
    ],
)
def test_names_are_short_and_show_what_they_are(name, message):
    data = {**contract("model.json"), "name": name}
    with pytest.raises(SpecError) as exc:
        ModelSpec.from_dict(data)
    assert any(message in m for m in exc.value.errors["name"])


def test_every_shipped_document_is_within_the_bounds():
    for doc, parse in (
        ("model.json", ModelSpec),
        ("model-moe.json", ModelSpec),
        ("cluster.json", ClusterSpec),
        ("cluster-atlas900.json", ClusterSpec),
        ("training.json", TrainingConfig),
    ):
        parse.from_dict(contract(doc))
