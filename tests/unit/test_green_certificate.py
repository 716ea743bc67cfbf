"""The energy and carbon report (workers/green/certificate/): built from a real EnergyAccount fed synthetic
readings over the shipped 2020 GB history, it verifies against its recomputation; a single altered figure or
input fails both ways (the code no longer matches, the recomputation differs) with the field named; another
secret fails; the PDF prints the code, the estimate labels and exactly the hashed figures, and a PDF rendered
from an altered document fails against the stored one; no claim of meeting a standard anywhere."""

from __future__ import annotations

import copy
import json
import re
import time
from datetime import UTC, datetime, timedelta

import pytest

from workers.green import certificate
from workers.green.certificate import (
    build_certificate,
    canonical_json,
    figures_from_pdf_text,
    format_number,
    normalise_code,
    pdf_text,
    render_pdf,
    round_figure,
    verify_certificate,
    verify_pdf,
)
from workers.green.energy import EnergyAccount, Tariff, embodied_for
from workers.green.history import load_history
from workers.green.power import PowerReading, select_meter
from workers.green.schedule import schedule
from workers.green.series import IntensitySeries

SECRET = b"test-secret-key-of-the-control-plane"
OTHER_SECRET = b"another-control-plane-secret-key"
ISSUED = datetime(2026, 3, 1, 12, 0, 5, 250_000, tzinfo=UTC)
JOB = {
    "id": 42,
    "name": "llama-7b-pretrain",
    "team": "research",
    "cluster": "gb-a100",
    "device": "A100-SXM4-80GB",
    "device_count": 8,
    "kwh_all_attempts": 10.4596,  # the header's totals (the control plane prints every attempt's there)
}
REQUESTED = datetime(2020, 3, 2, 16, 0, tzinfo=UTC)  # when the job was scheduled (inside the 2020 GB history)
CODE_RE = re.compile(r"^[A-Z2-7]{4}(-[A-Z2-7]{4}){4}$")
CLAIMS = re.compile(r"certified|certification|conform|complian|14064", re.IGNORECASE)


@pytest.fixture(scope="module")
def meter_description(tmp_path_factory):
    """A real meter that finds no NVML device (the CUDA UUIDs exist nowhere) and no RAPL, so it estimates
    on any machine, as this one does."""
    fake_gpus = ",".join(f"GPU-{i:08x}-dead-beef-0000-000000000000" for i in range(8))
    meter = select_meter(
        "cuda",
        list(range(8)),
        tdp_watts=400.0,
        rapl_root=tmp_path_factory.mktemp("no-powercap") / "powercap",
        env={"CUDA_VISIBLE_DEVICES": fake_gpus},
    )
    try:
        return meter.describe()
    finally:
        meter.close()


@pytest.fixture(scope="module")
def plan():
    """The carbon-aware schedule the job ran under: 2 h at 3.3 kW, to finish within 24 h."""
    gb = load_history("GB")
    return schedule(
        gb, now=REQUESTED, duration=timedelta(hours=2), power_kw=3.3, deadline=timedelta(hours=24)
    )


def run_account(meter: dict, start: datetime, **kwargs) -> EnergyAccount:
    """Two hours of synthetic cumulative readings every 10 minutes (3.2 kW devices, 100 W CPU, 10 W memory,
    500k tokens per interval), as a training loop would feed them."""
    kwargs.setdefault("intensity", load_history("GB"))
    kwargs.setdefault("market_factor_g_per_kwh", 42.0)
    kwargs.setdefault("market_factor_source", "supplier-specific rate of the site's 2020 green tariff")
    kwargs.setdefault("tariff", Tariff.flat(0.25, "GBP", "site electricity contract, 2020 unit rate"))
    kwargs.setdefault("embodied", embodied_for("A100-SXM4-80GB", 8))
    acc = EnergyAccount(meter=meter, **kwargs)
    acc.start(PowerReading(start, {"device": 0.0, "cpu": 0.0, "memory": 0.0}))
    for i in range(1, 13):
        s = 600.0 * i
        acc.add(
            PowerReading(
                start + timedelta(seconds=s), {"device": 3200.0 * s, "cpu": 100.0 * s, "memory": 10.0 * s}
            ),
            step=i,
            tokens=500_000,
        )
    return acc


