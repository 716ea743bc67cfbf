"""``cann-train faults simulate|train|evaluate|detect``, run through its argument parser on tiny data."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from workers.reliability import faults_cli

DATA = Path(__file__).resolve().parents[1] / "data" / "risk"
TINY_LSTM = "--epochs 1 --window 8 --hidden 8"


def run(argv: str, capsys) -> tuple[int, str, str]:
    """``cann-train faults <argv>`` (paths here have no spaces): exit code, stdout, stderr."""
    parser = argparse.ArgumentParser(prog="cann-train")
    faults_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["faults", *argv.split()])
    rc = args.func(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def trace_files(workdir):
    """A training and a held-out simulation written by the CLI (made once for the module)."""
    parser = argparse.ArgumentParser()
    faults_cli.register(parser.add_subparsers())
    for name, seed, prefix in (("train", 0, "node"), ("held", 1, "eval")):
        argv = (
            f"faults simulate --nodes 8 --days 1 --seed {seed} --prefix {prefix} "
            f"--out {workdir / name}.npz --incidents {workdir / name}.csv --json"
        )
        args = parser.parse_args(argv.split())
        assert args.func(args) == 0
    return workdir / "train.npz", workdir / "held.npz"


def test_simulate_writes_traces_and_an_incident_list(trace_files, workdir, capsys):
    rc, out, _ = run(f"simulate --nodes 3 --days 0.2 --out {workdir / 's.npz'} --json", capsys)
    assert rc == 0
    summary = json.loads(out)
    assert summary["nodes"] == 3 and summary["description"]["simulator"] == "risk-sim/1"
    lines = (workdir / "train.csv").read_text().splitlines()
    assert lines[0] == "node,time,kind" and len(lines) > 1


def test_train_saves_a_model_that_says_what_it_was_trained_on(trace_files, workdir, capsys):
    train, _ = trace_files
    for model in ("lstm", "baseline"):
        rc, out, _ = run(
            f"train --model {model} --traces {train} --out {workdir / model} {TINY_LSTM} --json", capsys
        )
        assert rc == 0, out
        doc = json.loads(out)
        assert doc["model"] == model and 0 <= doc["threshold"] <= 1
        meta = json.loads((workdir / model / "model.json").read_text())
        assert "seed 0" in meta["trained_on_text"]
        assert (meta["config"] if model == "lstm" else meta)["horizon_s"] == 900
    assert (workdir / "lstm" / "model.pt").is_file()


def test_detect_lists_the_nodes_at_or_above_the_threshold(trace_files, workdir, capsys):
    _, held = trace_files
    rc, out, _ = run(f"detect --model {workdir / 'lstm'} --traces {held} --json", capsys)
    assert rc == 0
    doc = json.loads(out)
    assert len(doc["nodes"]) == 8 and "seed 0" in doc["trained_on"]
    assert doc["at_risk"] == [r["node"] for r in doc["nodes"] if r["risk"] >= doc["threshold"]]
    rc, out, _ = run(f"detect --model {workdir / 'lstm'} --traces {held} --threshold 0 --json", capsys)
    assert len(json.loads(out)["at_risk"]) == 8  # every risk is >= 0


def test_evaluate_prints_both_models_on_held_out_traces(trace_files, workdir, capsys):
    _, held = trace_files
    saved = f"--lstm {workdir / 'lstm'} --baseline {workdir / 'baseline'} --traces {held}"
    rc, out, _ = run(f"evaluate {saved} --json", capsys)
    assert rc == 0
    doc = json.loads(out)
    assert set(doc["models"]) == {"lstm", "baseline"}
    for row in doc["models"].values():
        assert {"precision", "recall", "f1", "lead_time_s_median", "false_alarms_per_node_day"} <= set(row)
        point = row["at_precision_target"]  # the second operating point: measured, or said absent
        assert point["target"] == 0.84 and ("absent" in point or 0 <= point["precision"] <= 1)
    assert set(doc["anchor"]["beaten_by"]) == set(doc["anchor"]["beaten_at"])
    assert "trained on simulated" in doc["data"] and "held-out simulated" in doc["data"]
    assert "seed 1" in doc["data"]
    rc, out, _ = run(f"evaluate {saved}", capsys)
    assert rc == 0 and out.splitlines()[0].split()[:4] == ["model", "precision", "recall", "F1"]
    assert "anchor: precision 0.84" in out


def test_evaluate_trains_what_it_is_not_given(workdir, capsys):
    sizes = "--train-nodes 6 --train-days 1 --eval-nodes 4 --eval-days 1"
    rc, out, _ = run(f"evaluate --baseline {workdir / 'baseline'} {sizes} {TINY_LSTM} --json", capsys)
    assert rc == 0
    assert set(json.loads(out)["models"]) == {"lstm", "baseline"}


def test_train_on_an_imported_prometheus_history(workdir, capsys):
    source = f"--prometheus {DATA / 'history.prom'}"
    incidents = f"--incidents {DATA / 'incidents.csv'}"
    rc, out, err = run(
        f"train --model baseline {source} {incidents} --horizon 300 --out {workdir / 'h'}",
        capsys,
    )
    assert rc == 0, err
    assert "imported Prometheus history (history.prom, incidents incidents.csv): 3 nodes" in out
    rc, out, _ = run(f"detect --model {workdir / 'h'} {source} --json", capsys)
    assert rc == 0
    assert [r["node"] for r in json.loads(out)["nodes"]] != []


@pytest.mark.parametrize(
    "argv, message",
    [
        ("simulate --out traces.txt", "the trace file must end in .npz"),
        ("evaluate --train-seed 3 --eval-seed 3", "--eval-seed must differ from --train-seed"),
        (f"train --model lstm --out m --prometheus {DATA / 'history.prom'}", "needs --incidents"),
        ("train --model lstm --out m --traces missing.npz", "--traces missing.npz: no such file"),
        ("detect --model nowhere --traces x.npz", "no model.json"),
        ("train --model lstm --out m --window 1", "window must be 2-1000 samples"),
    ],
)
def test_invalid_input_exits_2_with_a_message_a_person_can_act_on(
    argv, message, capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    rc, _, err = run(argv, capsys)
    assert rc == 2
    assert message in err and err.startswith("cann-train faults ")


def test_out_of_range_numbers_are_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exc:
        run("simulate --nodes 0 --out x.npz", capsys)
    assert exc.value.code == 2
    assert "--nodes: must be at least 1" in capsys.readouterr().err


def test_evaluating_on_the_training_simulation_is_refused(trace_files, tmp_path, capsys):
    train, _ = trace_files
    assert run(f"train --model baseline --traces {train} --out {tmp_path / 'b'}", capsys)[0] == 0
    rc, _, err = run(f"evaluate --baseline {tmp_path / 'b'} --traces {train}", capsys)
    assert rc == 2 and "trained on the same simulation" in err and "another --seed" in err
