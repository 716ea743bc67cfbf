"""Job config parsing from the contracts, the torchrun command, the CLI's input errors, metric helpers."""

from __future__ import annotations

import argparse
import json
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from workers.planner.specs import SpecError, Strategy, TrainingConfig, strategy_short_name
from workers.training.config import (
    ConfigError,
    JobConfig,
    ParallelConfig,
    TrainingSpec,
    parse_model,
    strategy_from_plan,
)
from workers.training.launch import render_torchrun_command
from workers.training.metrics import split_comm_compute

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "workers" / "training" / "examples"
from workers.planner.examples import CONTRACTS  # noqa: E402


def tiny_model() -> dict:
    return json.loads((EXAMPLES / "tiny-dense.json").read_text())


@pytest.mark.skipif(not CONTRACTS.exists(), reason="shared contracts not present")
def test_contract_examples_parse_with_their_field_names():
    for name in ("strategy.json",):
        path = CONTRACTS / name
        s = ParallelConfig.from_dict(json.loads(path.read_text()))
        assert (s.tp, s.pp, s.dp, s.zero_stage, s.recompute, s.sequence_parallel) == (
            8,
            8,
            16,
            1,
            "full",
            True,
        )
    for name in ("model.json", "model-moe.json"):
        m = parse_model(json.loads((CONTRACTS / name).read_text()))
        assert m.num_layers >= 64
    plan = json.loads((CONTRACTS / "plan.json").read_text())
    assert strategy_from_plan(plan)["tp"] == 8


@pytest.mark.parametrize(
    ("strategy", "field"),
    [
        ({"tp": 3}, "strategy.tp"),
        ({"dp": 2, "ep": 3}, "strategy.ep"),
        ({"zero_stage": 4}, "strategy.zero_stage"),
        ({"recompute": "some"}, "strategy.recompute"),
        ({"cp": 3}, "strategy.cp"),  # 2*cp must divide seq_length (32)
        ({"sequence_parallel": "yes"}, "strategy.sequence_parallel"),
        ({"pp": 2, "micro_batch_size": 8}, "strategy.micro_batch_size"),
        ({"dp": 3}, "training.global_batch_size"),
        ({"dp": 2, "ep": 2}, "strategy.ep"),  # a dense model has no experts
    ],
)
def test_invalid_input_names_the_field(strategy, field):
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(
            {"model": tiny_model(), "strategy": strategy, "training": {"global_batch_size": 8}}
        )
    assert err.value.field == field


def planner_error_field(parse, doc: dict, prefix: str) -> str:
    with pytest.raises(SpecError) as err:
        parse(doc)
    return f"{prefix}.{err.value.field}"


@pytest.mark.parametrize(
    "strategy",
    [
        {"tp": 0},
        {"pp": "2"},
        {"dp": 1.5},
        {"ep": True},
        {"cp": -1},
        {"zero_stage": 4},
        {"recompute": "some"},
        {"sequence_parallel": "yes"},
        {"micro_batch_size": 0},
        {"pipeline": 2},
        {"order": "tp-dp"},
    ],
)
def test_runtime_strategy_rejects_what_the_planner_rejects_under_the_same_field(strategy):
    field = planner_error_field(Strategy.from_dict, strategy, "strategy")
    with pytest.raises(ConfigError) as err:
        ParallelConfig.from_dict(strategy)
    assert err.value.field == field
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict({"model": tiny_model(), "strategy": strategy})
    assert err.value.field == field


@pytest.mark.parametrize(
    "training",
    [
        {"global_batch_size": 0},
        {"global_batch_size": "8"},
        {"dtype": "int4"},
        {"optimizer": "lion"},
        {"flash_attention": "yes"},
    ],
)
def test_runtime_training_rejects_what_the_planner_rejects_under_the_same_field(training):
    field = planner_error_field(TrainingConfig.from_dict, {"global_batch_size": 8, **training}, "training")
    with pytest.raises(ConfigError) as err:
        TrainingSpec.from_dict(training)
    assert err.value.field == field
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict({"model": tiny_model(), "training": training})
    assert err.value.field == field