def build(meter: dict, plan, *, secret: bytes = SECRET, **kwargs) -> dict:
    return build_certificate(
        job=dict(JOB),
        energy_summary=run_account(meter, plan.start, **kwargs).summary(),
        schedule=plan.to_dict(),
        issued_at=ISSUED,
        secret=secret,
    )


@pytest.fixture(scope="module")
def document(meter_description, plan):
    return build(meter_description, plan)


@pytest.fixture(scope="module")
def recomputed(meter_description, plan):
    """The report rebuilt from the same stored measurements, as the verify endpoint does."""
    return build(meter_description, plan)


@pytest.fixture(scope="module")
def pdf(document):
    started = time.perf_counter()
    data = render_pdf(document)
    print(f"render_pdf: {time.perf_counter() - started:.2f} s, {len(data)} bytes")
    return data


@pytest.fixture(scope="module")
def text(pdf):
    return pdf_text(pdf)


def get(document: dict, path: str):
    node = document
    for part in path.split("."):
        node = node[part]
    return node


def put(document: dict, path: str, value) -> dict:
    out = copy.deepcopy(document)
    *parents, last = path.split(".")
    node = out
    for part in parents:
        node = node[part]
    node[last] = value
    return out


def test_a_report_from_the_energy_account_over_the_gb_history_verifies(
    meter_description, plan, document, recomputed
):
    summary = run_account(meter_description, plan.start).summary()["results"]
    assert document["results"]["kwh"]["facility"] == round_figure(summary["kwh"]["facility"])
    assert document["results"]["kgco2e_location"] == round_figure(summary["kgco2e_location"])
    assert document["results"]["sci"]["value"] == round_figure(summary["sci"]["value"])
    assert document["results"]["tokens"] == 6_000_000
    assert document["inputs"]["intensity"]["zone"] == "GB"
    assert document["inputs"]["energy"]["method"] == "estimate"
    assert document["title"] == "Energy and carbon report for training job llama-7b-pretrain"
    assert document["issued_at"] == "2026-03-01T12:00:05+00:00"

    v = document["verification"]
    assert CODE_RE.match(v["code"]) and len(v["digest"]) == 64 and v["algorithm"] == "HMAC-SHA256"
    assert v["verify_path"] == f"/api/public/certificates/{v['code']}/verify"
    assert verify_certificate(document, recomputed=recomputed, secret=SECRET) == {
        "valid": True,
        "code_matches": True,
        "figures_match": True,
        "mismatches": [],
    }
    # rebuilding gives the same bytes, and the document survives a JSON round trip (a database column)
    assert canonical_json(document) == canonical_json(recomputed)
    stored = json.loads(json.dumps(document))
    assert verify_certificate(stored, recomputed=recomputed, secret=SECRET)["valid"]


@pytest.mark.parametrize(
    ("field", "tamper"),
    [
        ("results.kwh.facility", lambda v: round_figure(v * 0.9)),
        ("results.kgco2e_location", lambda v: round_figure(v / 2)),
        ("results.sci.value", lambda v: round_figure(v - 100)),
        ("inputs.pue.value", lambda v: 1.1),
        ("inputs.intensity.zone", lambda v: "DE"),
    ],
)
def test_altering_a_single_figure_fails_both_ways_with_that_field_named(document, recomputed, field, tamper):
    original = get(document, field)
    tampered = put(document, field, tamper(original))
    result = verify_certificate(tampered, recomputed=recomputed, secret=SECRET)
    assert not result["valid"] and not result["code_matches"] and not result["figures_match"]
    assert {"field": field, "certified": tamper(original), "recomputed": original} in result["mismatches"]
    assert [m["field"] for m in result["mismatches"]] == [field, "verification.code"]


def test_a_different_secret_fails_the_code_but_not_the_figures(meter_description, plan, document, recomputed):
    result = verify_certificate(document, recomputed=recomputed, secret=OTHER_SECRET)
    assert not result["valid"] and not result["code_matches"] and result["figures_match"]
    assert [m["field"] for m in result["mismatches"]] == ["verification.code"]
    assert (
        build(meter_description, plan, secret=OTHER_SECRET)["verification"]["code"]
        != (document["verification"]["code"])
    )


