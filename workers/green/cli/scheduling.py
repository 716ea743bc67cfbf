"""``cann-train green schedule``: the least-carbon (or cost, or mixed) start or slots before a deadline,
from a forecast CSV or the shipped history, beside starting now, under an optional site power cap."""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from workers.green.cli.inputs import EXIT_INVALID, EXIT_NO_ROOM, EXIT_OK, InputError

TIME_COLUMNS = ("Time", "time", "datetime")
INTENSITY_COLUMNS = ("Carbon Intensity", "gco2_per_kwh", "carbon_intensity")
PRICE_COLUMNS = ("price_per_kwh", "price", "Price")


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
