"""``cann-train green powercap``: power-limit advice from a plan (a labelled model) or from measurements of a
GEMM loop under each limit (NVML), printed as text or JSON; nothing here applies a limit."""

from __future__ import annotations

import argparse
import json
import math
import sys

from workers.green.cli.inputs import EXIT_INVALID, EXIT_OK, InputError, read_json


def powercap_command(args: argparse.Namespace) -> int:
    """``cann-train green powercap``: power-limit advice from a plan (model) or from measurements (NVML)."""
    prog = "cann-train green powercap"
    try:
        eta = _fraction(args.eta, "--eta")
        max_slowdown = None
        if args.max_slowdown_pct is not None:
            if not math.isfinite(args.max_slowdown_pct) or args.max_slowdown_pct < 0:
                raise InputError(f"--max-slowdown-pct must be a percentage >= 0, got {args.max_slowdown_pct}")
            max_slowdown = args.max_slowdown_pct / 100.0
        if args.steps is not None and args.steps < 1:
            raise InputError(f"--steps must be >= 1, got {args.steps}")
        if args.profile:
            if args.cluster or args.tdp_watts is not None:
                raise InputError(
                    "--cluster and --tdp-watts describe a plan: they go with --plan, not --profile"
                )
            return _powercap_profile(args, eta, max_slowdown, prog)
        if args.limits is not None or args.seconds is not None or args.device_index is not None:
            raise InputError("--limits, --seconds and --device-index go with --profile, not --plan")
        advice = _powercap_plan(args, eta, max_slowdown)
    except ValueError as exc:  # InputError and the engine's own checks
        print(f"{prog}: invalid input: {exc}", file=sys.stderr)
        return EXIT_INVALID
    _print_advice(advice, args.json)
    return EXIT_OK


def _fraction(value: float, flag: str) -> float:
    if value is None or not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise InputError(f"{flag} must be in [0, 1] (0 = fastest, 1 = least energy), got {value}")
    return value


def first_plan(doc, path: str) -> dict:
    """The plan to advise on: a plan.json itself, the best plan of ``cann-train strategy --json`` output (else
    its first ``top``), or the first of a list of plans."""
    if isinstance(doc, list):
        plan = doc[0] if doc else None
    elif isinstance(doc, dict) and "predicted" not in doc and ("best" in doc or "top" in doc):
        plan = doc.get("best") or next(iter(doc.get("top") or []), None)
        if plan is None:
            raise InputError(f"--plan: {path} is a search result with no feasible plan (best is null)")
    else:
        plan = doc
    if not isinstance(plan, dict) or not isinstance(plan.get("predicted"), dict):
        raise InputError(
            f"--plan: {path} is not a plan: expected a plan.json (strategy + predicted), the output of "
            "`cann-train strategy --json` (best/top), or a list of plans"
        )
    if plan.get("feasible") is False:
        raise InputError(f"--plan: the plan is infeasible ({plan.get('reason') or 'no reason given'})")
    return plan


def _powercap_plan(args: argparse.Namespace, eta: float, max_slowdown: float | None):
    from workers.green.powercap import power_control_status, predict_powercap

    plan = first_plan(read_json(args.plan, "--plan"), args.plan)
    predicted = plan["predicted"]
    energy_inputs = (predicted.get("energy") or {}).get("inputs") or {}
    name = (predicted.get("efficiency_profile") or {}).get("name", "")
    tdp, source, idle, idle_source = None, "", None, None
    if args.cluster:
        from workers.planner.energy import device_power_profile
        from workers.planner.specs import ClusterSpec

        doc = read_json(args.cluster, "--cluster")
        if not isinstance(doc, dict):
            raise InputError(f"--cluster: {args.cluster} is not a cluster.json object")
        cluster = ClusterSpec.from_dict(doc)  # SpecError (a ValueError) names the field
        name = cluster.device.name
        power = device_power_profile(cluster) or {}
        tdp, source = power.get("tdp_watts"), f"{args.cluster}: {power.get('tdp_source', '')}"
        idle, idle_source = power.get("idle_watts"), power.get("idle_source")
    elif energy_inputs.get("tdp_watts") is not None:
        tdp = energy_inputs["tdp_watts"]
        source = f"the plan's predicted energy block ({energy_inputs.get('tdp_source', 'its tdp_source')})"
    if args.tdp_watts is not None:
        if not math.isfinite(args.tdp_watts) or args.tdp_watts <= 0:
            raise InputError(f"--tdp-watts must be a number of watts > 0, got {args.tdp_watts}")
        tdp, source = args.tdp_watts, "--tdp-watts"
    if tdp is None:
        raise InputError(
            f"--plan: {args.plan} carries no device power (no predicted energy block): pass --cluster C.json "
            "(its device.tdp_watts) or --tdp-watts W"
        )
    return predict_powercap(
        plan,
        tdp_watts=tdp,
        tdp_source=source,
        device_name=name,
        eta=eta,
        max_slowdown=max_slowdown,
        steps=args.steps,
        idle_watts=idle,
        idle_source=idle_source,
        measured_status=power_control_status(),
    )


def _parse_limits(text: str) -> list[float]:
    limits = []
    for part in text.split(","):
        try:
            w = float(part)
        except ValueError:
            raise InputError(
                f"--limits: {part.strip()!r} is not a number of watts (e.g. 300,250,200)"
            ) from None
        if not math.isfinite(w) or w <= 0:
            raise InputError(f"--limits: {part.strip()!r} is not a power limit > 0 W")
        limits.append(w)
    return limits