def test_a_replaced_code_fails(document, recomputed):
    forged = put(document, "verification.code", "AAAA-BBBB-CCCC-DDDD-EEEE")
    assert not verify_certificate(forged, recomputed=recomputed, secret=SECRET)["code_matches"]
    stripped = {k: v for k, v in document.items() if k != "verification"}
    assert not verify_certificate(stripped, recomputed=recomputed, secret=SECRET)["valid"]


def test_numbers_are_rounded_once_to_six_significant_figures_in_plain_decimal():
    assert format_number(0.1 + 0.2) == "0.3"
    assert format_number(1234567.89) == "1234570"
    assert format_number(1.5e-7) == "0.00000015"
    assert format_number(3.204146809550653) == "3.20415"
    assert format_number(-0.0) == "0" and format_number(2.0) == "2" and format_number(6_000_000) == "6000000"
    assert round_figure(round_figure(906344.4108761329)) == round_figure(906344.4108761329) == 906344.0
    assert canonical_json({"b": [1.0, None, True], "a": "é"}) == '{"a":"\\u00e9","b":[1,null,true]}'
    with pytest.raises(ValueError, match="finite"):
        format_number(float("nan"))


def test_the_printed_figures_are_exactly_the_hashed_ones(document, text):
    hashed = canonical_json({k: v for k, v in document.items() if k != "verification"})
    printed = figures_from_pdf_text(text)
    assert printed["code"] == document["verification"]["code"]
    assert set(printed["figures"]) == set(certificate.readback_fields(document))
    for field, text in printed["figures"].items():
        value = certificate.value_at(document, field)
        if isinstance(value, float):
            assert f'"{field.rsplit(".", 1)[-1]}":{text}' in hashed, field
        assert text == certificate.scalar_text(value), field


def test_the_pdf_shows_the_code_the_estimate_labels_the_figures_and_how_to_verify(document, pdf, text):
    assert pdf.startswith(b"%PDF")
    code = document["verification"]["code"]
    assert "Energy and carbon report for training job llama-7b-" in text
    assert f"Verification code: {code}" in text
    assert f"GET /api/public/certificates/{code}/verify" in text and "no account needed" in text
    assert "Energy is an estimate: no power meter on this machine" in text
    # every energy-derived figure carries the estimate label next to its value
    r = document["results"]
    for value, unit in (
        (r["kwh"]["facility"], "kWh"),
        (r["kgco2e_location"], "kgCO2e"),
        (r["kgco2e_market"], "kgCO2e"),
        (r["tokens_per_kwh"], "tokens/kWh"),
    ):
        assert re.search(rf"{re.escape(format_number(value))} {re.escape(unit)}\s+estimate", text), value
    assert f"{format_number(r['sci']['value'])} gCO2e per 1M" in text
    assert f"{format_number(r['schedule']['saving_pct'])} %" in text
    for heading in (
        "Scope and boundary",
        "Methodology",
        "Inputs and their sources",
        "Notes",
        "How to verify",
    ):
        assert heading in text
    assert verify_pdf(pdf, document, SECRET) == {
        "valid": True,
        "code_matches": True,
        "figures_match": True,
        "mismatches": [],
    }


def test_a_pdf_rendered_from_an_altered_document_fails_against_the_stored_one(document, text):
    field = "results.kwh.facility"
    forged_pdf = render_pdf(put(document, field, round_figure(get(document, field) * 0.5)))
    result = verify_pdf(forged_pdf, document, SECRET, expected=text)
    assert not result["valid"] and not result["figures_match"] and result["code_matches"]
    halved, stored = format_number(get(document, field) * 0.5), format_number(get(document, field))
    # the results table's row and the verification block's line, each named
    assert result["mismatches"] == [
        {"field": "printed: Facility energy (IT energy x PUE)", "certified": halved, "recomputed": stored},
        {"field": field, "certified": halved, "recomputed": stored},
    ]
    assert not verify_pdf(forged_pdf, document, OTHER_SECRET)["code_matches"]


