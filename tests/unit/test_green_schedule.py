"""The carbon-aware scheduler: equal to brute force on both shipped 2020 series, its worked examples, its
errors, and `cann-train green schedule`.

Brute force, written apart from the scheduler: every breakpoint here (the series' 15/30 min steps, the
price steps, the reservations, ``now``) falls on a whole minute and every duration is whole minutes, so the
job's cost is constant over each minute of the window. The best contiguous window then starts on a whole
minute (its cost is piecewise linear in the start, kinks on whole minutes), so trying every minute is
exact; the best interruptible schedule is the cheapest ``duration`` minutes the cap allows.
"""

from __future__ import annotations

import bisect
import itertools
import json
import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from workers.cli import main
from workers.green.history import load_history
from workers.green.schedule import NoRoomError, PriceSeries, Reservation, schedule
from workers.green.series import IntensitySeries

ROOT = Path(__file__).resolve().parents[2]
YEAR_START = datetime(2020, 1, 1, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
REL = 1e-9


# --- brute force ---------------------------------------------------------------------------------------


def price_at(price: PriceSeries | None, t: datetime) -> float:
    if price is None:
        return 0.0
    if price.is_flat:
        return price.values[0]
    return price.values[bisect.bisect_right(price.times, t) - 1]


def minute_costs(series, job) -> tuple[list[float], list[bool]]:
    """The objective of running the job during each minute of the window, and whether the cap allows it."""
    now, grid_kw = job["now"], job["power_kw"] * job["pue"]
    costs, allowed = [], []
    for m in range(job["deadline"] // MINUTE):
        t = now + m * MINUTE
        kg = grid_kw * series.value_at(t) / 1000 / 60
        money = grid_kw * price_at(job["price"], t) / 60
        costs.append(
            {"carbon": kg, "cost": money, "mix": money + (job["carbon_price_per_t"] or 0) * kg / 1000}[
                job["objective"]
            ]
        )
        reserved = sum(r.kw for r in job["reservations"] if r.start <= t < r.end)
        allowed.append(job["power_cap_kw"] is None or reserved + job["power_kw"] <= job["power_cap_kw"])
    return costs, allowed


def brute_force(series, job) -> float | None:
    costs, allowed = minute_costs(series, job)
    d = job["duration"] // MINUTE
    if job["interruptible"]:
        usable = sorted(c for c, ok in zip(costs, allowed, strict=True) if ok)
        return sum(usable[:d]) if len(usable) >= d else None
    cost_prefix = [0.0, *itertools.accumulate(costs)]
    blocked_prefix = [0, *itertools.accumulate(0 if ok else 1 for ok in allowed)]
    best = None
    for s in range(len(costs) - d + 1):
        if blocked_prefix[s + d] == blocked_prefix[s]:
            c = cost_prefix[s + d] - cost_prefix[s]
            best = c if best is None else min(best, c)
    return best


# --- random jobs on the shipped series -----------------------------------------------------------------


@st.composite
def jobs(draw):
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    now = YEAR_START + draw(st.integers(0, 366 * 1440 - 1)) * MINUTE
    duration = draw(st.integers(30, 24 * 60))
    deadline = draw(st.integers(duration, 72 * 60))
    objective = draw(st.sampled_from(["carbon", "carbon", "cost", "mix"]))
    price = None
    if objective != "carbon" or draw(st.booleans()):
        if draw(st.booleans()):
            price = PriceSeries.flat(rng.uniform(0.05, 0.5), currency="EUR", source="test tariff")
        else:  # time-of-use steps on random whole minutes, from before now to past the deadline
            t, times, values = now - rng.randint(0, 600) * MINUTE, [], []
            while t < now + deadline * MINUTE:
                times.append(t)
                values.append(rng.choice([0.0, rng.uniform(0.05, 0.6)]))
                t += rng.randint(15, 600) * MINUTE
            price = PriceSeries(
                times=tuple(times), values=tuple(values), end=t, currency="EUR", source="test"
            )
    power_kw = draw(st.integers(1, 6))
    cap, reservations = None, []
    if draw(st.booleans()):
        cap = draw(st.integers(power_kw, 12))
        for i in range(rng.randint(1, 6)):
            start = now + rng.randint(-240, deadline) * MINUTE
            reservations.append(
                Reservation(start, start + rng.randint(15, 24 * 60) * MINUTE, rng.randint(1, 8), f"r{i}")
            )
    return {
        "now": now,
        "duration": duration * MINUTE,
        "deadline": deadline * MINUTE,
        "interruptible": draw(st.booleans()),
        "power_kw": float(power_kw),
        "pue": draw(st.sampled_from([1.0, 1.25])),
        "price": price,
        "objective": objective,
        "carbon_price_per_t": rng.uniform(0, 200) if objective == "mix" else None,
        "power_cap_kw": cap,
        "reservations": reservations,
    }


def check_equals_brute_force(series: IntensitySeries, job: dict) -> None:
    expected = brute_force(series, job)
    kind = "interruptible" if job["interruptible"] else "contiguous"
    event(
        f"{kind}, {job['objective']}, price {'none' if job['price'] is None else job['price'].describe()['kind']}"
    )
    event(f"cap: {'none' if job['power_cap_kw'] is None else 'no room' if expected is None else 'fits'}")
    if expected is None:
        with pytest.raises(NoRoomError):
            schedule(series, **job)
        return
    got = schedule(series, **job)
    assert got.objective_value == pytest.approx(expected, rel=REL, abs=1e-12)
    # the answer is a real schedule: inside the window, the right length, allowed by the cap
    assert job["now"] <= got.start == got.slots[0][0] and got.slots[-1][1] <= job["now"] + job["deadline"]
    assert sum((b - a for a, b in got.slots), timedelta(0)) == job["duration"]
    assert all(a < b for a, b in got.slots) and all(b < c for (_, b), (c, _) in itertools.pairwise(got.slots))
    if not job["interruptible"]:
        assert len(got.slots) == 1
    _, allowed = minute_costs(series, job)
    for a, b in got.slots:
        first, last = (a - job["now"]) // MINUTE, -((job["now"] - b) // MINUTE)
        assert all(allowed[first:last])
    if job["objective"] == "carbon" and got.now_fits_cap:
        assert got.kgco2e <= got.kgco2e_now * (1 + REL)


SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(job=jobs())
def test_scheduler_equals_brute_force_on_gb_2020(job):
    check_equals_brute_force(load_history("GB"), job)


@SETTINGS
@given(job=jobs())
def test_scheduler_equals_brute_force_on_de_2020(job):
    check_equals_brute_force(load_history("DE"), job)


# --- worked examples -----------------------------------------------------------------------------------

T0 = datetime(2030, 1, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


def hourly(*values: float, kind: str = "forecast") -> IntensitySeries:
    return IntensitySeries(
        provider="csv",
        zone="test",
        kind=kind,
        times=tuple(T0 + i * HOUR for i in range(len(values))),
        values=values,
        source="test",
    )


def test_contiguous_optimum_may_end_on_a_breakpoint_and_start_between_two():
    # windows of 1.5 h over 100, 50, 10, 80 g/kWh: [1.5 h, 3 h) emits 0.5*50 + 10 = 35 g per kW
    r = schedule(hourly(100, 50, 10, 80), now=T0, duration=1.5 * HOUR, power_kw=2, deadline=4 * HOUR)
    assert r.slots == ((T0 + 1.5 * HOUR, T0 + 3 * HOUR),)
    assert r.kgco2e == pytest.approx(2 * 35 / 1000)
    assert r.kgco2e_now == pytest.approx(2 * (100 + 25) / 1000)
    assert r.saving_pct == pytest.approx(100 * (125 - 35) / 125)


def test_interruptible_job_takes_the_cheapest_pieces_and_the_last_in_part():
    s = hourly(10, 90, 20, 80)
    one = schedule(s, now=T0, duration=1.5 * HOUR, power_kw=1, deadline=4 * HOUR)
    assert one.slots == ((T0, T0 + 1.5 * HOUR),) and one.kgco2e == pytest.approx(0.055)
    split = schedule(s, now=T0, duration=1.5 * HOUR, power_kw=1, deadline=4 * HOUR, interruptible=True)
    assert split.slots == ((T0, T0 + HOUR), (T0 + 2 * HOUR, T0 + 2.5 * HOUR))
    assert split.kgco2e == pytest.approx(0.020) and split.start == T0


def test_pue_scales_emissions_and_energy():
    s = hourly(100, 100)
    r = schedule(s, now=T0, duration=HOUR, power_kw=3, deadline=2 * HOUR, pue=1.5)
    assert r.energy_kwh == pytest.approx(4.5) and r.kgco2e == pytest.approx(0.45)


def test_the_cap_moves_the_job_off_the_reserved_hours():
    s = hourly(10, 20, 90, 40)
    busy = [Reservation(T0, T0 + HOUR, 6.0, "other job")]
    r = schedule(s, now=T0, duration=HOUR, power_kw=5, deadline=4 * HOUR, power_cap_kw=10, reservations=busy)
    assert r.slots == ((T0 + HOUR, T0 + 2 * HOUR),) and not r.now_fits_cap
    assert r.kgco2e_now == pytest.approx(0.05)  # the baseline is still starting now


def test_cost_and_mix_objectives_follow_a_time_of_use_price():
    s = hourly(100, 300, 100, 300)
    tou = PriceSeries(times=(T0, T0 + 2 * HOUR), values=(0.40, 0.10), end=T0 + 4 * HOUR, currency="EUR")
    cheap = schedule(s, now=T0, duration=HOUR, power_kw=10, deadline=4 * HOUR, price=tou, objective="cost")
    assert cheap.start == T0 + 2 * HOUR and cheap.cost == pytest.approx(1.0)  # 10 kWh x 0.10, earliest tie
    assert cheap.cost_now == pytest.approx(4.0)
    # mix with 1000 EUR/t: 100 g/kWh adds 0.10 EUR/kWh, 300 g adds 0.30 -> hour 2 (0.20) beats hour 3 (0.40)
    mix = schedule(
        s,
        now=T0,
        duration=HOUR,
        power_kw=10,
        deadline=4 * HOUR,
        price=tou,
        objective="mix",
        carbon_price_per_t=1000,
    )
    assert mix.start == T0 + 2 * HOUR and mix.objective_value == pytest.approx(1.0 + 1000 * 1.0 / 1000)


def test_history_is_labelled_as_used_as_a_forecast():
    r = schedule(load_history("GB"), now=YEAR_START, duration=HOUR, power_kw=1, deadline=6 * HOUR)
    d = r.to_dict()
    assert d["history_used_as_forecast"] is True and d["intensity"]["kind"] == "history"
    assert "Wiesner" in d["intensity"]["source"]
    assert {"start", "slots", "kgco2e", "kgco2e_now", "saving_pct", "cost", "cost_now"} <= set(d)


# --- errors a person can act on --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"deadline": HOUR}, "shorter than the job"),
        ({"deadline": 10 * HOUR}, "not the whole window"),
        ({"now": T0 - HOUR}, "not the whole window"),
        ({"power_kw": 0.0}, "power must be > 0"),
        ({"duration": timedelta(0)}, "duration must be > 0"),
        ({"pue": 0.9}, "PUE"),
        ({"objective": "cost"}, "needs an electricity price"),
        ({"objective": "mix", "price": PriceSeries.flat(0.2)}, "carbon price"),
        ({"carbon_price_per_t": 50.0}, "only enters objective 'mix'"),
        ({"power_cap_kw": 1.0}, "more than the site cap"),
        ({"reservations": [Reservation(T0, T0 + HOUR, 1.0)]}, "under a site power cap"),
    ],
)
def test_bad_input_says_what_to_change(change, message):
    job = dict(now=T0, duration=2 * HOUR, power_kw=2.0, deadline=4 * HOUR) | change
    with pytest.raises(ValueError, match=message):
        schedule(hourly(1, 2, 3, 4), **job)


def test_a_full_site_is_no_room_and_says_so():
    full = [Reservation(T0 + HOUR, T0 + 2 * HOUR, 9.0)]
    job = dict(
        now=T0, duration=2 * HOUR, power_kw=2.0, deadline=3 * HOUR, power_cap_kw=10.0, reservations=full
    )
    with pytest.raises(NoRoomError, match="allow interruption"):
        schedule(hourly(1, 2, 3), **job)
    r = schedule(hourly(1, 2, 3), **(job | {"interruptible": True}))  # around the reservation
    assert r.slots == ((T0, T0 + HOUR), (T0 + 2 * HOUR, T0 + 3 * HOUR))
    with pytest.raises(NoRoomError, match="leaves no room"):
        schedule(hourly(1, 2, 3), **(job | {"interruptible": True, "duration": 2.5 * HOUR}))


# --- cann-train green schedule ---------------------------------------------------------------------------


def forecast_csv(tmp_path, rows, header="time,gco2_per_kwh", name="f.csv"):
    p = tmp_path / name
    p.write_text(header + "\n" + "\n".join(rows) + "\n")
    return str(p)


HISTORY_ROWS = ["2030-01-01T00:00:00,100", "2030-01-01T01:00:00,50", "2030-01-01T02:00:00,10"]
HISTORY_ROWS.append("2030-01-01T03:00:00,80")


def test_cli_json_has_the_documented_shape(tmp_path, capsys):
    f = forecast_csv(tmp_path, HISTORY_ROWS)
    argv = ["green", "schedule", "--forecast", f, "--now", "2030-01-01T00:00", "--duration-h", "1.5"]
    assert main([*argv, "--power-kw", "2", "--deadline-h", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"start", "slots", "kgco2e", "kgco2e_now", "saving_pct"} <= set(out)
    assert out["slots"] == [["2030-01-01T01:30:00+00:00", "2030-01-01T03:00:00+00:00"]]
    assert out["kgco2e"] == pytest.approx(0.07) and out["intensity"]["provider"] == "csv"


def test_cli_now_defaults_to_the_first_timestamp_of_a_history_file(tmp_path, capsys):
    f = forecast_csv(
        tmp_path, ["2020-01-01 00:00:00,100", "2020-01-01 00:30:00,5", "2020-01-01 01:00:00,100"]
    )
    argv = [
        "green",
        "schedule",
        "--forecast",
        f,
        "--duration-h",
        "0.5",
        "--power-kw",
        "1",
        "--deadline-h",
        "1.5",
    ]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["now"] == "2020-01-01T00:00:00+00:00" and out["start"] == "2020-01-01T00:30:00+00:00"
    assert out["history_used_as_forecast"] is True and "first timestamp" in out["now_source"]


def test_cli_human_output_is_a_short_table(capsys):
    argv = ["green", "schedule", "--zone", "gb", "--now", "2020-06-01T09:00", "--duration-h", "4"]
    assert (
        main([*argv, "--power-kw", "10", "--deadline-h", "48", "--interruptible", "--price-per-kwh", "0.2"])
        == 0
    )
    out = capsys.readouterr().out
    assert "scheduled" in out and "start now" in out and "saving vs start now" in out
    assert "history used as a forecast" in out and "slots" in out


@pytest.mark.parametrize(
    ("rows", "extra", "message"),
    [
        (["2030-01-01T00:00,100", "yesterday,50"], [], "line 3: 'yesterday' is not an ISO 8601 time"),
        (["2030-01-01T00:00,100", "2030-01-01T01:00,-5"], [], "line 3: carbon intensity"),
        (["2030-01-01T01:00,100", "2030-01-01T00:00,50"], [], "line 3:"),
        (HISTORY_ROWS, ["--deadline-h", "1"], "shorter than the job"),
        (HISTORY_ROWS, ["--deadline-h", "4", "--objective", "cost"], "--price-per-kwh or --price-csv"),
        (HISTORY_ROWS, ["--deadline-h", "4", "--now", "soon"], "--now: 'soon'"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys, rows, extra, message):
    f = forecast_csv(tmp_path, rows)
    argv = ["green", "schedule", "--forecast", f, "--duration-h", "2", "--power-kw", "1"]
    argv += extra if "--deadline-h" in extra else ["--deadline-h", "3", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.count("\n") == 0
        and err.startswith("cann-train green schedule: invalid input:")
        and message in err
    )


def test_cli_a_missing_column_is_named(tmp_path, capsys):
    f = forecast_csv(tmp_path, ["2030-01-01T00:00,1"], header="when,co2")
    assert (
        main(
            [
                "green",
                "schedule",
                "--forecast",
                f,
                "--duration-h",
                "1",
                "--power-kw",
                "1",
                "--deadline-h",
                "1",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "line 1: no column for the time (Time, time, datetime); the header has: when, co2" in err


def test_cli_runs_as_a_module_and_a_full_site_exits_3(tmp_path):
    f = forecast_csv(tmp_path, HISTORY_ROWS)
    cmd = [
        sys.executable,
        "-m",
        "workers.cli",
        "green",
        "schedule",
        "--forecast",
        f,
        "--now",
        "2030-01-01T00:00",
    ]
    cmd += ["--duration-h", "2", "--power-kw", "5", "--deadline-h", "3", "--site-cap-kw", "10"]
    ok = subprocess.run([*cmd, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["power_cap_kw"] == 10
    full = subprocess.run(
        [*cmd, "--reserved", "2030-01-01T01:00,2030-01-01T02:00,6"], cwd=ROOT, capture_output=True, text=True
    )
    assert full.returncode == 3 and "nothing fits" in full.stderr


def test_cli_cost_objective_reads_a_time_of_use_price_csv(tmp_path, capsys):
    f = forecast_csv(tmp_path, HISTORY_ROWS)
    tariff = forecast_csv(
        tmp_path,
        ["2030-01-01T00:00,0.40", "2030-01-01T02:00,0.10"],
        header="time,price_per_kwh",
        name="p.csv",
    )
    argv = ["green", "schedule", "--forecast", f, "--now", "2030-01-01T00:00", "--duration-h", "1"]
    argv += ["--power-kw", "10", "--deadline-h", "4", "--objective", "cost", "--price-csv", tariff, "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["start"] == "2030-01-01T02:00:00+00:00" and out["cost"] == pytest.approx(1.0)
    assert out["cost_now"] == pytest.approx(4.0) and out["price"]["kind"] == "time-of-use"


def test_on_a_clean_plateau_the_earliest_start_wins_whatever_the_clock_reads():
    """Every start inside a clean hour emits the same; rounding must not send the job to the plateau's last
    start. A bare argmin did for 105 of 400 random clocks (a job waiting 45 min for nothing)."""
    rng = random.Random(0)
    for _ in range(200):
        now = datetime(2026, 12, 2, tzinfo=UTC) + timedelta(
            seconds=rng.randrange(86_400), microseconds=rng.randrange(10**6)
        )
        clean = now.replace(microsecond=0) + timedelta(seconds=15)
        s = IntensitySeries(times=(clean - timedelta(hours=1), clean, clean + HOUR), values=(400.0, 40.0, 400.0),
                            zone="GB", provider="forecast", kind="forecast", source="a step series")  # fmt: skip
        r = schedule(s, now=now, duration=0.25 * HOUR, power_kw=0.1, deadline=HOUR)
        assert r.slots[0][0] == clean, (now, r.slots)
