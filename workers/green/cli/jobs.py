"""``cann-train green --job-file J.json`` (submit a job to the control plane, carbon-aware if asked, follow
its energy, fetch its report) and ``cann-train green report`` (a finished job's report), through the control
plane's API."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from workers.green.cli.inputs import EXIT_INVALID, EXIT_OK, InputError, read_json


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
        body = read_json(args.job_file, "--job-file")
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
