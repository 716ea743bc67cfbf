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

The rooms: :mod:`~.inputs` (exit codes, input errors), :mod:`~.jobs` (submitting and following a job, its
report), :mod:`~.scheduling` (``green schedule``), :mod:`~.powercap_advice` (``green powercap``); this
module registers their flags.
"""

from __future__ import annotations

import os

from workers.green.cli.inputs import EXIT_INVALID, EXIT_NO_ROOM, EXIT_OK, InputError, read_json
from workers.green.cli.jobs import green_command, report_command
from workers.green.cli.powercap_advice import first_plan, format_powercap, powercap_command
from workers.green.cli.scheduling import (
    INTENSITY_COLUMNS,
    PRICE_COLUMNS,
    TIME_COLUMNS,
    format_schedule,
    read_forecast_csv,
    read_step_csv,
    schedule_command,
)


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


__all__ = [
    "EXIT_INVALID",
    "EXIT_NO_ROOM",
    "EXIT_OK",
    "INTENSITY_COLUMNS",
    "PRICE_COLUMNS",
    "TIME_COLUMNS",
    "InputError",
    "first_plan",
    "format_powercap",
    "format_schedule",
    "green_command",
    "powercap_command",
    "read_forecast_csv",
    "read_json",
    "read_step_csv",
    "register",
    "report_command",
    "schedule_command",
]