def test_runtime_defaults_differ_from_the_planner_only_on_purpose():
    cfg = JobConfig.from_dict({"model": tiny_model()})
    # one rank, nothing sharded or recomputed where the planner would search; fp32 and a small batch
    assert cfg.world_size == 1 and cfg.strategy.is_complete
    assert cfg.strategy == ParallelConfig.from_dict(Strategy().completed().to_dict())
    assert (cfg.training.global_batch_size, cfg.training.dtype) == (8, "fp32")
    assert cfg.training.optimizer == TrainingConfig(global_batch_size=8).optimizer
    # the runtime's classes are the planner's: what the runtime trains, the planner can cost
    assert isinstance(cfg.strategy, Strategy) and isinstance(cfg.training, TrainingConfig)


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"training": {"dtype": "fp8"}}, "training.dtype"),  # the planner costs fp8; no autocast to it here
        ({"training": {"framework": "deepspeed"}}, "training.framework"),  # planned, not run, here
        ({"strategy": {"vpp": 2}}, "strategy.vpp"),  # interleaving needs pipeline stages
    ],
)
def test_runtime_only_rules_still_hold(doc, field):
    # the planner's parsers accept these documents ...
    TrainingConfig.from_dict({"global_batch_size": 8, **doc.get("training", {})})
    Strategy.from_dict(doc.get("strategy", {}))
    # ... the runtime cannot run them
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict({"model": tiny_model(), **doc})
    assert err.value.field == field


def test_runtime_splits_layers_the_planner_cannot():
    cfg = JobConfig.from_dict(
        {"model": {**tiny_model(), "num_layers": 5}, "strategy": {"pp": 2, "micro_batch_size": 2}}
    )
    assert cfg.strategy.pp == 2  # 5 layers over 2 stages: 3 + 2


def test_every_broken_layout_rule_is_reported_at_once():
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict({"model": tiny_model(), "strategy": {"dp": 3, "tp": 3, "cp": 3}})
    assert err.value.field == "training.global_batch_size"
    assert {"strategy.tp", "strategy.cp"} <= set(err.value.errors)


def test_short_name_keeps_the_plain_form_and_tells_apart_what_differs():
    assert strategy_short_name({"dp": 2, "micro_batch_size": 2}) == "tp1-pp1-dp2-ep1"
    assert strategy_short_name(json.loads((EXAMPLES / "dp2.json").read_text())) == "tp1-pp1-dp2-ep1"
    base = {"tp": 2, "pp": 4, "dp": 8, "ep": 2}
    variants = [
        base,
        {**base, "cp": 2},
        {**base, "zero_stage": 1},
        {**base, "recompute": "selective"},
        {**base, "recompute": "full"},
        {**base, "vpp": 2},
        {**base, "sequence_parallel": True},
    ]
    names = [strategy_short_name(v) for v in variants]
    assert len(set(names)) == len(variants)
    assert strategy_short_name({**base, "cp": 2, "zero_stage": 1, "recompute": "selective"}) == (
        "tp2-pp4-dp8-ep2-cp2-z1-rsel"
    )
    # sequence parallelism without tensor parallelism changes nothing, so it does not change the name
    assert strategy_short_name({"dp": 2, "sequence_parallel": True}) == "tp1-pp1-dp2-ep1"


def test_runtime_plan_and_job_pages_share_one_short_name():
    for name in ("3d-tp2-pp2-dp1.json", "fsdp2-zero3.json", "tp2-sp.json"):
        doc = json.loads((EXAMPLES / name).read_text())
        assert ParallelConfig.from_dict(doc).short_name() == Strategy.from_dict(doc).short_name()
    assert ParallelConfig.from_dict(json.loads((EXAMPLES / "fsdp2-zero3.json").read_text())).short_name() == (
        "tp1-pp1-dp2-ep1-z3-rfull"
    )


def test_job_config_round_trips_through_json(tmp_path):
    cfg = JobConfig.from_dict(
        {"model": tiny_model(), "strategy": {"dp": 2, "micro_batch_size": 2}, "steps": 4, "job_id": "42"}
    )
    cfg.save(tmp_path / "job.json")
    again = JobConfig.load(tmp_path / "job.json")
    assert again == cfg
    assert (again.world_size, again.local_batch_size, again.num_microbatches) == (2, 4, 2)