def test_a_figure_outside_the_results_altered_in_the_pdf_fails_too(document, text):
    """The issue's case: the header's "kwh all attempts" cut by 80% had verified (only the results table's
    figures were compared). The stored report is rendered here, without the stored text."""
    cut = round_figure(document["job"]["kwh_all_attempts"] * 0.2)
    result = verify_pdf(render_pdf(put(document, "job.kwh_all_attempts", cut)), document, SECRET)
    assert not result["valid"] and result["code_matches"]
    assert result["mismatches"] == [
        {
            "field": "printed: kwh all attempts",
            "certified": format_number(cut),
            "recomputed": format_number(document["job"]["kwh_all_attempts"]),
        }
    ]


NAMED = {  # how a mismatch names some of the printed figures (each is named by the words printed before it)
    "kwh all attempts": "job.kwh_all_attempts",
    "Facility energy (IT energy x PUE)": "results.kwh.facility",
    "Emissions, market-based": "results.kgco2e_market",
    "SCI (E x I + M) per R, R = 1M tokens": "results.sci.value",
    "Tokens trained": "results.tokens",
    "Predicted saving": "results.schedule.saving_kgco2e",
    "Market-based factor": "inputs.market_factor.g_per_kwh",
    "results.kwh.facility": "results.kwh.facility",
    "inputs.pue.value": "inputs.pue.value",
}


def test_every_printed_figure_altered_in_turn_fails_naming_it(document, text):
    """Each word of the genuine PDF's text that holds a digit (every figure, date, count, id and the code)
    altered alone: the comparison finds exactly that one, named by what is printed before it."""
    words = certificate.printed_words(text)
    figures = [i for i, w in enumerate(words) if re.search(r"\d", w)]
    assert len(figures) > 100, len(figures)
    labels = set()
    for i in figures:
        word = words[i]
        at = re.search(r"\d", word).start()
        altered = word[:at] + str((int(word[at]) + 1) % 10) + word[at + 1 :]
        shown = " ".join(words[:i] + [altered] + words[i + 1 :])
        mismatches = certificate.compare_printed(text, shown)
        assert len(mismatches) == 1, (word, mismatches)
        (m,) = mismatches
        assert (m["certified"], m["recomputed"]) == (altered, word)
        assert m["field"] and m["field"] != "printed: ", word
        labels.add(m["field"].removeprefix("printed: "))
    for label, path in NAMED.items():
        assert label in labels, (label, sorted(labels))
        assert format_number(get(document, path)) in text


def test_words_added_or_dropped_fail_too(document, text):
    words = certificate.printed_words(text)
    at = words.index("Results")
    added = " ".join(words[:at] + ["(audited)"] + words[at:])
    dropped = " ".join(w for w in words if w != "estimate")
    (m,) = certificate.compare_printed(text, added)
    assert (m["certified"], m["recomputed"]) == ("(audited)", None)
    gone = certificate.compare_printed(text, dropped)
    assert gone and all(m["recomputed"] == "estimate" and m["certified"] is None for m in gone[:-1])
    other = certificate.compare_printed(text, "a different document")
    assert 1 <= len(other) <= certificate.verify.MAX_TEXT_MISMATCHES + 1


def test_no_claim_of_meeting_a_standard_anywhere(document, text):
    for words in (json.dumps(document), text):
        assert CLAIMS.search(words) is None, CLAIMS.search(words)
    assert "calculation report" in document["statement"]
    assert "No third party has verified" in document["statement"]
    follows = " ".join(m["follows"] for m in document["methodology"])
    assert "GHG Protocol Scope 2" in follows and "ISO/IEC 21031:2024" in follows


def test_the_scheduling_saving_is_reported_as_a_prediction(document, plan):
    s = document["results"]["schedule"]
    assert s["saving_pct"] == round_figure(plan.saving_pct)
    assert s["saving_kgco2e"] == round_figure(plan.kgco2e_now - plan.kgco2e)
    assert s["start"] == plan.start.isoformat() and "not measured" in s["basis"]
    assert (
        "a prediction from the plan's power, not a measurement"
        in document["estimate_basis"]["results.schedule.saving_pct"]
    )
    assert not any("not at the scheduled start" in n for n in document["notes"])  # it started on time


