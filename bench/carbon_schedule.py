"""Carbon-aware scheduling benchmark (issue 13): what the scheduler saves vs starting now, every day of 2020,
on the shipped measured series of Great Britain (30 min) and Germany (15 min).

    .venv/bin/python bench/carbon_schedule.py [--arrival-hour 9] [--zones GB,DE] [--json [out.json]]

Job mix (stated, not drawn): one job arrives at 09:00 UTC on each of the 366 days of 2020, for every
duration in 1, 4, 8, 24 h x deadline (finish by arrival + 24, 48, 72 h) x contiguous or interruptible
(resumes from snapshots, no restart overhead modelled), at a constant 1 kW and PUE 1 (the saving in percent
does not depend on the power or the PUE). Baseline: start at arrival and run without a break (carbon
agnostic). The series is used as a perfect forecast (history as an oracle): real forecasts have errors, so
these savings are upper bounds for this job mix.

Published anchors, printed beside the table: they come from different settings and are context, not
targets this bench must meet.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from harness import bench_parser

from workers.green.history import load_history
from workers.green.schedule import schedule

DURATIONS_H = (1, 4, 8, 24)
DEADLINES_H = (24, 48, 72)
DAYS_2020 = 366
ANCHORS = (
    (
        "Wiesner et al., Let's Wait Awhile, Middleware '21 (doi:10.1145/3464298.3493399)",
        "up to ~19 % for interruptible jobs",
        "their scenario II, where the interruptible jobs are (dos-group/lets-wait-awhile simulate.py): "
        "3,387 ML jobs of 4-90 h arriving on workdays 09:00-17:00 of 2020, allowed to finish as late as the "
        "next workday or the next Monday/Thursday 09:00, with 0-10 % forecast error; the same GB/DE data "
        "plus FR and California",
    ),
    (
        "Hanafy et al., CarbonScaler, 2023 (arXiv:2302.08681; SIGMETRICS '24)",
        "51 % vs carbon-agnostic",
        "a different setting: elastic jobs that scale their number of servers with the carbon intensity "
        "(not a fixed-power job choosing its start or slots)",
    ),
)


def run(zones: list[str], arrival_hour: int) -> dict:
    rows = []
    for zone in zones:
        series = load_history(zone)
        for duration_h in DURATIONS_H:
            for deadline_h in DEADLINES_H:
                row = {"zone": zone, "duration_h": duration_h, "deadline_h": deadline_h}
                for interruptible in (False, True):
                    savings = []
                    for day in range(DAYS_2020):
                        now = datetime(2020, 1, 1, arrival_hour, tzinfo=UTC) + timedelta(days=day)
                        r = schedule(
                            series,
                            now=now,
                            duration=timedelta(hours=duration_h),
                            power_kw=1.0,
                            deadline=timedelta(hours=deadline_h),
                            interruptible=interruptible,
                        )
                        savings.append(r.saving_pct)
                    key = "interruptible" if interruptible else "contiguous"
                    row[key] = {
                        "mean_pct": statistics.fmean(savings),
                        "median_pct": statistics.median(savings),
                        "p90_pct": statistics.quantiles(savings, n=10)[-1],
                        "days": len(savings),
                    }
                rows.append(row)
    return {
        "job_mix": {
            "arrival": f"{arrival_hour:02d}:00 UTC each day of 2020 ({DAYS_2020} days)",
            "durations_h": list(DURATIONS_H),
            "deadlines_h": list(DEADLINES_H),
            "power_kw": 1.0,
            "pue": 1.0,
            "baseline": "start at arrival, contiguous",
            "forecast": "the measured series itself (oracle): savings are upper bounds",
        },
        "series": {z: load_history(z).describe() for z in zones},
        "rows": rows,
        "anchors": [{"source": s, "figure": f, "setting": n} for s, f, n in ANCHORS],
    }


def format_report(report: dict, seconds: float) -> str:
    mix = report["job_mix"]
    lines = [
        f"job mix: arrives {mix['arrival']}; durations {mix['durations_h']} h x deadlines "
        f"{mix['deadlines_h']} h x contiguous | interruptible; 1 kW, PUE 1; baseline: {mix['baseline']}",
        f"forecast: {mix['forecast']}",
        "series: "
        + "; ".join(f"{z} {d['points']:,} points, {d['kind']}" for z, d in report["series"].items()),
        "",
        f"{'zone':<5}{'dur h':>6}{'ddl h':>6} | {'contiguous saving %':^26} | {'interruptible saving %':^26}",
        f"{'':<17} | {'mean':>8}{'median':>9}{'p90':>9} | {'mean':>8}{'median':>9}{'p90':>9}",
    ]
    for r in report["rows"]:
        c, i = r["contiguous"], r["interruptible"]
        lines.append(
            f"{r['zone']:<5}{r['duration_h']:>6}{r['deadline_h']:>6} | {c['mean_pct']:>8.1f}{c['median_pct']:>9.1f}"
            f"{c['p90_pct']:>9.1f} | {i['mean_pct']:>8.1f}{i['median_pct']:>9.1f}{i['p90_pct']:>9.1f}"
        )
    lines.append("")
    for zone in report["series"]:
        zr = [r for r in report["rows"] if r["zone"] == zone]
        c = statistics.fmean(r["contiguous"]["mean_pct"] for r in zr)
        i = statistics.fmean(r["interruptible"]["mean_pct"] for r in zr)
        best = max(r["interruptible"]["mean_pct"] for r in zr)
        lines.append(
            f"{zone}: mean over the mix {c:.1f} % contiguous, {i:.1f} % interruptible "
            f"(best class {best:.1f} % interruptible)"
        )
    lines += ["", "published anchors (different settings; context, not targets):"]
    for a in report["anchors"]:
        lines.append(f"  {a['figure']:<36} {a['source']}")
        lines.append(f"  {'':<36} {a['setting']}")
    n = sum(2 * r["contiguous"]["days"] for r in report["rows"])
    lines.append(f"\n{n:,} schedules in {seconds:.1f} s (exact search, every one)")
    return "\n".join(lines)


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--arrival-hour", type=int, default=9, help="UTC hour the daily job arrives (0-23)")
    parser.add_argument("--zones", default="GB,DE", help="comma-separated shipped zones (default GB,DE)")
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        help="print one JSON object instead of the table, or write it to a file",
    )
    args = parser.parse_args()
    if not 0 <= args.arrival_hour <= 23:
        parser.error("--arrival-hour must be 0-23")
    zones = [z.strip().upper() for z in args.zones.split(",") if z.strip()]
    t0 = time.perf_counter()
    try:
        report = run(zones, args.arrival_hour)
    except ValueError as exc:
        print(f"bench/carbon_schedule.py: {exc}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - t0
    report["seconds"] = seconds
    if args.json == "-":
        print(json.dumps(report, indent=1))
    else:
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))
        print(format_report(report, seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