def _powercap_profile(args: argparse.Namespace, eta: float, max_slowdown: float | None, prog: str) -> int:
    """Measure, restore, advise; exit 2 with every reason where this machine cannot."""
    from workers.green.power import SourceUnavailable
    from workers.green.powercap import NvmlPowerLimit, advise, gemm_workload, power_control_status

    index = 0 if args.device_index is None else args.device_index
    seconds = 5.0 if args.seconds is None else args.seconds
    if index < 0:
        raise InputError(f"--device-index must be a CUDA ordinal >= 0, got {index}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise InputError(f"--seconds must be > 0, got {seconds}")
    limits = _parse_limits(args.limits) if args.limits else None
    status = power_control_status()
    import torch

    reasons = []
    if not torch.cuda.is_available():
        reasons.append(f"no CUDA device visible to torch {torch.__version__}")
    if not status["nvml"]["available"]:
        reasons.append(f"NVML: {status['nvml']['why']}")
    if reasons:
        reasons.append(f"cpufreq: {status['cpufreq']['why']}")
        print(
            f"{prog}: cannot profile here: {'; '.join(reasons)}. No power limit was changed; no measured advice "
            "exists on this machine (model-based advice needs no device: --plan P.json)",
            file=sys.stderr,
        )
        return EXIT_INVALID
    try:
        with NvmlPowerLimit(index) as gpu:
            bounds = gpu.limits()
            if limits is None:
                span = bounds.default_w - bounds.min_w
                limits = sorted({round(bounds.default_w - k * span / 4) for k in range(5)}, reverse=True)
            run = gemm_workload(seconds, device_index=index)
            profile = gpu.profile(run, limits, warmup=lambda: run(min(1.0, seconds)))
    except SourceUnavailable as exc:
        print(f"{prog}: cannot profile here: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except RuntimeError as exc:  # the limit could not be restored: say so loudly
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    advice = advise(profile, eta, max_slowdown, steps=args.steps, device_index=index)
    advice.sources.append(f"workload: {run.describe}, {seconds:g} s per limit after a warm-up")
    _print_advice(advice, args.json)
    return EXIT_OK


def _print_advice(advice, as_json: bool) -> None:
    d = advice.to_dict()
    print(json.dumps(d, indent=1) if as_json else format_powercap(d))


def format_powercap(d: dict) -> str:
    """The advice as a short text report (from its dict, so the text and ``--json`` agree)."""
    model = d["method"] == "model"
    label = "model: predicted from the plan, not measured" if model else "measured"
    limit = "" if d["max_slowdown_pct"] is None else f", at most {d['max_slowdown_pct']:g}% slower"
    who = f"{d['device'] or 'device'}" + (f" x {d['devices']}" if d["devices"] > 1 else "")
    b, r = d["baseline"], d["recommended"]
    lines = [
        f"power-cap advice for {who} ({label}); eta {d['eta']:g}{limit}",
        f"  baseline    {b['limit_w']:>5.0f} W: {b['step_time_s']:.4g} s/step, {b['energy_per_step_j']:.4g} J/step "
        f"per device ({b['avg_power_w']:.0f} W average)",
        f"  recommended {r['limit_w']:>5.0f} W: {r['step_time_s']:.4g} s/step ({d['slowdown_pct']:+.1f}% per step), "
        f"{r['energy_per_step_j']:.4g} J/step per device ({-d['energy_saving_pct']:+.1f}% energy)",
    ]
    job = d.get("job")
    if job:
        lines.append(
            f"  over {job['steps']} steps: {job['extra_time_s'] / 3600:+.3g} h ({job['baseline_time_s'] / 3600:.3g} h "
            f"-> {job['time_s'] / 3600:.3g} h, {job['slowdown_pct']:+.1f}%), {job['energy_saved_kwh']:.4g} kWh saved "
            f"of {job['baseline_energy_kwh']:.4g} kWh ({job['scope']})"
        )
    lines += [
        "",
        "  Pareto frontier (step time vs energy per step and device; * = recommended):",
        f"    {'limit W':>8}{'s/step':>10}{'slower %':>10}{'J/step':>10}{'saved %':>9}{'Zeus cost J':>13}",
    ]
    for p in d["frontier"]:
        mark = "*" if p["limit_w"] == r["limit_w"] else " "
        over = "" if p["within_max_slowdown"] else "  (over --max-slowdown-pct)"
        lines.append(
            f"  {mark} {p['limit_w']:>8.0f}{p['step_time_s']:>10.4g}{p['slowdown_pct']:>10.1f}"
            f"{p['energy_per_step_j']:>10.4g}{p['energy_saving_pct']:>9.1f}{p['zeus_cost_j']:>13.4g}{over}"
        )
    lines += ["", f"  {d['how_to_apply']}"]
    measured = d.get("measured")
    if measured and not measured["available"]:
        lines.append(f"  no measured advice here (no power control): {measured['why']}")
    elif measured:
        lines.append(f"  an NVIDIA GPU is here: {measured['why']}")
    a = d.get("anchor")
    if a and "model_slowdown_pct" in a:
        lines.append(
            f"  check: at {a['cap_share']:.0%} of TDP on a fully busy device the model says "
            f"{a['model_slowdown_pct']:+.1f}% time, {-a['model_energy_saving_pct']:+.1f}% energy; published: "
            f"{a['published']}"
        )
    if d["assumptions"]:
        lines += ["  assumptions:", *(f"    - {x}" for x in d["assumptions"])]
    if d["notes"]:
        lines += ["  notes:", *(f"    - {x}" for x in d["notes"])]
    lines += ["  sources:", *(f"    - {x}" for x in d["sources"])]
    return "\n".join(lines)
