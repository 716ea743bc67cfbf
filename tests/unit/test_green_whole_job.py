"""A report of the whole job (workers/green/certificate/whole_job.py): a job metered in three segments (its
first attempt, a torchrun restart within it after a killed rank, a relaunch) by real EnergyAccounts fed
synthetic readings over the shipped 2020 GB history. The report adds every segment up, splits them, counts
the steps trained twice and their energy as badput, says so in its headline, verifies, and fails on an
altered split; a report of one attempt keeps format 1 and prints none of it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from workers.green import certificate
from workers.green.certificate import (
    build_certificate,
    covers,
    format_number,
    pdf_text,
    render_pdf,
    verify_certificate,
    verify_pdf,
    whole_job_summary,
)
from workers.green.energy import EnergyAccount, Tariff, embodied_for
from workers.green.history import load_history
from workers.green.power import PowerReading

SECRET = b"test-secret-key-of-the-control-plane"
ISSUED = datetime(2026, 3, 1, 12, 0, 5, tzinfo=UTC)
START = datetime(2020, 3, 2, 16, 0, tzinfo=UTC)
METER = {"method": "estimate", "measured": False, "estimated": ["device", "cpu", "memory"], "missing": [],
         "label": "estimated (TDP x utilisation)", "device_kind": "cuda", "components": {}, "tried": []}  # fmt: skip
# (attempt, restart, step before its first, its last step, minutes after START it began): the restart resumed
# from the snapshot at step 10 after training to 12; the relaunch from step 20 after training to 24
SEGMENTS = ((1, 0, 0, 12, 0), (1, 1, 10, 24, 130), (2, 0, 20, 40, 300))
TOKENS_PER_STEP = 1000


def metered(from_step: int, last_step: int, start: datetime) -> EnergyAccount:
    """One segment: a reading a step, 60 s apart, 3.2 kW of devices, 100 W CPU, 10 W memory."""
    acc = EnergyAccount(
        meter=METER,
        intensity=load_history("GB"),
        market_factor_g_per_kwh=42.0,
        market_factor_source="supplier-specific rate",
        tariff=Tariff.flat(0.25, "GBP", "site contract"),
        embodied=embodied_for("A100-SXM4-80GB", 8),
    )
    acc.start(PowerReading(start, {"device": 0.0, "cpu": 0.0, "memory": 0.0}))
    for i, step in enumerate(range(from_step + 1, last_step + 1), start=1):
        s = 60.0 * i
        watts = {"device": 3200.0 * s, "cpu": 100.0 * s, "memory": 10.0 * s}
        acc.add(PowerReading(start + timedelta(seconds=s), watts), step=step, tokens=TOKENS_PER_STEP)
    return acc


@pytest.fixture(scope="module")
def job():
    """(the finishing segment's summary, every segment as the control plane hands them over, the accounts)."""
    accounts, segments = [], []
    for attempt, restart, from_step, last_step, minutes in SEGMENTS:
        start = START + timedelta(minutes=minutes)
        acc = metered(from_step, last_step, start)
        accounts.append(acc)
        segments.append(
            acc.event_values()
            | {
                "attempt": attempt,
                "restart": restart,
                "from_step": from_step,
                "step": last_step,
                "start": start.isoformat(),
                "end": acc.last.time.isoformat(),
                "intervals": acc.intervals,
            }  # fmt: skip
        )
    return accounts[-1].summary(), segments, accounts


@pytest.fixture(scope="module")
def document(job):
    finished, segments, _ = job
    return build_certificate(
        job={"id": 7, "name": "gpt-restored", "attempts": 2},
        energy_summary=whole_job_summary(finished, segments),
        schedule=None,
        issued_at=ISSUED,
        secret=SECRET,
    )


def test_every_segment_is_added_up_and_split(job):
    finished, segments, accounts = job
    r = whole_job_summary(finished, segments)["results"]
    assert r["kwh"]["facility"] == pytest.approx(sum(a.totals.facility_kwh for a in accounts))
    assert r["kwh"]["it"] == pytest.approx(sum(a.totals.it_kwh for a in accounts))
    assert r["kgco2e_location"] == pytest.approx(sum(a.kgco2e() for a in accounts))
    assert r["cost"] == pytest.approx(sum(a.cost() for a in accounts))
    assert r["tokens"] == TOKENS_PER_STEP * (12 + 14 + 20) and r["intervals"] == 12 + 14 + 20
    assert r["hours"] == pytest.approx(sum(a.hours for a in accounts))  # the gaps between segments are not
    assert r["start"] == START.isoformat() and r["end"] == finished["results"]["end"]
    # SCI over the whole job: its location grams and the devices' embodied share for the metered hours
    m_g = embodied_for("A100-SXM4-80GB", 8).grams_for(r["hours"])
    expected_sci = (r["kgco2e_location"] * 1000 + m_g) / (r["tokens"] / 1e6)
    assert r["sci"]["value"] == pytest.approx(expected_sci) and r["sci"]["M_included"]
    assert [(s["attempt"], s["restart"], s["first_step"], s["last_step"], s["trained_again"]) for s in r["segments"]] == [
        (1, 0, 1, 12, 2), (1, 1, 11, 24, 4), (2, 0, 21, 40, 0)
    ]  # fmt: skip


def test_the_steps_trained_twice_are_badput_with_their_energy(job):
    finished, segments, accounts = job
    rec = whole_job_summary(finished, segments)["results"]["recomputed"]
    assert rec["steps"] == 2 + 4
    # a segment's energy per step it trained x its steps trained again
    expected = accounts[0].totals.facility_kwh * 2 / 12 + accounts[1].totals.facility_kwh * 4 / 14
    assert rec["kwh_facility"] == pytest.approx(expected)
    total = sum(a.totals.facility_kwh for a in accounts)
    assert rec["share_pct"] == pytest.approx(100 * expected / total)
    # a segment that does not say where it began (an event from before they did): not known, not zero
    old = [dict(s) for s in segments]
    old[1].pop("from_step")
    assert whole_job_summary(finished, old)["results"]["recomputed"] is None


def test_the_report_headlines_the_whole_job_and_verifies(job, document):
    finished, segments, _ = job
    assert document["format_version"] == 2
    assert covers(document["results"]) == {
        "attempts": 2, "restarts": 1, "first_step": 1, "last_step": 40, "trained_twice": 6
    }  # fmt: skip
    assert "every attempt (2)" in document["scope"]["boundary"]
    assert any("6 steps were trained twice" in n for n in document["notes"])
    again = build_certificate(
        job={"id": 7, "name": "gpt-restored", "attempts": 2},
        energy_summary=whole_job_summary(finished, segments),
        schedule=None,
        issued_at=ISSUED,
        secret=SECRET,
    )
    assert verify_certificate(document, recomputed=again, secret=SECRET)["valid"]
    pdf = render_pdf(document)
    text = pdf_text(pdf)
    words = " ".join(text.split())
    assert (
        "Covers the whole job: 2 attempts and 1 restart within them, steps 1 to 40; 6 steps trained twice"
        in words
    )
    assert "Attempts and restarts" in words and "attempt 1, restart 1" in words
    assert "results.recomputed.steps = 6" in text
    kwh = format_number(document["results"]["recomputed"]["kwh_facility"])
    assert f"results.recomputed.kwh_facility = {kwh}" in text
    assert verify_pdf(pdf, document, SECRET, expected=text)["valid"]


def test_an_altered_split_or_badput_figure_fails_naming_it(document):
    text = pdf_text(render_pdf(document))
    segment = document["results"]["segments"][0]
    forged = {**document, "results": {**document["results"], "segments": [
        {**segment, "kwh": round(segment["kwh"] * 0.5, 6)}, *document["results"]["segments"][1:]
    ]}}  # fmt: skip
    result = verify_pdf(render_pdf(forged), document, SECRET, expected=text)
    assert not result["valid"] and result["code_matches"]
    [m] = result["mismatches"]
    assert m["field"].startswith("printed:") and m["recomputed"] == f"{format_number(segment['kwh'])}"
    badput = {**document, "results": {**document["results"], "recomputed": {
        **document["results"]["recomputed"], "steps": 0}}}  # fmt: skip
    found = verify_pdf(render_pdf(badput), document, SECRET, expected=text)["mismatches"]
    # named in the headline, the results table and the verification block, each with what was issued
    assert [(m["field"], m["certified"], m["recomputed"]) for m in found] == [
        ("printed: job: 2 attempts and 1 restart within them, steps 1 to 40;", "0", "6"),
        ("printed: Steps trained twice after faults (badput)", "0", "6"),
        ("results.recomputed.steps", "0", "6"),
    ]


def test_a_report_of_one_segment_is_format_1_and_prints_no_split(job):
    finished, _, _ = job
    one = build_certificate(
        job={"id": 7, "name": "gpt"}, energy_summary=finished, schedule=None, issued_at=ISSUED, secret=SECRET
    )
    assert one["format_version"] == 1 and "segments" not in one["results"] and covers(one["results"]) is None
    text = pdf_text(render_pdf(one))
    assert "Covers the whole job" not in text and "recomputed" not in text
    assert set(certificate.figures_from_pdf_text(text)["figures"]) == set(certificate.readback_fields(one))
