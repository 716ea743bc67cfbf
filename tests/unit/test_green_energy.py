"""Energy accounting (workers/green/energy.py): exact arithmetic on small synthetic series and readings --
the carbon of an interval is the integral of the intensity over it, not one average; PUE, market-based
factors, SCI with and without embodied carbon, cost from flat and time-of-use prices, input validation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from workers.green.energy import (
    DEFAULT_PUE,
    PUE_SOURCE,
    EnergyAccount,
    Tariff,
    embodied_for,
)
from workers.green.history import load_history
from workers.green.power import PowerReading, select_meter
from workers.green.series import IntensitySeries

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MEASURED = {
    "method": "nvml",
    "measured": True,
    "estimated": [],
    "missing": [],
    "label": "measured: device (nvml)",
}
ESTIMATED = {
    "method": "estimate",
    "measured": False,
    "estimated": ["cpu", "memory"],
    "missing": [],
    "label": "estimate: cpu, memory (CodeCarbon-style, not measured)",
}


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def reading(minutes: float, device_j: float = 0.0, cpu_j: float = 0.0, memory_j: float = 0.0) -> PowerReading:
    return PowerReading(at(minutes), {"device": device_j, "cpu": cpu_j, "memory": memory_j})


def quarter_hours(*values: float) -> IntensitySeries:
    """A series with one value per 15 minutes from 12:00."""
    return IntensitySeries(
        provider="csv",
        zone="TEST",
        kind="forecast",
        times=tuple(at(15 * i) for i in range(len(values))),
        values=values,
        source="synthetic test series",
    )


def account(**kwargs) -> EnergyAccount:
    kwargs.setdefault("meter", MEASURED)
    kwargs.setdefault("pue", 1.0)
    kwargs.setdefault("pue_source", "test: IT energy only")
    acc = EnergyAccount(**kwargs)
    acc.start(reading(0))
    return acc


# 2 kW for 30 minutes: 2000 W x 1800 s = 3.6 MJ = 1 kWh
TWO_KW_HALF_HOUR = 2000.0 * 1800.0


def test_two_kw_for_half_an_hour_across_an_intensity_change_is_the_integral():
    acc = account(intensity=quarter_hours(100.0, 300.0, 50.0, 50.0))
    interval = acc.add(reading(30, device_j=TWO_KW_HALF_HOUR), step=1)
    # 2 kW x (100 g/kWh x 0.25 h + 300 g/kWh x 0.25 h) = 200 g; the intensity at the start alone gives 100 g
    assert interval["kwh"] == 1.0 and interval["watts"] == 2000.0
    assert interval["gco2e"] == 200.0
    assert acc.kgco2e() == 0.2
    assert acc.kgco2e() != 1.0 * 100.0 / 1000  # not a single average taken at the start
    # in force at the reading (12:30): the third quarter-hour
    assert acc.event_values()["intensity"] == {
        "g_per_kwh": 50.0,
        "provider": "csv",
        "zone": "TEST",
        "kind": "forecast",
    }


def test_carbon_follows_each_interval_when_power_changes():
    acc = account(intensity=quarter_hours(100.0, 300.0, 50.0, 50.0))
    acc.add(reading(15, device_j=1000.0 * 900), step=1)  # 1 kW for 15 min under 100 g/kWh: 25 g
    acc.add(
        reading(45, device_j=1000.0 * 900 + 4000.0 * 1800), step=2
    )  # 4 kW, 15 min at 300, 15 at 50: 350 g
    assert acc.totals.location_g == 375.0
    assert acc.summary()["results"]["kwh"]["device"] == 0.25 + 2.0


def test_the_shipped_gb_history_is_integrated_over_the_real_half_hours():
    gb = load_history("GB")
    start = gb.times[100] + timedelta(minutes=10)  # off the half-hour grid on purpose
    acc = EnergyAccount(meter=MEASURED, pue=1.0, pue_source="test", intensity=gb)
    acc.start(PowerReading(start, {"device": 0.0}))
    acc.add(PowerReading(start + timedelta(hours=2), {"device": 3000.0 * 7200}))
    assert acc.totals.location_g == pytest.approx(
        3.0 * gb.grams_per_kw(start, start + timedelta(hours=2)), rel=1e-12
    )


def test_energy_outside_the_intensity_series_is_counted_apart_and_blocks_sci():
    acc = account(intensity=quarter_hours(200.0, 200.0))  # covers 12:00-12:30
    acc.add(reading(60, device_j=1000.0 * 3600), tokens=1000)  # 1 kW for an hour: half of it outside
    assert acc.totals.location_g == 100.0
    assert acc.totals.kwh_without_intensity == 0.5
    sci = acc.sci()
    assert sci["value"] is None and "outside the intensity series" in sci["why"]
    assert any("outside the intensity series" in n for n in acc.summary()["notes"])


def test_pue_scales_it_energy_to_facility_energy_with_its_source():
    acc = EnergyAccount(meter=MEASURED, intensity=quarter_hours(100.0, 100.0))
    acc.start(reading(0))
    acc.add(
        reading(
            30, device_j=TWO_KW_HALF_HOUR * 0.5, cpu_j=TWO_KW_HALF_HOUR * 0.3, memory_j=TWO_KW_HALF_HOUR * 0.2
        )
    )
    assert acc.pue == DEFAULT_PUE == 1.58
    assert acc.totals.it_kwh == pytest.approx(1.0)
    assert acc.totals.facility_kwh == pytest.approx(1.58)
    assert acc.kgco2e() == pytest.approx(0.158)
    ev = acc.event_values()
    assert ev["kwh"] == pytest.approx(1.58) and ev["kwh_it"] == pytest.approx(1.0)
    assert (ev["kwh_device"], ev["kwh_cpu"], ev["kwh_memory"]) == pytest.approx((0.5, 0.3, 0.2))
    assert ev["watts"] == pytest.approx(2000.0) and ev["watts_facility"] == pytest.approx(3160.0)
    pue = acc.summary()["inputs"]["pue"]
    assert pue == {"value": 1.58, "source": PUE_SOURCE} and "Uptime Institute" in pue["source"]


def test_market_based_carbon_uses_the_contractual_factor_beside_the_location_based_one():
    acc = account(
        pue=1.2,
        intensity=quarter_hours(400.0, 400.0),
        market_factor_g_per_kwh=25.0,
        market_factor_source="PPA with Windpark Nord, certificates cancelled for 2026",
    )
    acc.add(reading(30, device_j=TWO_KW_HALF_HOUR))
    assert acc.kgco2e() == pytest.approx(1.2 * 400.0 / 1000)
    assert acc.kgco2e_market() == pytest.approx(1.2 * 25.0 / 1000)
    s = acc.summary()
    assert s["inputs"]["market_factor"]["source"].startswith("PPA")
    assert "GHG Protocol Scope 2" in s["scope"]


def test_without_a_contractual_factor_there_is_no_market_based_figure():
    acc = account(intensity=quarter_hours(100.0))
    acc.add(reading(10, device_j=1000.0))
    assert acc.kgco2e_market() is None and acc.event_values()["kgco2e_market"] is None


def test_sci_per_million_tokens_with_embodied_carbon_of_a100s():
    a100 = embodied_for("A100-SXM4-80GB", 8)
    assert a100.available and a100.kgco2e_per_device == 150 + 2500 / 8
    acc = account(intensity=quarter_hours(100.0, 300.0), embodied=a100)
    acc.add(reading(30, device_j=TWO_KW_HALF_HOUR), tokens=2_000_000)
    sci = acc.sci()
    m_g = 8 * 462.5 * 1000.0 * 0.5 / (6 * 8760)  # 8 devices x 462.5 kg x 0.5 h / 6-year lifetime
    assert sci["M_g"] == pytest.approx(m_g) and sci["M_included"] is True
    assert sci["EI_g"] == 200.0 and sci["R"] == 2.0
    assert sci["value"] == pytest.approx((200.0 + m_g) / 2.0)
    assert sci["standard"].startswith("ISO/IEC 21031:2024")
    assert acc.event_values()["sci_g_per_1m_tokens"] == pytest.approx(sci["value"])
    emb = acc.summary()["inputs"]["embodied"]
    assert "Luccioni" in emb["source"] and "approximation" in emb["confidence"]


def test_sci_leaves_embodied_carbon_out_with_the_reason_where_no_figure_exists():
    h100 = embodied_for("H100-SXM5-80GB", 8)
    assert not h100.available and "left out" in h100.reason
    acc = account(intensity=quarter_hours(100.0, 300.0), embodied=h100)
    acc.add(reading(30, device_j=TWO_KW_HALF_HOUR), tokens=500_000)
    sci = acc.sci()
    assert sci["M_g"] == 0.0 and sci["M_included"] is False and sci["M"].startswith("not included")
    assert sci["value"] == 200.0 / 0.5
    unknown = embodied_for("Gaudi2", 8)
    assert not unknown.available and "no embodied-carbon figure" in unknown.reason
    with pytest.raises(ValueError, match="no embodied figure"):
        unknown.grams_for(1.0)


def test_sci_needs_tokens_and_an_intensity():
    acc = account()
    acc.add(reading(30, device_j=TWO_KW_HALF_HOUR), tokens=1000)
    assert acc.sci()["why"] == "no carbon intensity configured"
    acc2 = account(intensity=quarter_hours(100.0, 100.0))
    acc2.add(reading(30, device_j=TWO_KW_HALF_HOUR))
    assert acc2.sci()["why"] == "no tokens trained yet"


def test_tokens_per_kwh_is_on_it_energy():
    acc = account(pue=1.5, pue_source="operator report 2025")
    acc.add(reading(30, device_j=TWO_KW_HALF_HOUR), tokens=4_000_000)
    assert acc.tokens_per_kwh() == 4_000_000.0


def test_flat_price_cost_and_cost_per_million_tokens():
    acc = account(pue=1.25, pue_source="test", tariff=Tariff.flat(0.2, "EUR", "supplier contract 2026"))
    acc.add(reading(30, device_j=TWO_KW_HALF_HOUR), tokens=500_000)
    assert acc.cost() == pytest.approx(1.25 * 0.2)
    assert acc.cost_per_1m_tokens() == pytest.approx(1.25 * 0.2 / 0.5)
    assert acc.event_values()["currency"] == "EUR"


def test_time_of_use_cost_is_integrated_across_the_price_change():
    tou = Tariff.time_of_use([at(0), at(15)], [0.10, 0.30], "EUR", "day-ahead prices", end=at(60))
    acc = account(tariff=tou)
    acc.add(reading(30, device_j=TWO_KW_HALF_HOUR))
    # 2 kW x (0.10 x 0.25 h + 0.30 x 0.25 h)
    assert acc.cost() == pytest.approx(0.2)
    assert tou.describe()["kind"] == "time-of-use" and tou.price_at(at(20)) == 0.30


def test_energy_outside_a_time_of_use_tariff_has_no_price_and_no_cost_per_token():
    tou = Tariff.time_of_use([at(0)], [0.5], "EUR", "test", end=at(15))
    acc = account(tariff=tou)
    acc.add(reading(30, device_j=TWO_KW_HALF_HOUR), tokens=1000)
    assert acc.cost() == pytest.approx(0.25) and acc.totals.kwh_without_price == pytest.approx(0.5)
    assert acc.cost_per_1m_tokens() is None


def test_the_event_payload_carries_the_estimate_label_and_the_intensity_provenance():
    acc = account(meter=ESTIMATED, intensity=quarter_hours(120.0, 120.0))
    acc.add(reading(15, cpu_j=100.0 * 900, memory_j=5.0 * 900), step=7, tokens=100)
    ev = acc.event_values()
    assert ev["method"] == "estimate" and ev["measured"] is False
    assert ev["estimated"] == ["cpu", "memory"] and "not measured" in ev["label"]
    assert ev["intensity"]["provider"] == "csv" and ev["intensity"]["kind"] == "forecast"
    assert ev["watts"] == pytest.approx(105.0)
    assert ev["step_kwh"] == pytest.approx(105.0 * 900 / 3.6e6)
    assert any(n.startswith("Estimated, not measured: cpu, memory") for n in acc.summary()["notes"])


def test_a_real_meter_on_this_machine_feeds_the_account():
    with select_meter("cpu") as meter:
        acc = EnergyAccount(meter=meter.describe(), intensity=quarter_hours(100.0))
        acc.start(meter.read())
        sum(i * i for i in range(300_000))
        acc.add(meter.read(), step=1, tokens=64)
    ev = acc.event_values()
    assert ev["kwh_it"] > 0 and ev["method"] == meter.method
    assert ev["tokens"] == 64 and ev["kwh_without_intensity"] > 0  # now is not in the 2026-03-01 test series


def test_summary_lists_every_input_with_its_source():
    acc = account(
        intensity=quarter_hours(100.0, 100.0),
        market_factor_g_per_kwh=10.0,
        market_factor_source="residual mix",
        tariff=Tariff.flat(0.1, "USD", "utility bill"),
        embodied=embodied_for("A100-SXM4-40GB", 1),
    )
    acc.add(reading(30, device_j=TWO_KW_HALF_HOUR), tokens=10)
    inputs = acc.summary()["inputs"]
    assert inputs["meter"]["method"] == "nvml"
    assert inputs["intensity"]["source"] == "synthetic test series"
    assert (
        inputs["tariff"]["source"] == "utility bill" and inputs["market_factor"]["source"] == "residual mix"
    )
    assert inputs["embodied"]["available"] is True and inputs["pue"]["source"] == "test: IT energy only"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"meter": {"method": "guess"}}, "power meter's describe"),
        ({"pue": 0.9}, "PUE must be a number >= 1"),
        ({"pue": float("nan")}, "PUE must be a number >= 1"),
        ({"pue": 1.3, "pue_source": ""}, "needs its source"),
        ({"market_factor_g_per_kwh": -1.0, "market_factor_source": "x"}, "gCO2e/kWh >= 0"),
        ({"market_factor_g_per_kwh": 20.0}, "needs its source"),
        ({"intensity": [100.0]}, "must be an IntensitySeries"),
        ({"tariff": 0.2}, "must be a Tariff"),
        ({"embodied": 150.0}, "embodied_for"),
    ],
)
def test_account_validates_its_inputs(kwargs, message):
    kwargs = {"meter": MEASURED, "pue_source": "test"} | kwargs
    with pytest.raises(ValueError, match=message):
        EnergyAccount(**kwargs)


def test_readings_must_be_cumulative_and_in_time_order():
    acc = EnergyAccount(meter=MEASURED)
    with pytest.raises(ValueError, match=r"call start\(meter.read\(\)\) before"):
        acc.add(reading(1))
    acc.start(reading(10, device_j=100.0))
    with pytest.raises(ValueError, match="already started"):
        acc.start(reading(10))
    with pytest.raises(ValueError, match="time order"):
        acc.add(reading(5, device_j=200.0))
    with pytest.raises(ValueError, match="device went down"):
        acc.add(reading(20, device_j=50.0))
    with pytest.raises(ValueError, match="tokens must be a whole number"):
        acc.add(reading(20, device_j=150.0), tokens=-1)
    with pytest.raises(ValueError, match="tokens must be a whole number"):
        acc.add(reading(20, device_j=150.0), tokens=1.5)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Tariff.flat(0.2, "", "x"), "needs a currency"),
        (lambda: Tariff.flat(0.2, "EUR", ""), "needs a source"),
        (lambda: Tariff.flat(float("inf"), "EUR", "x"), "finite number"),
        (lambda: Tariff.time_of_use([at(15), at(0)], [1.0, 2.0], "EUR", "x"), "strictly increasing"),
        (lambda: Tariff.time_of_use([at(0)], [1.0, 2.0], "EUR", "x"), "one price per timestamp"),
        (lambda: Tariff.time_of_use([at(0)], [1.0], "EUR", "x", end=at(0)), "end must be after"),
        (lambda: embodied_for("A100", 0), "count must be"),
        (lambda: embodied_for("", 1), "device_name must be"),
    ],
)
def test_tariff_and_embodied_inputs_are_validated(make, message):
    with pytest.raises(ValueError, match=message):
        make()