def test_measured_energy_with_the_sites_pue_and_actual_intensity_rests_on_no_estimate():
    start = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    actual = IntensitySeries(
        provider="uk-carbon-intensity",
        zone="GB",
        kind="actual",
        times=tuple(start + timedelta(minutes=30 * i) for i in range(6)),
        values=(180.0, 175.0, 160.0, 150.0, 150.0, 140.0),
        source="recorded answer of api.carbonintensity.org.uk /intensity",
    )
    measured = {
        "method": "nvml",
        "measured": True,
        "estimated": [],
        "missing": [],
        "label": "measured: device (nvml), cpu, memory (rapl)",
        "device_kind": "cuda",
        "components": {
            "device": {"source": "nvml", "measured": True, "how": "NVML total-energy counter"},
            "cpu": {"source": "rapl", "measured": True, "how": "RAPL package counters"},
            "memory": {"source": "rapl", "measured": True, "how": "RAPL dram counters"},
        },
        "tried": [],
    }
    acc = run_account(
        measured,
        start,
        intensity=actual,
        pue=1.12,
        pue_source="site operator's measured annual PUE, 2025 report",
        embodied=embodied_for("H100-SXM5-80GB", 8),
    )
    doc = build_certificate(
        job=dict(JOB), energy_summary=acc.summary(), schedule=None, issued_at=ISSUED, secret=SECRET
    )
    assert doc["estimate_basis"] == {}
    assert not any("estimate" in n for n in doc["notes"])
    assert doc["results"]["schedule"] is None
    assert doc["results"]["sci"]["M_included"] is False
    assert any("Embodied carbon of H100-SXM5-80GB" in line for line in doc["scope"]["not_counted"])


def test_missing_intensity_market_factor_and_tariff_are_said_so(meter_description, plan):
    doc = build(meter_description, plan, intensity=None, market_factor_g_per_kwh=None, tariff=None)
    r = doc["results"]
    assert r["kgco2e_location"] is None and r["kgco2e_market"] is None and r["cost"] is None
    assert r["sci"]["value"] is None
    notes = " ".join(doc["notes"])
    assert "No carbon intensity was configured" in notes
    assert "Market-based emissions are not reported" in notes
    assert "No tariff was given" in notes
    assert verify_certificate(doc, recomputed=copy.deepcopy(doc), secret=SECRET)["valid"]


def test_inputs_are_checked_with_messages_a_person_can_act_on(meter_description, plan, document):
    summary = run_account(meter_description, plan.start).summary()
    ok = {
        "job": dict(JOB),
        "energy_summary": summary,
        "schedule": None,
        "issued_at": ISSUED,
        "secret": SECRET,
    }
    cases = [
        ({"job": {"id": 1}}, "needs a 'name'"),
        ({"job": dict(JOB, name="a\nb")}, "control characters"),
        ({"secret": "a string"}, "must be bytes"),
        ({"secret": b"short"}, "at least 16 bytes"),
        ({"energy_summary": {}}, "EnergyAccount.summary"),
        ({"issued_at": datetime(2026, 3, 1)}, "timezone-aware"),
        ({"schedule": {"start": "x"}}, "Schedule.to_dict"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            build_certificate(**(ok | change))
    fresh = EnergyAccount(meter=meter_description)
    fresh.start(PowerReading(plan.start, {}))
    with pytest.raises(ValueError, match="no energy readings"):
        build_certificate(**(ok | {"energy_summary": fresh.summary()}))
    with pytest.raises(ValueError, match="recomputed must be"):
        verify_certificate(document, recomputed={}, secret=SECRET)
    with pytest.raises(ValueError, match="not a PDF"):
        verify_pdf(b"<html>", document, SECRET)
    assert normalise_code(" abcd efgh-ijkl mnop qrst ") == "ABCD-EFGH-IJKL-MNOP-QRST"
    with pytest.raises(ValueError, match="not a verification code"):
        normalise_code("ABCD-EFGH-IJKL-MNOP-QRS1")
