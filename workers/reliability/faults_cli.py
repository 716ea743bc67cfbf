"""``cann-train faults``: simulate node telemetry with failures, train and evaluate failure prediction.

Train a failure predictor, evaluate it against the baseline on held-out traces, score traces for nodes at
risk.

- ``simulate``  write simulated traces (``.npz``) and, with ``--incidents``, their failures as an incident CSV
- ``train``     fit the LSTM or the baseline on simulated traces, a trace file, or a Prometheus dump plus an
                incident list; save it to ``--out DIR``
- ``evaluate``  both models on held-out traces (a simulation with another seed and other nodes, or a trace
                file / dump): precision, recall, F1, median lead time, false alarms per node-day
- ``detect``    score a trace file or a Prometheus dump with a saved model; list the nodes at risk

Exit codes: 0 ok, 2 invalid input (the message says what to change), 1 unexpected failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

PROG = "cann-train faults"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return value


def _add_sim(p: argparse.ArgumentParser, prefix: str = "", *, nodes: int, days: float, seed: int) -> None:
    g = p.add_argument_group(f"simulation{' (' + prefix.rstrip('-') + ')' if prefix else ''}")
    g.add_argument(f"--{prefix}nodes", type=_positive_int, default=nodes, help=f"nodes (default {nodes})")
    g.add_argument(f"--{prefix}days", type=_positive_float, default=days, help=f"days (default {days:g})")
    g.add_argument(f"--{prefix}seed", type=int, default=seed, help=f"random seed (default {seed})")


def _add_shared_sim(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("simulated fleet")
    g.add_argument(
        "--interval", type=_positive_float, default=30.0, help="seconds between samples (default 30)"
    )
    g.add_argument("--gpus-per-node", type=_positive_int, default=2, help="GPUs (ranks) per node (default 2)")
    g.add_argument(
        "--failure-rate",
        type=_non_negative_float,
        default=1.0,
        help="failures per node-day (default 1.0: an assumption, 264x Llama 3's observed rate)",
    )


def _add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument(
        "--horizon", type=_positive_float, default=900.0, help="prediction horizon in s (default 900)"
    )
    g.add_argument("--window", type=_positive_int, default=20, help="LSTM: samples per window (default 20)")
    g.add_argument("--hidden", type=_positive_int, default=32, help="LSTM: hidden units (default 32)")
    g.add_argument("--epochs", type=_positive_int, default=8, help="LSTM: training epochs (default 8)")
    g.add_argument("--threads", type=_positive_int, default=1, help="torch threads (default 1)")


def _add_source(p: argparse.ArgumentParser, what: str) -> None:
    g = p.add_argument_group(what)
    g.add_argument("--traces", type=Path, help="a trace file written by 'faults simulate' (.npz)")
    g.add_argument(
        "--prometheus", type=Path, help="a Prometheus text dump (dcgm-/npu-/node_exporter, /federate)"
    )
    g.add_argument("--incidents", type=Path, help="with --prometheus: incident list CSV (node,time,kind)")
    g.add_argument(
        "--default-time",
        type=float,
        help="with --prometheus: Unix seconds of a scrape whose samples carry no timestamp",
    )


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "faults",
        help="simulate failures, train and evaluate failure prediction, detect nodes at risk",
        description=__doc__.splitlines()[0],
    )
    sub = p.add_subparsers(dest="faults_command", metavar="SUBCOMMAND")
    sub.required = True

    s = sub.add_parser("simulate", help="write simulated per-node telemetry traces with failures")
    _add_sim(s, nodes=64, days=4.0, seed=0)
    _add_shared_sim(s)
    s.add_argument("--prefix", default="node", help="node names: PREFIX-000, PREFIX-001, ... (default node)")
    s.add_argument("--out", type=Path, required=True, help="trace file to write (.npz)")
    s.add_argument("--incidents", type=Path, help="also write the failures as an incident list CSV")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=simulate_command)

    t = sub.add_parser("train", help="train the LSTM or the baseline and save it")
    t.add_argument("--model", choices=["lstm", "baseline"], required=True)
    t.add_argument("--out", type=Path, required=True, help="directory to save the model to")
    _add_source(t, "training data (default: a simulation)")
    _add_sim(t, nodes=64, days=4.0, seed=0)
    _add_shared_sim(t)
    _add_model_args(t)
    t.add_argument("--json", action="store_true", help="print one JSON object")
    t.set_defaults(func=train_command)

    e = sub.add_parser("evaluate", help="both models on held-out traces: precision, recall, F1, lead time")
    e.add_argument("--lstm", type=Path, help="a saved LSTM (default: train one on the training simulation)")
    e.add_argument(
        "--baseline", type=Path, help="a saved baseline (default: fit one on the training simulation)"
    )
    _add_source(e, "held-out data (default: a simulation with --eval-seed and other nodes)")
    _add_sim(e, "train-", nodes=64, days=4.0, seed=0)
    _add_sim(e, "eval-", nodes=48, days=4.0, seed=1)
    _add_shared_sim(e)
    _add_model_args(e)
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.set_defaults(func=evaluate_command)

    d = sub.add_parser("detect", help="score traces with a saved model and list the nodes at risk")
    d.add_argument("--model", type=Path, required=True, help="a directory written by 'faults train'")
    _add_source(d, "traces to score")
    d.add_argument("--threshold", type=float, help="risk at which a node is at risk (default: the model's)")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(func=detect_command)


# ----------------------------------------------------------------------------------------------- helpers


class _Invalid(ValueError):
    pass


def _sim_config(args, prefix: str = "", node_prefix: str = "node"):
    from workers.reliability.risk.simulator import SimConfig

    return SimConfig(
        nodes=getattr(args, f"{prefix.replace('-', '_')}nodes"),
        days=getattr(args, f"{prefix.replace('-', '_')}days"),
        seed=getattr(args, f"{prefix.replace('-', '_')}seed"),
        interval_s=args.interval,
        gpus_per_node=args.gpus_per_node,
        failure_rate_per_node_day=args.failure_rate,
        node_prefix=node_prefix,
    )


def _load_source(args, *, need_incidents: bool):
    """The trace set named by --traces or --prometheus (+ --incidents), or None when neither is given."""
    from workers.reliability.risk.history import traces_from_prometheus
    from workers.reliability.risk.traces import TraceSet

    if args.traces and args.prometheus:
        raise _Invalid("give --traces or --prometheus, not both")
    if args.incidents and not args.prometheus:
        raise _Invalid("--incidents goes with --prometheus (a trace file carries its own failures)")
    if args.traces:
        if not args.traces.is_file():
            raise _Invalid(f"--traces {args.traces}: no such file")
        return TraceSet.load(args.traces)
    if args.prometheus:
        if not args.prometheus.is_file():
            raise _Invalid(f"--prometheus {args.prometheus}: no such file")
        if need_incidents and not args.incidents:
            raise _Invalid(
                "--prometheus needs --incidents (node,time,kind CSV): the failures to learn / score"
            )
        if args.incidents and not args.incidents.is_file():
            raise _Invalid(f"--incidents {args.incidents}: no such file")
        return traces_from_prometheus(args.prometheus, args.incidents, default_time=args.default_time)
    return None


def _lstm_config(args, horizon_s: float):
    from workers.reliability.risk.lstm import LstmConfig

    cfg = LstmConfig(
        horizon_s=horizon_s, window=args.window, hidden=args.hidden, epochs=args.epochs, threads=args.threads
    )
    cfg.validate()
    return cfg


def _same_simulation(a: dict, b: dict) -> bool:
    keys = ("source", "seed", "node_prefix")
    return a.get("source") == "simulated" and all(a.get(k) == b.get(k) for k in keys)


def _fail(sub: str, exc: Exception) -> int:
    print(f"{PROG} {sub}: invalid input: {exc}", file=sys.stderr)
    return 2


# ---------------------------------------------------------------------------------------------- commands


def simulate_command(args) -> int:
    from workers.reliability.risk.history import write_incidents
    from workers.reliability.risk.simulator import simulate

    if args.out.suffix != ".npz":
        return _fail("simulate", _Invalid(f"--out {args.out}: the trace file must end in .npz"))
    try:
        cfg = _sim_config(args, node_prefix=args.prefix)
        t0 = time.perf_counter()
        traces = simulate(cfg)
    except ValueError as exc:
        return _fail("simulate", exc)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    traces.save(args.out)
    if args.incidents:
        write_incidents(traces.failures, args.incidents)
    kinds: dict[str, int] = {}
    for f in traces.failures:
        kinds[f.kind] = kinds.get(f.kind, 0) + 1
    summary = {
        "out": str(args.out),
        "incidents": str(args.incidents) if args.incidents else None,
        "nodes": len(traces.traces),
        "samples": sum(len(t) for t in traces.traces),
        "node_days": round(traces.node_days, 3),
        "failures": len(traces.failures),
        "with_precursor": sum(1 for f in traces.failures if f.precursor_s),
        "failures_by_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
        "description": traces.description,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(
            f"{args.out}: {summary['nodes']} nodes, {summary['samples']} samples, "
            f"{summary['node_days']} node-days, "
            f"{summary['failures']} failures ({summary['with_precursor']} with a precursor)"
        )
        for kind, n in summary["failures_by_kind"].items():
            print(f"  {kind:24s} {n}")
    return 0


def train_command(args) -> int:
    from workers.reliability.risk.evaluate import fit_models
    from workers.reliability.risk.simulator import simulate

    try:
        cfg = _lstm_config(args, args.horizon)
        t0 = time.perf_counter()
        data = _load_source(args, need_incidents=True)
        if data is None:
            data = simulate(_sim_config(args))
        if not data.failures:
            raise _Invalid("the training data has no failures: nothing to learn from")
        model = fit_models(data, horizon_s=args.horizon, which=(args.model,), lstm_config=cfg)[args.model]
    except ValueError as exc:
        return _fail("train", exc)
    model.save(args.out)
    out = {
        "model": args.model,
        "out": str(args.out),
        "threshold": model.threshold,
        "horizon_s": model.horizon_s,
        "trained_on": model.trained_on_text,
        "training": model.training,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(
            f"{args.model} saved to {args.out} "
            f"(threshold {model.threshold:.4g}, horizon {model.horizon_s:g} s)"
        )
        print(f"trained on {out['trained_on']} in {out['seconds']} s")
    return 0


def evaluate_command(args) -> int:
    from workers.reliability.risk.evaluate import (
        evaluate_models,
        evaluate_precise,
        fit_models,
        load_model,
        report,
    )
    from workers.reliability.risk.simulator import simulate

    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        models = {}
        for name in ("lstm", "baseline"):
            path = getattr(args, name)
            if path is not None:
                m = load_model(path)
                if m.name != name:
                    raise _Invalid(f"--{name} {path} holds a {m.name} model")
                models[name] = m
        horizons = {m.horizon_s for m in models.values()}
        if len(horizons) > 1:
            raise _Invalid(
                f"the saved models have different horizons ({sorted(horizons)} s): compare like with like"
            )
        horizon = horizons.pop() if horizons else args.horizon
        held_out = _load_source(args, need_incidents=True)
        if held_out is None:
            if args.eval_seed == args.train_seed:
                raise _Invalid(
                    "--eval-seed must differ from --train-seed: held-out traces are another simulation"
                )
            held_out = simulate(_sim_config(args, "eval-", node_prefix="eval"))
        for m in models.values():
            if _same_simulation(m.trained_on.get("description", {}), held_out.description):
                raise _Invalid(
                    f"the {m.name} model was trained on the same simulation (seed and node names) as these "
                    "traces: evaluate on held-out traces (simulate with another --seed and --prefix)"
                )
        if not held_out.failures:
            raise _Invalid("the held-out traces have no failures: recall and lead time are undefined")
        missing = tuple(n for n in ("lstm", "baseline") if n not in models)
        this_training = {"source": "simulated", "seed": args.train_seed, "node_prefix": "node"}
        if missing and _same_simulation(this_training, held_out.description):
            raise _Invalid(
                "these traces are the training simulation (--train-seed, node names): evaluate on held-out "
                "traces (simulate with another --seed and --prefix), or pass another --train-seed"
            )
        if missing:
            train = simulate(_sim_config(args, "train-"))
            seconds["simulate"] = round(time.perf_counter() - t0, 2)
            t1 = time.perf_counter()
            models.update(
                fit_models(train, horizon_s=horizon, which=missing, lstm_config=_lstm_config(args, horizon))
            )
            seconds["fit"] = round(time.perf_counter() - t1, 2)
    except (ValueError, FileNotFoundError) as exc:
        return _fail("evaluate", exc)
    t2 = time.perf_counter()
    results = evaluate_models(models, held_out)
    precise = evaluate_precise(models, held_out)
    seconds["evaluate"] = round(time.perf_counter() - t2, 2)
    seconds["total"] = round(time.perf_counter() - t0, 2)
    doc = report(models, results, held_out, precise)
    doc["seconds"] = seconds
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(
        f"{'model':9s} {'precision':>9s} {'recall':>7s} {'F1':>6s} {'lead (median)':>14s} "
        f"{'false alarms/node-day':>22s} {'threshold':>10s}"
    )
    rows = []
    for name, row in doc["models"].items():
        rows.append((name, row))
        point = row.get("at_precision_target")
        if point is not None and "absent" not in point:
            rows.append((f"{name}@p{point['target'] * 100:.0f}", point))
    for name, row in rows:
        lead = f"{row['lead_time_s_median']:.0f} s" if row["lead_time_s_median"] is not None else "-"
        print(
            f"{name:9s} {row['precision']:9.3f} {row['recall']:7.3f} {row['f1']:6.3f} {lead:>14s} "
            f"{row['false_alarms_per_node_day']:22.3f} {row['threshold']:10.4g}"
        )
    for name, row in doc["models"].items():
        point = row.get("at_precision_target")
        if point is not None and "absent" in point:
            print(f"{name}: {point['absent']}")
    print("(<model>@p84: the operating point tuned on validation for precision >= 0.84, measured here)")
    rescaled = {
        k: r["precision_at_table5_rate"] for k, r in doc["models"].items() if "precision_at_table5_rate" in r
    }
    if rescaled:
        shown = ", ".join(f"{k} {v:.3f}" for k, v in rescaled.items())
        print(f"precision at Llama 3's failure rate (same recall, same false alarms per node-day): {shown}")
    anchor = doc["anchor"]
    beaten = (
        ", ".join(
            f"{k} ({'F1 point' if at == 'f1' else 'precision-target point'})"
            for k, at in anchor["beaten_at"].items()
        )
        or "no model"
    )
    print(f"anchor: precision {anchor['precision']:.2f} ({anchor['source']}): beaten by {beaten}")
    print(f"data: {doc['data']}")
    print(f"time: {seconds['total']} s")
    return 0


def detect_command(args) -> int:
    import numpy as np

    from workers.reliability.risk.evaluate import load_model

    try:
        model = load_model(args.model)
        traces = _load_source(args, need_incidents=False)
        if traces is None:
            raise _Invalid("give the traces to score: --traces FILE.npz or --prometheus DUMP")
        if args.threshold is not None and not 0 <= args.threshold <= 1:
            raise _Invalid(f"--threshold is a risk in [0, 1], got {args.threshold}")
    except (ValueError, FileNotFoundError) as exc:
        return _fail("detect", exc)
    threshold = model.threshold if args.threshold is None else args.threshold
    rows = []
    for t in traces.traces:
        if len(t) == 0:
            continue
        risk = model.risk(t)
        recent = t.times >= t.times[-1] - model.horizon_s
        rows.append(
            {
                "node": t.node,
                "risk": round(float(risk[-1]), 4),
                "risk_max_horizon": round(float(np.max(risk[recent])), 4),
                "time_unix_s": float(t.times[-1]),
                "at_risk": bool(risk[-1] >= threshold),
            }
        )
    rows.sort(key=lambda r: -r["risk"])
    doc = {
        "model": model.name,
        "trained_on": model.trained_on_text,
        "threshold": threshold,
        "horizon_s": model.horizon_s,
        "at_risk": [r["node"] for r in rows if r["at_risk"]],
        "nodes": rows,
    }
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    if not doc["at_risk"]:
        print(f"no node at risk (threshold {threshold:.4g}, {len(rows)} nodes scored)")
    for r in rows:
        if r["at_risk"]:
            print(
                f"{r['node']}: risk {r['risk']:.3f} of failing within {model.horizon_s:g} s "
                f"(max over the last horizon {r['risk_max_horizon']:.3f})"
            )
    print(f"model: {model.name}, trained on {model.trained_on_text}")
    return 0
