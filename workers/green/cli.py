"""``cann-train green``: green training from the command line.

``cann-train green --job-file J.json [--carbon-aware] [--energy-profiling] [--certification]``: submit a job
to the control plane (``POST /api/jobs/``; J.json is that request's body). ``--carbon-aware`` schedules it on
the least carbon before ``--deadline-h`` (the job waits in ``scheduled`` for its window; an interruptible one
pauses between slots); ``--energy-profiling`` follows it and prints its measured (or estimated, labelled)
energy, carbon and tokens/kWh as they arrive; ``--certification`` waits for it to succeed and writes its
energy and carbon report (PDF, with a verification code).

``cann-train green schedule``: when to run a job so that it emits the least carbon (or costs the least, or a
mix) before its deadline, from an uploaded forecast CSV or the shipped 2020 history of a zone, beside
starting now. ``green report --job ID`` writes a finished job's report; ``green powercap`` advises a device
power limit. Exit codes: 0 ok, 1 the job failed or the control plane could not answer, 2 invalid input (the
message says what to fix), 3 the site power cap leaves no room before the deadline.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

EXIT_OK, EXIT_INVALID, EXIT_NO_ROOM = 0, 2, 3

TIME_COLUMNS = ("Time", "time", "datetime")
INTENSITY_COLUMNS = ("Carbon Intensity", "gco2_per_kwh", "carbon_intensity")
PRICE_COLUMNS = ("price_per_kwh", "price", "Price")


class InputError(ValueError):
    """Bad command-line input; the message names the flag or the file and line."""


def register(subparsers) -> None:
    green = subparsers.add_parser(
        "green",
        help="green training: carbon-aware jobs, energy profiling, reports, schedules, power caps",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    _job_flags(green)
    green.set_defaults(func=green_command)
    sub = green.add_subparsers(dest="green_command", metavar="GREEN_COMMAND")
    s = sub.add_parser(
        "schedule",
        help="the least-carbon (or cost) start / slots before a deadline, beside starting now",
        description=__doc__.split("\n\n")[2].replace("\n", " "),
    )
    src = s.add_argument_group("carbon intensity (one of)").add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--forecast",
        metavar="F.csv",
        help="CSV with a time column (Time, time or datetime; naive times are UTC) and an intensity column "
        "in gCO2e/kWh (Carbon Intensity, gco2_per_kwh or carbon_intensity); each value holds until the next",
    )
    src.add_argument(
        "--zone",
        type=str.upper,
        choices=["GB", "DE"],
        help="use the shipped measured 2020 history of this zone instead (Wiesner et al. Middleware '21)",
    )
    job = s.add_argument_group("job")
    job.add_argument(
        "--now",
        help="ISO 8601 time the job is ready (naive = UTC); default: the current time, or the series' first "
        "timestamp when the series does not cover the current time (a history file)",
    )
    job.add_argument("--duration-h", type=float, required=True, help="predicted run time, hours")
    job.add_argument("--power-kw", type=float, required=True, help="average IT power of the job, kW")
    job.add_argument(
        "--deadline-h", type=float, required=True, help="the job must finish by now + this, hours"
    )
    job.add_argument(
        "--interruptible", action="store_true", help="the job resumes from snapshots: it may run in slots"
    )
    job.add_argument("--pue", type=float, default=1.0, help="facility power / IT power (default 1)")
    obj = s.add_argument_group("objective")
    obj.add_argument("--objective", choices=["carbon", "cost", "mix"], default="carbon")
    price = obj.add_mutually_exclusive_group()
    price.add_argument("--price-per-kwh", type=float, help="flat electricity price, currency per kWh")
    price.add_argument(
        "--price-csv",
        metavar="F.csv",
        help="time-of-use price: a time column and a price column (price_per_kwh, price or Price)",
    )
    obj.add_argument("--currency", default="", help="label for the price's currency (e.g. EUR)")
    obj.add_argument(
        "--carbon-price-per-t",
        type=float,
        help="internal carbon price for --objective mix, currency per tCO2e",
    )
    cap = s.add_argument_group("site power cap")
    cap.add_argument(
        "--site-cap-kw", type=float, help="power the site's scheduled jobs may draw together, kW"
    )
    cap.add_argument(
        "--reserved",
        action="append",
        default=[],
        metavar="START,END,KW",
        help="power already promised to a scheduled job (repeat the flag for each)",
    )
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=schedule_command)

    r = sub.add_parser(
        "report",
        help="write a finished job's energy and carbon report (PDF) from the control plane",
        description="Issue (or fetch) the energy and carbon report of a succeeded job from a cann-train control "
        "plane and write its PDF: POST /api/jobs/<id>/certificate/, then GET /api/certificates/<code>/pdf.",
    )
    r.add_argument("--job", type=int, required=True, help="the training job's id")
    _api_flags(r)
    r.add_argument("--out", help="the PDF to write (default: energy-report-job<ID>.pdf)")
    r.add_argument("--json", action="store_true", help="print the report's row (code, kWh, kgCO2e) as JSON")
    r.set_defaults(func=report_command)

    pc = sub.add_parser(
        "powercap",
        help="power-limit advice: the energy a lower limit saves and the time it costs (never applied)",
        description="Advise a device power limit by Zeus's energy-time cost (You et al. NSDI '23): from a plan's "
        "predicted step (--plan, a labelled model) or from measurements of a GEMM loop on this machine's GPU "
        "under each limit through NVML (--profile: needs CUDA, NVML and root; the limit is restored after). "
        "Nothing else ever changes a power limit: the advice says how to apply it yourself.",
    )
    mode = pc.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--plan",
        metavar="P.json",
        help="model-based advice for the plan's best (first) candidate: a plan.json, or the output of "
        "`cann-train strategy --json` (its best plan)",
    )
    mode.add_argument(
        "--profile",
        action="store_true",
        help="measure a GEMM loop on a CUDA GPU under each limit (NVML, root), restore the limit, advise",
    )
    pc.add_argument(
        "--eta",
        type=float,
        default=0.5,
        help="weight of energy against time in [0, 1]: 0 = fastest, 1 = least energy (default 0.5)",
    )
    pc.add_argument(
        "--max-slowdown-pct", type=float, help="at most this much slower per step than the default limit, %%"
    )
    pc.add_argument("--steps", type=int, help="the job's steps: adds its extra time and the energy it saves")
    plan = pc.add_argument_group("with --plan")
    plan.add_argument(
        "--cluster",
        metavar="C.json",
        help="the plan's cluster, for its device's name and tdp_watts (default: the plan's predicted energy block)",
    )
    plan.add_argument("--tdp-watts", type=float, help="the device's board power (default limit), W")
    prof = pc.add_argument_group("with --profile")
    prof.add_argument("--device-index", type=int, help="CUDA device to profile (default 0)")
    prof.add_argument(
        "--limits",
        metavar="W,W,...",
        help="limits to measure, W (default: the default limit and 4 more evenly down to the minimum)",
    )
    prof.add_argument(
        "--seconds", type=float, help="measured seconds per limit, after a 1 s warm-up (default 5)"
    )
    pc.add_argument("--json", action="store_true", help="print the advice as one JSON object")
    pc.set_defaults(func=powercap_command)


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


def _read_json(path: str, flag: str):
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{flag}: cannot read {path}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{flag}: {path} is not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None


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

    plan = first_plan(_read_json(args.plan, "--plan"), args.plan)
    predicted = plan["predicted"]
    energy_inputs = (predicted.get("energy") or {}).get("inputs") or {}
    name = (predicted.get("efficiency_profile") or {}).get("name", "")
    tdp, source, idle, idle_source = None, "", None, None
    if args.cluster:
        from workers.planner.energy import device_power_profile
        from workers.planner.specs import ClusterSpec

        doc = _read_json(args.cluster, "--cluster")
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


def _api_flags(parser) -> None:
    parser.add_argument(
        "--url",
        default=os.environ.get("CANN_TRAIN_URL", "http://127.0.0.1:8000"),
        help="the control plane (default: $CANN_TRAIN_URL, else http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("CANN_TRAIN_TOKEN"),
        help="an API token (default: $CANN_TRAIN_TOKEN; create one on the Tokens page)",
    )


def _job_flags(green) -> None:
    """The flags of ``cann-train green`` itself (no sub-command): submit a job, green."""
    g = green.add_argument_group("submit a job (no sub-command)")
    g.add_argument(
        "--job-file",
        metavar="J.json",
        help="the job to submit: the body of POST /api/jobs/ (plan_id, name, steps, snapshot_every, ...)",
    )
    g.add_argument(
        "--carbon-aware",
        action="store_true",
        help="start it on the least carbon before --deadline-h (it waits in 'scheduled' for its window)",
    )
    g.add_argument(
        "--energy-profiling",
        action="store_true",
        help="follow the job and print its energy, carbon and tokens/kWh as they are measured",
    )
    g.add_argument(
        "--certification",
        action="store_true",
        help="wait for the job to succeed and write its energy and carbon report (PDF, verification code)",
    )
    ca = green.add_argument_group("with --carbon-aware")
    ca.add_argument("--deadline-h", type=float, help="the job must finish by now + this, hours (required)")
    ca.add_argument(
        "--interruptible",
        action="store_true",
        help="it may run in several slots, pausing between them (the job needs snapshot_every > 0)",
    )
    ca.add_argument("--zone", help="grid zone (default: the job's energy zone)")
    ca.add_argument(
        "--forecast", metavar="F.csv", help="a carbon-intensity forecast (Time, Carbon Intensity columns)"
    )
    ca.add_argument("--duration-h", type=float, help="predicted run time (default: from the job's plan)")
    ca.add_argument("--power-kw", type=float, help="average IT power (default: from the job's plan)")
    ca.add_argument("--site-cap-kw", type=float, help="power the team's scheduled jobs may draw together, kW")
    f = green.add_argument_group("following the job")
    f.add_argument("--poll-s", type=float, default=2.0, help="seconds between looks at the job (default 2)")
    f.add_argument(
        "--wait-h",
        type=float,
        default=72.0,
        help="stop following after this many hours (the job goes on; default 72)",
    )
    f.add_argument("--out", help="the report PDF to write (default: energy-report-job<ID>.pdf)")
    _api_flags(green)
    green.add_argument("--json", action="store_true", help="print one JSON object at the end")


def _carbon_aware_body(args: argparse.Namespace) -> dict:
    if args.deadline_h is None:
        raise InputError("--carbon-aware needs --deadline-h: the job must finish by now + that many hours")
    body: dict = {
        "deadline_h": _positive(args.deadline_h, "--deadline-h"),
        "interruptible": args.interruptible,
    }
    if args.zone:
        body["zone"] = args.zone
    for flag, key in (("duration_h", "duration_h"), ("power_kw", "power_kw"), ("site_cap_kw", "site_cap_kw")):
        value = getattr(args, flag)
        if value is not None:
            body[key] = _positive(value, "--" + flag.replace("_", "-"))
    if args.forecast:
        try:
            body["forecast_csv"] = Path(args.forecast).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"--forecast {args.forecast}: cannot read it ({exc})") from None
    return body


def _positive(value: float, flag: str) -> float:
    if not (math.isfinite(value) and value > 0):
        raise InputError(f"{flag} must be a positive number, got {value}")
    return value


def _energy_line(progress: float, energy: dict) -> str:
    label = " (estimate)" if energy.get("estimate") else ""
    kg = "n/a" if energy.get("kgco2e") is None else f"{energy['kgco2e']:.6g} kgCO2e"
    tpk = "" if energy.get("tokens_per_kwh") is None else f", {energy['tokens_per_kwh']:.4g} tokens/kWh"
    return f"{100 * (progress or 0):5.1f}%: {energy['kwh']:.6g} kWh{label}, {kg}{tpk}, {energy.get('watts') or 0:.4g} W"


def green_command(args: argparse.Namespace) -> int:
    """``cann-train green [--carbon-aware] [--energy-profiling] [--certification] --job-file J.json``."""
    from workers.green.client import ApiError, ControlPlane

    prog = "cann-train green"
    if not args.job_file:
        what = [f for f in ("carbon_aware", "energy_profiling", "certification") if getattr(args, f)]
        hint = f" ({', '.join('--' + w.replace('_', '-') for w in what)} apply to a job)" if what else ""
        print(
            f"{prog}: invalid input: give --job-file J.json (a job to submit){hint}, or a sub-command: "
            "schedule, report, powercap (see --help)",
            file=sys.stderr,
        )
        return EXIT_INVALID
    try:
        body = _read_json(args.job_file, "--job-file")
        if not isinstance(body, dict):
            raise InputError(
                f"--job-file {args.job_file}: expected a JSON object (the body of POST /api/jobs/)"
            )
        if args.carbon_aware:
            if "carbon_aware" in body or body.get("green_schedule") is not None:
                raise InputError(
                    f"--job-file {args.job_file} already names a schedule (carbon_aware or green_schedule): "
                    "drop it or drop --carbon-aware"
                )
            body = {**body, "carbon_aware": _carbon_aware_body(args)}
        if args.poll_s <= 0 or args.wait_h <= 0:
            raise InputError("--poll-s and --wait-h must be positive")
        if not args.token:
            raise InputError("no API token: pass --token or set CANN_TRAIN_TOKEN")
    except InputError as exc:
        print(f"{prog}: invalid input: {exc}", file=sys.stderr)
        return EXIT_INVALID
    api = ControlPlane(args.url, args.token)
    out: dict = {}
    try:
        job = api.submit_job(body)
        out["job"] = {k: job.get(k) for k in ("id", "name", "state")}
        schedule = job.get("schedule")
        out["schedule"] = schedule
        if schedule:
            print(
                f"job {job['id']} scheduled in {schedule['zone']}: {len(schedule['slots'])} slot(s) from "
                f"{schedule['start']}, {schedule['kgco2e']:.4g} kgCO2e predicted vs {schedule['kgco2e_now']:.4g} "
                f"starting now ({schedule['saving_pct']:.1f}% less)",
                file=sys.stderr,
            )
        else:
            print(f"job {job['id']} submitted: {job['state']}", file=sys.stderr)
        if not (args.energy_profiling or args.certification):
            if args.json:
                print(json.dumps(out, indent=1))
            return EXIT_OK
        shown = None
        state = job["state"]
        for row in api.follow(job["id"], every_s=args.poll_s, timeout_s=args.wait_h * 3600):
            if row["state"] != state:
                state = row["state"]
                print(f"job {job['id']}: {state}", file=sys.stderr)
            energy = row.get("energy")
            if args.energy_profiling and energy and energy.get("kwh") is not None:
                key = (energy.get("kwh"), energy.get("tokens"))
                if key != shown:
                    shown = key
                    # with --json, stdout is the one JSON object: the live lines go beside it
                    print(
                        _energy_line(row.get("progress"), energy),
                        file=sys.stderr if args.json else sys.stdout,
                    )
            job = row
        out["job"]["state"] = job["state"]
        out["energy"] = job.get("energy")
        if job["state"] != "succeeded":
            why = job.get("human_readable_error") or (
                "still running when --wait-h ran out; it goes on"
                if job["state"] not in ("failed", "cancelled")
                else ""
            )
            print(f"{prog}: job {job['id']} {job['state']}{': ' + why if why else ''}", file=sys.stderr)
            if args.json:
                print(json.dumps(out, indent=1))
            return 1
        if args.certification:
            row, pdf, _ = api.report(job["id"])
            path = Path(args.out or f"energy-report-job{job['id']}.pdf")
            path.write_bytes(pdf)
            out["report"] = {**row, "file": str(path)}
            print(f"{path}: report {row['code']} (verify: {api.url}{row['verify_url']})", file=sys.stderr)
    except ApiError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_INVALID if 400 <= exc.status < 500 else 1
    if args.json:
        print(json.dumps(out, indent=1))
    return EXIT_OK


def report_command(args: argparse.Namespace) -> int:
    """``cann-train green report``: the report of a succeeded job, through the control plane's API (the
    engine holds no job: the control plane stored its measurements)."""
    from workers.green.client import ApiError, ControlPlane

    prog = "cann-train green report"
    if not args.token:
        print(f"{prog}: invalid input: no API token: pass --token or set CANN_TRAIN_TOKEN", file=sys.stderr)
        return EXIT_INVALID
    if args.job < 1:
        print(f"{prog}: invalid input: --job must be a job id >= 1, got {args.job}", file=sys.stderr)
        return EXIT_INVALID
    api = ControlPlane(args.url, args.token)
    try:
        row, pdf, issued = api.report(args.job)
    except ApiError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_INVALID if 400 <= exc.status < 500 else 1
    out = Path(args.out or f"energy-report-job{args.job}.pdf")
    out.write_bytes(pdf)
    if args.json:
        print(json.dumps({**row, "file": str(out), "issued": issued}, indent=1))
    else:
        label = " (estimate)" if row.get("estimate") else ""
        kg = "n/a" if row.get("kgco2e") is None else f"{row['kgco2e']:.6g} kgCO2e"
        print(
            f"{out}: job {args.job}, {row['kwh']:.6g} kWh{label}, {kg}; code {row['code']} "
            f"(verify: {api.url}{row['verify_url']})"
        )
    return EXIT_OK


def _parse_time(text: str, where: str) -> datetime:
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InputError(f"{where}: {text!r} is not an ISO 8601 time (e.g. 2020-06-01T09:00:00Z)") from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _parse_number(text: str, where: str, what: str) -> float:
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise InputError(f"{where}: {text!r} is not a number ({what})") from None
    if not math.isfinite(v) or v < 0:
        raise InputError(f"{where}: {what} must be a finite number >= 0, got {text!r}")
    return v


def read_step_csv(path: str, flag: str, value_columns: tuple[str, ...], what: str):
    """(times, values) from a CSV with a header naming a time column and one of ``value_columns``; naive
    times are UTC. Errors name the file and line. (Stand-in until ``workers.green.providers``'
    ``parse_forecast_csv`` replaces it.)"""
    p = Path(path)
    try:
        f = p.open(newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise InputError(f"{flag}: cannot read {path}: {exc.strerror or exc}") from None
    with f:
        reader = csv.DictReader(f)
        header = reader.fieldnames
        if not header:
            raise InputError(
                f"{flag}: {path} is empty; expected a header line with a time and a {what} column"
            )
        header = [h.strip() for h in header]
        reader.fieldnames = header
        time_col = next((c for c in TIME_COLUMNS if c in header), None)
        value_col = next((c for c in value_columns if c in header), None)
        if time_col is None or value_col is None:
            missing = (
                f"the time ({', '.join(TIME_COLUMNS)})"
                if time_col is None
                else f"the {what} ({', '.join(value_columns)})"
            )
            raise InputError(f"{path} line 1: no column for {missing}; the header has: {', '.join(header)}")
        times, values = [], []
        for row in reader:
            line = reader.line_num
            if not any((v or "").strip() for v in row.values() if isinstance(v, str)):
                continue  # a blank line
            t = _parse_time(row.get(time_col) or "", f"{path} line {line}")
            v = _parse_number(row.get(value_col), f"{path} line {line}", what)
            if times and t <= times[-1]:
                raise InputError(
                    f"{path} line {line}: {t.isoformat()} is not after the previous row's {times[-1].isoformat()}"
                    " (times must increase)"
                )
            times.append(t)
            values.append(v)
    if not times:
        raise InputError(f"{flag}: {path} has a header but no rows")
    return times, values


def read_forecast_csv(path: str, current: datetime):
    """An :class:`IntensitySeries` from an uploaded CSV: kind ``forecast`` when it reaches past the current
    time, else ``history`` (past figures used as a stand-in forecast)."""
    from workers.green.series import IntensitySeries

    times, values = read_step_csv(path, "--forecast", INTENSITY_COLUMNS, "carbon intensity (gCO2e/kWh)")
    series = IntensitySeries(
        provider="csv",
        zone="unknown",
        kind="forecast",
        times=tuple(times),
        values=tuple(values),
        source=f"uploaded CSV {Path(path).name}",
    )
    if series.end <= current:
        series = IntensitySeries(**{**series.__dict__, "kind": "history"})
    return series


def _read_reservation(text: str, index: int):
    from workers.green.schedule import Reservation

    parts = text.split(",")
    if len(parts) != 3:
        raise InputError(
            f"--reserved {text!r}: expected START,END,KW (e.g. 2020-06-01T00:00,2020-06-01T06:00,4)"
        )
    start = _parse_time(parts[0], "--reserved START")
    end = _parse_time(parts[1], "--reserved END")
    kw = _parse_number(parts[2], "--reserved KW", "reserved power in kW")
    if end <= start:
        raise InputError(f"--reserved {text!r}: END must be after START")
    return Reservation(start=start, end=end, kw=kw, label=f"#{index + 1}")


def _hours(value: float, flag: str, *, allow_zero: bool = False) -> timedelta:
    if value is None or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise InputError(f"{flag} must be a positive number of hours, got {value}")
    return timedelta(hours=value)


def _build(args: argparse.Namespace):
    from workers.green.history import load_history
    from workers.green.schedule import PriceSeries

    current = datetime.now(UTC)
    series = load_history(args.zone) if args.zone else read_forecast_csv(args.forecast, current)
    if args.now:
        now, now_source = _parse_time(args.now, "--now"), "--now"
    elif series.start <= current < series.end:
        now, now_source = current, "the current time"
    else:
        now, now_source = series.start, "the series' first timestamp (it does not cover the current time)"
    duration = _hours(args.duration_h, "--duration-h")
    deadline = _hours(args.deadline_h, "--deadline-h")
    for flag, v in (("--power-kw", args.power_kw), ("--pue", args.pue)):
        if not math.isfinite(v):
            raise InputError(f"{flag} must be a finite number, got {v}")
    price = None
    if args.price_per_kwh is not None:
        price = PriceSeries.flat(
            _parse_number(args.price_per_kwh, "--price-per-kwh", "price per kWh"), currency=args.currency
        )
    elif args.price_csv:
        times, values = read_step_csv(args.price_csv, "--price-csv", PRICE_COLUMNS, "price per kWh")
        price = PriceSeries(
            times=tuple(times),
            values=tuple(values),
            currency=args.currency,
            source=f"uploaded CSV {Path(args.price_csv).name}",
        )
    if args.objective in ("cost", "mix") and price is None:
        raise InputError(f"--objective {args.objective} needs --price-per-kwh or --price-csv")
    if args.objective == "mix" and args.carbon_price_per_t is None:
        raise InputError("--objective mix needs --carbon-price-per-t (currency per tCO2e)")
    if args.objective != "mix" and args.carbon_price_per_t is not None:
        raise InputError("--carbon-price-per-t only enters --objective mix")
    if args.reserved and args.site_cap_kw is None:
        raise InputError("--reserved only matters under a site cap: add --site-cap-kw")
    reservations = [_read_reservation(r, i) for i, r in enumerate(args.reserved)]
    kwargs = dict(
        now=now,
        duration=duration,
        power_kw=args.power_kw,
        deadline=deadline,
        interruptible=args.interruptible,
        pue=args.pue,
        price=price,
        objective=args.objective,
        carbon_price_per_t=args.carbon_price_per_t,
        power_cap_kw=args.site_cap_kw,
        reservations=reservations,
    )
    return series, kwargs, now_source


def schedule_command(args: argparse.Namespace) -> int:
    from workers.green.schedule import NoRoomError, schedule

    prog = "cann-train green schedule"
    try:
        series, kwargs, now_source = _build(args)
        result = schedule(series, **kwargs)
    except NoRoomError as exc:
        print(f"{prog}: nothing fits: {exc}", file=sys.stderr)
        return EXIT_NO_ROOM
    except ValueError as exc:  # InputError and the scheduler's own checks
        print(f"{prog}: invalid input: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if args.json:
        print(json.dumps({**result.to_dict(), "now_source": now_source}, indent=1))
    else:
        print(format_schedule(result, now_source))
    return EXIT_OK


def _t(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M UTC")


def format_schedule(r, now_source: str) -> str:
    d = r.to_dict()
    duration_h = d["duration_h"]
    cur = (r.price or {}).get("currency") or "cost"
    src = r.intensity
    lines = [
        f"job: {duration_h:g} h at {r.power_kw:g} kW x PUE {r.pue:g} = {r.energy_kwh:.3f} kWh, "
        f"ready {_t(r.now)} ({now_source}), finish by {_t(r.finish_by)}; objective: {r.objective}",
        f"intensity: {src['provider']} {src['zone']} "
        f"({'measured history used as a forecast' if r.history_used_as_forecast else src['kind']}), "
        f"{src['source']}",
        "",
        f"{'':11}{'start':<22}{'end':<22}{'kgCO2e':>10}{'g/kWh':>8}"
        + (f"{cur:>12}" if r.cost is not None else ""),
    ]

    def row(name, start, end, kg, cost):
        mean = 1000.0 * kg / r.energy_kwh
        tail = f"{cost:>12.2f}" if cost is not None else ""
        return f"{name:<11}{_t(start):<22}{_t(end):<22}{kg:>10.3f}{mean:>8.1f}{tail}"

    lines.append(row("scheduled", r.start, r.slots[-1][1], r.kgco2e, r.cost))
    run_time = sum((b - a for a, b in r.slots), timedelta(0))
    lines.append(row("start now", r.now, r.now + run_time, r.kgco2e_now, r.cost_now))
    saving = f"saving vs start now: {r.saving_pct:.1f} % ({r.kgco2e_now - r.kgco2e:.3f} kgCO2e)"
    if r.cost is not None:
        saving += f"; cost saved: {r.cost_now - r.cost:.2f} {(r.price or {}).get('currency', '')}".rstrip()
    lines += ["", saving]
    if not r.now_fits_cap:
        lines.append("note: starting now would exceed the site power cap")
    if len(r.slots) > 1:
        lines.append(f"{len(r.slots)} slots (resume from snapshots between them):")
        lines += [f"  {_t(a)} -> {_t(b)}  ({(b - a).total_seconds() / 3600:g} h)" for a, b in r.slots]
    return "\n".join(lines)
