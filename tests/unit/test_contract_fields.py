"""A key that is no field of a contract document (model, cluster, training, strategy) is an error naming
it, in the planner's parser and so in everything that reads the documents through it: the runtime's
config, `cann-train strategy` and `cann-train train`. Every document we ship still parses."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from workers.cli import main
from workers.planner.examples import CONTRACTS, DATA, SHARED, contract, reference_runs
from workers.planner.specs import (
    ClusterSpec,
    ModelSpec,
    SpecError,
    Strategy,
    TrainingConfig,
    document_schema,
    load_inputs,
)
from workers.training.config import ConfigError, JobConfig, strategy_from_plan
from workers.training.examples import DIR as TRAINING_EXAMPLES
from workers.training.examples import example

PARSERS = {"model": ModelSpec, "cluster": ClusterSpec, "training": TrainingConfig, "strategy": Strategy}


def kind_of(doc: dict) -> str | None:
    """Which contract a shipped example file holds, by the fields only that contract has."""
    if "num_layers" in doc:
        return "model"
    if "devices_per_node" in doc:
        return "cluster"
    if "global_batch_size" in doc:
        return "training"
    if "tp" in doc or "dp" in doc:
        return "strategy"
    return None


def shipped_documents() -> list[tuple[str, str, dict]]:
    """(where, kind, document) for every contract document in the repository and beside it."""
    docs = []
    folders = [CONTRACTS, TRAINING_EXAMPLES, DATA / "examples", SHARED / "contracts"]
    for folder in folders:
        for path in sorted(Path(folder).glob("*.json")) if Path(folder).exists() else []:
            doc = json.loads(path.read_text())
            if path.name == "plan.json":
                docs.append((str(path), "strategy", doc["strategy"]))
            elif kind := kind_of(doc):
                docs.append((str(path), kind, doc))
    for run in reference_runs():
        docs += [(f"reference run {run['id']}", kind, run[kind]) for kind in PARSERS]
    examples = json.loads((DATA / "example_models.json").read_text())
    docs += [
        (f"example model {i}", "model", e["model"]) for i, e in enumerate(examples["models"]) if "model" in e
    ]
    docs += [
        (f"example cluster {i}", "cluster", e["cluster"])
        for i, e in enumerate(examples["clusters"])
        if "cluster" in e
    ]
    return docs


def test_every_shipped_document_parses():
    docs = shipped_documents()
    assert {kind for _, kind, _ in docs} == set(PARSERS) and len(docs) > 40
    for where, kind, doc in docs:
        try:
            PARSERS[kind].from_dict(doc)
        except SpecError as exc:
            pytest.fail(f"{where} ({kind}.json) no longer parses: {exc}")


def test_the_clusters_built_at_run_time_parse(tmp_path):
    """This machine as the seed describes it, and the cluster.json `cann-train calibrate` writes."""
    from controlplane.planning.seed import local_cpu_cluster
    from workers.training.calibrate import calibrate

    ClusterSpec.from_dict(local_cpu_cluster()[0])
    _profile, paths = calibrate(str(tmp_path), quick=True, allreduce=False)
    ClusterSpec.from_dict(json.loads(Path(paths[1]).read_text()))


MODEL, MOE_MODEL, CLUSTER = contract("model.json"), contract("model-moe.json"), contract("cluster.json")


@pytest.mark.parametrize(
    ("kind", "doc", "field", "document", "a_known_field"),
    [
        ("model", {**MODEL, "num_layer": 96}, "num_layer", "model.json", "num_layers"),
        (
            "model",
            {**MOE_MODEL, "moe": {**MOE_MODEL["moe"], "topk": 2}},
            "moe.topk",
            "model.json's moe",
            "top_k",
        ),
        ("cluster", {**CLUSTER, "nodes": 2}, "nodes", "cluster.json", "num_nodes"),
        (
            "cluster",
            {**CLUSTER, "device": {**CLUSTER["device"], "hbm_GiB": 80}},
            "device.hbm_GiB",
            "cluster.json's device",
            "memory_GiB",
        ),
        (
            "cluster",
            {**CLUSTER, "inter_node": {**CLUSTER["inter_node"], "bw": 1}},
            "inter_node.bw",
            "a cluster.json link",
            "bandwidth_GBps",
        ),
        (
            "cluster",
            {**CLUSTER, "tiers": [{"name": "leaf", "nodes": 20, "oversub": 2}]},
            "tiers[0].oversub",
            "a cluster.json tier",
            "oversubscription",
        ),
        (
            "training",
            {**contract("training.json"), "global_batch": 8},
            "global_batch",
            "training.json",
            "dtype",
        ),
        ("strategy", {"dp": 2, "tpp": 2}, "tpp", "strategy.json", "tp"),
    ],
)
def test_an_unknown_field_is_an_error_naming_it(kind, doc, field, document, a_known_field):
    with pytest.raises(SpecError) as err:
        PARSERS[kind].from_dict(doc)
    assert list(err.value.errors) == [field]
    message = err.value.errors[field][0]
    assert message.startswith(f"is not a field of {document}")
    assert a_known_field in message.split("(known: ")[1].rstrip(")").split(", ")


def test_unknown_fields_are_reported_with_every_other_problem():
    model = {**contract("model.json"), "num_layers": 0, "hidden": 12288}
    with pytest.raises(SpecError) as err:
        load_inputs(model, {**contract("cluster.json"), "gpus": 8}, contract("training.json"))
    assert set(err.value.errors) == {"model.num_layers", "model.hidden", "cluster.gpus"}


def test_the_schema_of_a_document_is_its_parser():
    schema = document_schema(ModelSpec)
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "ffn_hidden_size",
        "vocab_size",
        "seq_length",
    }
    assert schema["properties"]["moe"]["nullable"] is True
    assert schema["properties"]["moe"]["properties"]["top_k"]["type"] == "integer"
    assert schema["properties"]["activation"]["enum"] == ["gelu", "swiglu", "relu", "geglu"]
    assert schema["properties"]["hidden_size"]["description"] == "Model width h."
    cluster = document_schema(ClusterSpec)
    assert cluster["properties"]["tiers"]["items"]["properties"]["nodes"]["type"] == "integer"
    assert cluster["properties"]["device"]["properties"]["peak_tflops"]["additionalProperties"] == {
        "type": "number"
    }
    assert "required" not in document_schema(Strategy)  # a partial strategy: every field may be searched


def test_the_runtime_rejects_what_the_planner_rejects():
    config = {"model": example("tiny-dense.json"), "strategy": {"dp": 2, "tpp": 2}}
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(config)
    assert list(err.value.errors) == ["strategy.tpp"]
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict({"model": {**example("tiny-dense.json"), "layers": 2}})
    assert list(err.value.errors) == ["model.layers"]
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict({"model": example("tiny-dense.json"), "training": {"global_batch": 4}})
    assert list(err.value.errors) == ["training.global_batch"]
    with pytest.raises(ConfigError) as err:  # the job config itself: every unknown key at once
        JobConfig.from_dict({"model": example("tiny-dense.json"), "stpes": 3, "lrate": 0.1})
    assert list(err.value.errors) == ["lrate", "stpes"]
    assert err.value.errors["stpes"][0].startswith("is not a field of the job config (known: ")


def test_a_plan_json_with_its_extra_fields_still_gives_its_strategy():
    plan = {**contract("plan.json"), "id": 7, "name": "tp8-pp8-dp16-ep1-z1-rfull-sp", "model": {}}
    assert Strategy.from_dict(strategy_from_plan(plan), partial=False).tp == 8


def write(tmp_path, name, doc) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_cann_train_strategy_exits_2_naming_an_unknown_field(tmp_path, capsys):
    model = write(tmp_path, "model.json", {**contract("model.json"), "num_layer": 96})
    code = main(
        ["strategy", "--model", model, "--cluster", str(CONTRACTS / "cluster.json")]
        + ["--training", str(CONTRACTS / "training.json")]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "model.num_layer: is not a field of model.json" in err
    strategy = write(tmp_path, "s.json", {"tp": 8, "tpp": 2})
    code = main(
        ["strategy", "--model", str(CONTRACTS / "model.json"), "--cluster", str(CONTRACTS / "cluster.json")]
        + ["--training", str(CONTRACTS / "training.json"), "--strategy", strategy]
    )
    assert code == 2 and "strategy.tpp: is not a field of strategy.json" in capsys.readouterr().err


def test_cann_train_train_exits_2_naming_an_unknown_field(tmp_path, capsys):
    from tests.unit.test_training_config import cli_args
    from workers.training.cli import train_command

    model = copy.deepcopy(example("tiny-dense.json"))
    model["seq_len"] = 64
    code = train_command(
        cli_args(model=write(tmp_path, "m.json", model), strategy=str(TRAINING_EXAMPLES / "dp2.json"))
    )
    assert code == 2
    assert "model.seq_len" in capsys.readouterr().err