def test_render_torchrun_command_uses_c10d_rendezvous_and_the_module_entry_point():
    cmd = render_torchrun_command("/tmp/job.json", 2, 8, 1, "10.0.0.1:29400", "job-42", 3)
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    warm = render_torchrun_command("/tmp/job.json", 2, 8, 1, "10.0.0.1:29400", "job-42", 3, warm=True)
    assert warm[1:3] == ["-m", "workers.training.supervision.agent"] and warm[3:] == cmd[3:]  # the same flags
    for arg in (
        "--nnodes=2",
        "--nproc-per-node=8",
        "--node-rank=1",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.1:29400",
        "--rdzv-id=job-42",
        "--max-restarts=3",
    ):
        assert arg in cmd
    assert "--standalone" not in cmd
    assert cmd[-4:] == ["-m", "workers.training.run", "--config", "/tmp/job.json"]
    with pytest.raises(ValueError):
        render_torchrun_command("/tmp/job.json", 2, 8, 2, "h:1", "x")


def cli_args(**kw) -> argparse.Namespace:
    base = dict(
        plan=None,
        strategy=None,
        model=None,
        training=None,
        data=None,
        steps=2,
        nproc=None,
        global_batch_size=None,
        lr=None,
        seed=None,
        device=None,
        profile_every=0,
        comm_hook=None,
        job_id=None,
        redis_url=None,
        timeout=60,
        json=True,
    )
    base.update(kw)
    return argparse.Namespace(**base)


def test_cli_rejects_bad_input_with_exit_2_and_a_message(tmp_path, capsys):
    from workers.training.cli import train_command

    model = str(EXAMPLES / "tiny-dense.json")
    assert train_command(cli_args(model=model)) == 2
    assert "--strategy" in capsys.readouterr().err
    assert train_command(cli_args(model=model, strategy=str(EXAMPLES / "dp2.json"), nproc=3)) == 2
    assert "--nproc" in capsys.readouterr().err
    (tmp_path / "s.json").write_text("{not json")
    assert train_command(cli_args(model=model, strategy=str(tmp_path / "s.json"))) == 2
    assert "not valid JSON" in capsys.readouterr().err
    infeasible = tmp_path / "p.json"
    infeasible.write_text(json.dumps({"strategy": {}, "feasible": False, "reason": "OOM"}))
    assert train_command(cli_args(model=model, plan=str(infeasible))) == 2
    assert "plan.feasible" in capsys.readouterr().err


def test_comm_compute_split_measures_union_and_overlap():
    def ev(name, start_us, end_us, parent=None):
        return SimpleNamespace(
            name=name, time_range=SimpleNamespace(start=start_us, end=end_us), cpu_parent=parent
        )

    events = [
        ev("aten::mm", 0, 100),
        ev("aten::add", 50, 150),
        ev("gloo:all_reduce", 120, 200),
        ev("aten::mul", 10, 20, parent="aten::mm"),  # nested: not double counted
        ev("c10d::send", 300, 310),
    ]
    split = split_comm_compute(events)
    assert split.compute_s == pytest.approx(150e-6)
    assert split.comm_s == pytest.approx(90e-6)
    assert split.overlap_s == pytest.approx(30e-6)
    assert split.exposed_comm_s == pytest.approx(60e-6)


def test_event_publisher_appends_train_events_off_thread():
    redis = pytest.importorskip("redis")
    from workers.events import read_since, seq_key, stream_key
    from workers.training.metrics import EventPublisher

    url = "redis://127.0.0.1:6379/0"
    try:
        redis.Redis.from_url(url).ping()
    except Exception:
        pytest.skip("no Redis at 127.0.0.1:6379")
    job = str(900_000 + uuid.uuid4().int % 99_999)
    pub = EventPublisher(url, job)
    for step in range(1, 4):
        pub.submit("train", {"loss": 5.0 - step, "tokens_per_s": 1000.0}, step=step)
    pub.close()
    client = redis.Redis.from_url(url)
    try:
        events = read_since(client, f"job/{job}")
        assert [(e["kind"], e["step"], e["values"]["loss"]) for e in events] == [
            ("train", 1, 4.0),
            ("train", 2, 3.0),
            ("train", 3, 2.0),
        ]
        assert pub.published == 3 and pub.errors == 0
    finally:
        client.delete(stream_key(f"job/{job}"), seq_key(f"job/{job}"))
