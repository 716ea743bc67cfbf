"""The report as an A4 PDF (WeasyPrint): self-contained HTML with inline CSS and the machine's own fonts,
every number printed exactly as the code covers it, the verification block that
:func:`~workers.green.certificate.verify.verify_pdf` reads back."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from string import Template
from typing import Any

from workers.green.certificate.canonical import SIGNIFICANT_FIGURES, scalar_text, value_at
from workers.green.certificate.codes import VERIFY_PATH
from workers.green.certificate.document import ISSUER
from workers.green.certificate.figures import READBACK_START, SCHEDULE_FIGURES, key_figures, readback_fields
from workers.green.certificate.whole_job import covers

_PAGE = Template(
    """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>$title</title>
<style>
@page {
  size: A4; margin: 16mm 15mm 18mm 15mm;
  @bottom-left { content: "Verification code $code"; font: 7pt "DejaVu Sans Mono", monospace; color: #555; }
  @bottom-right { content: "page " counter(page) " of " counter(pages); font: 7pt "DejaVu Sans", sans-serif;
                  color: #555; }
}
body { font-family: "DejaVu Sans", "Liberation Sans", sans-serif; font-size: 8.6pt; line-height: 1.35;
       color: #1a1a1a; }
h1 { font-size: 16pt; margin: 0 0 2mm 0; color: #14401c; }
h2 { font-size: 11pt; margin: 5mm 0 1.5mm 0; color: #14401c; border-bottom: 0.6pt solid #9bb59f;
     padding-bottom: 0.6mm; }
p { margin: 1mm 0; }
.meta { color: #444; margin-bottom: 3mm; }
.code { border: 1.6pt solid #14401c; border-radius: 2mm; padding: 2.5mm 4mm; margin: 2mm 0 3mm 0;
        background: #f3f8f3; }
.code .label { font: bold 10pt "DejaVu Sans", sans-serif; color: #14401c; letter-spacing: 0; }
.code .value { font: bold 17pt "DejaVu Sans Mono", monospace; letter-spacing: 0.04em; }
.code .how { font-size: 7.6pt; color: #333; }
.statement { border-left: 2pt solid #b58900; padding: 1mm 3mm; background: #fdf8ea; margin: 2mm 0; }
table { width: 100%; border-collapse: collapse; margin: 1mm 0 2mm 0; table-layout: fixed; }
th, td { border-bottom: 0.4pt solid #cfd8d0; padding: 1mm 1.4mm; text-align: left; vertical-align: top; }
th { background: #e9f1ea; font-size: 8pt; }
td.num { font-family: "DejaVu Sans Mono", monospace; }
.verify { break-inside: avoid; }
td.sub { padding-left: 5mm; color: #333; }
.src { font-size: 7.2pt; color: #444; overflow-wrap: break-word; }
.est { display: inline-block; background: #fff0c2; border: 0.5pt solid #c9a227; border-radius: 1mm;
       padding: 0 1mm; font-size: 7pt; font-weight: bold; color: #6b5300; }
.why { font-size: 7.2pt; color: #555; }
ul { margin: 1mm 0 1mm 5mm; padding: 0; }
li { margin: 0.6mm 0; }
.readback { font: 7.4pt "DejaVu Sans Mono", monospace; background: #f5f5f5; padding: 2mm 3mm;
            border: 0.4pt solid #ccc; }
.readback div { white-space: pre; }
.covers { font-size: 10pt; margin: 1mm 0 2mm 0; }
</style></head>
<body>
<h1>$title</h1>
<div class="meta">$meta</div>
$covers
<div class="code"><div class="value"><span class="label">Verification code:</span> $code</div>
<div class="how">Check it: GET $verify_path recomputes every figure from the stored measurements.</div></div>
<div class="statement">$statement</div>
<h2>Results</h2>
$results
$segments
$schedule
<h2>Scope and boundary</h2>
<p>$boundary</p>
<p><b>Counted</b></p><ul>$counted</ul>
<p><b>Not counted</b></p><ul>$not_counted</ul>
<h2>Methodology</h2>
$methodology
<h2>Inputs and their sources</h2>
$inputs
<h2>Notes</h2>
<ul>$notes</ul>
<div class="verify">
<h2>How to verify</h2>
<p>Ask the control plane that issued this report, no account needed: <b>GET $verify_path</b>
(or GET /api/public/certificates/&lt;code&gt;/verify with the code above). It recomputes every figure from the
job's stored measurements and says whether this report matches them; an altered figure, input or code fails.
A downloaded PDF can be checked the same way (POST it to the same address as <b>file</b>): its printed code
and every word it prints are compared with the report as issued. Every number below is written exactly as
the code covers it ($sig significant figures, plain decimal).</p>
<div class="readback"><div>$readback_title</div>
$readback</div>
</div>
</body></html>
"""
)


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _shown(value: Any) -> str:
    return (
        scalar_text(value) if isinstance(value, int | float) and not isinstance(value, bool) else str(value)
    )


def _estimate_tag(document: Mapping[str, Any], path: str) -> str:
    reasons = (document.get("estimate_basis") or {}).get(path)
    if not reasons:
        return ""
    return f' <span class="est">estimate</span> <span class="why">{_e("; ".join(reasons))}</span>'


def _figure_rows(document: Mapping[str, Any], figures: Sequence[tuple[str, str, str]]) -> str:
    currency = ((document.get("results") or {}).get("cost") or {}).get("currency") or ""
    rows = []
    for path, label, unit in figures:
        value = value_at(document, path)
        unit = unit.format(currency=currency)
        css = "sub" if label.startswith("of which") else ""
        if value is None:
            why = _not_computed_why(document, path)
            cell = f'<td class="num">not computed</td><td class="why">{_e(why)}</td>'
        else:
            cell = (
                f'<td class="num">{_e(_shown(value))} {_e(unit)}</td><td>{_estimate_tag(document, path)}</td>'
            )
        rows.append(f'<tr><td class="{css}">{_e(label)}</td>{cell}</tr>')
    return (
        '<table><tr><th style="width:36%">Figure</th><th style="width:26%">Value</th><th>Rests on</th></tr>'
        + "".join(rows)
        + "</table>"
    )


def _not_computed_why(document: Mapping[str, Any], path: str) -> str:
    inputs, results = document.get("inputs") or {}, document.get("results") or {}
    if path == "results.kgco2e_location":
        return "no carbon intensity was configured"
    if path == "results.kgco2e_market":
        return "no contractual emission factor was given"
    if path == "results.sci.value":
        return str((results.get("sci") or {}).get("why") or "")
    if path.startswith("results.cost"):
        if inputs.get("tariff") is None:
            return "no tariff was given"
        return "part of the energy falls outside the tariff, or no tokens were counted"
    if path == "results.tokens_per_kwh":
        return "no IT energy"
    return ""


def _input_rows(document: Mapping[str, Any]) -> str:
    inputs, results = document["inputs"], document["results"]
    energy = inputs["energy"]
    rows: list[tuple[str, str, str, str]] = []  # input, value, kind, source
    for component, name in (
        ("device", "Accelerator energy"),
        ("cpu", "Host CPU energy"),
        ("memory", "Host memory energy"),
    ):
        d = energy["components"].get(component) or {}
        if d.get("measured"):
            kind = f"measured ({d.get('source')})"
        elif d.get("source") == "estimate":
            kind = "estimate"
        else:
            kind = "not metered"
        how = d.get("how") or d.get("why") or ""
        if d.get("utilisation"):
            how += f"; utilisation: {d['utilisation']}"
        if d.get("scope"):
            how += f"; scope: {d['scope']}"
        sources = [str(d[k]) for k in ("tdp_source", "watts_per_GiB_source", "method_source") if d.get(k)]
        rows.append((name, how, kind, " | ".join(sources)))
    if energy["tried"]:
        rows.append(
            (
                "Meters tried, not available",
                "; ".join(
                    f"{t.get('source')} ({t.get('component')}): {t.get('why')}" for t in energy["tried"]
                ),
                "",
                "",
            )
        )
    pue = inputs["pue"]
    rows.append(
        (
            "PUE",
            _shown(pue["value"]),
            "industry-average default" if pue["default"] else "the cluster's figure",
            str(pue["source"]),
        )
    )
    intensity = inputs["intensity"]
    if intensity is None:
        rows.append(("Grid carbon intensity", "none configured", "", ""))
    else:
        rows.append(
            (
                "Grid carbon intensity",
                f"provider {intensity.get('provider')}, zone {intensity.get('zone')}, {intensity.get('unit')}, "
                f"series {intensity.get('start')} to {intensity.get('end')}; {intensity.get('meaning')}",
                str(intensity.get("kind")),
                str(intensity.get("source")),
            )
        )
    market = inputs["market_factor"]
    rows.append(
        ("Market-based factor", "not given", "", "")
        if market is None
        else (
            "Market-based factor",
            f"{_shown(market['g_per_kwh'])} gCO2e/kWh",
            "contractual",
            str(market["source"]),
        )
    )
    tariff = inputs["tariff"]
    if tariff is None:
        rows.append(("Tariff", "not given", "", ""))
    elif tariff.get("kind") == "flat":
        rows.append(
            ("Tariff", f"{_shown(tariff['price_per_kwh'])} {tariff['unit']}", "flat", str(tariff["source"]))
        )
    else:
        rows.append(
            (
                "Tariff",
                f"time-of-use, {tariff.get('points')} prices, {tariff.get('start')} to {tariff.get('end')}",
                "time-of-use",
                str(tariff.get("source")),
            )
        )
    embodied = inputs["embodied"]
    if embodied is None:
        rows.append(("Embodied carbon (SCI's M)", "not included", "", "no device was given to look one up"))
    elif not embodied.get("available"):
        rows.append(
            (
                "Embodied carbon (SCI's M)",
                f"not included for {embodied.get('device')}",
                "",
                str(embodied.get("reason")),
            )
        )
    else:
        rows.append(
            (
                "Embodied carbon (SCI's M)",
                f"{_shown(embodied['kgco2e_per_device'])} kgCO2e per device x {embodied['count']} "
                f"{embodied['device']}, lifetime {_shown(embodied['lifetime_hours'])} h",
                "approximation"
                if "approximation" in str(embodied.get("confidence", ""))
                else "published figure",
                f"{embodied.get('source', '')} Confidence: {embodied.get('confidence', 'not stated')}.",
            )
        )
    rows.append(
        (
            "Tokens (SCI's R)",
            f"{_shown(results['tokens'])} tokens over {_shown(results['intervals'])} reading intervals",
            "counted by the training loop",
            "",
        )
    )
    body = "".join(
        f"<tr><td>{_e(a)}</td><td>{_e(b)}</td><td>"
        + ('<span class="est">estimate</span>' if c == "estimate" else _e(c))
        + f'</td><td class="src">{_e(d)}</td></tr>'
        for a, b, c, d in rows
    )
    return (
        '<table><tr><th style="width:18%">Input</th><th style="width:32%">Value</th>'
        '<th style="width:15%">Kind</th><th>Source</th></tr>' + body + "</table>"
    )


def _covers(document: Mapping[str, Any]) -> str:
    """The headline: what the figures cover (the whole job; nothing in a version 1 report, whose header says
    which attempt)."""
    c = covers(document.get("results") or {})
    if c is None:
        return ""
    plural = "s" if c["attempts"] != 1 else ""
    text = f"{c['attempts']} attempt{plural}"
    if c["restarts"]:
        text += f" and {c['restarts']} restart{'s' if c['restarts'] != 1 else ''} within them"
    text += f", steps {_shown(c['first_step'])}" if c["first_step"] is not None else ", steps ?"
    text += f" to {_shown(c['last_step'])}; "
    again = c["trained_twice"]
    text += (
        "steps trained twice: not known"
        if again is None
        else f"{again} steps trained twice, counted as badput"
    )
    return f'<p class="covers"><b>Covers the whole job</b>: {_e(text)}.</p>'


def _segments_html(document: Mapping[str, Any]) -> str:
    """The split per attempt (and torchrun restart within one): each segment's steps, energy and carbon."""
    segments = (document.get("results") or {}).get("segments")
    if not segments:
        return ""

    def cell(value: Any, unit: str = "") -> str:
        return "not known" if value is None else f"{_shown(value)}{unit}"

    rows = "".join(
        f"<tr><td>attempt {_e(s['attempt'])}"
        + (f", restart {_e(s['restart'])}" if s.get("restart") else "")
        + f'</td><td class="num">{_e(cell(s.get("first_step")))} to {_e(cell(s.get("last_step")))}</td>'
        f'<td class="num">{_e(cell(s.get("trained_again")))}</td>'
        f'<td class="num">{_e(cell(s.get("hours"), " h"))}</td>'
        f'<td class="num">{_e(cell(s.get("kwh"), " kWh"))}</td>'
        f'<td class="num">{_e(cell(s.get("kgco2e"), " kgCO2e"))}</td>'
        f'<td class="num">{_e(cell(s.get("tokens")))}</td></tr>'
        for s in segments
    )
    return (
        "<h2>Attempts and restarts</h2><p>Each segment meters from its own start; the totals above add them "
        "up. Steps a segment trained that a later one trained again (its progress lost to a fault) are "
        "badput.</p>"
        '<table><tr><th style="width:19%">Segment</th><th>Steps</th><th>Trained twice</th><th>Metered</th>'
        "<th>Facility energy</th><th>Location-based</th><th>Tokens</th></tr>" + rows + "</table>"
    )


def _schedule_html(document: Mapping[str, Any]) -> str:
    schedule = (document.get("results") or {}).get("schedule")
    if schedule is None:
        return ""
    intensity = schedule.get("intensity") or {}
    slots = ", ".join(f"{a} to {b}" for a, b in schedule.get("slots") or [])
    return (
        "<h2>Carbon-aware scheduling</h2>"
        f"<p>{_e(schedule['basis'].capitalize())}. Chosen: {_e(slots)} "
        f"({'interruptible' if schedule.get('interruptible') else 'one contiguous run'}, objective "
        f"{_e(schedule.get('objective'))}; intensity: provider {_e(intensity.get('provider'))}, zone "
        f"{_e(intensity.get('zone'))}, kind {_e(intensity.get('kind'))}).</p>"
        + _figure_rows(document, SCHEDULE_FIGURES)
    )


def _html(document: Mapping[str, Any]) -> str:
    for key in ("title", "job", "scope", "methodology", "inputs", "results", "notes", "verification"):
        if key not in document:
            raise ValueError(f"the document lacks {key!r}: render a report from build_certificate(...)")
    job = document["job"]
    code = document["verification"]["code"]
    meta = " · ".join(
        [f"{k.replace('_', ' ')}: {_e(_shown(v))}" for k, v in job.items() if k != "name" and v is not None]
        + [f"issued {_e(document['issued_at'])} by {_e(document.get('issuer', ISSUER))}"]
    )
    methodology = "".join(
        f"<p><b>{_e(m['name'])}</b> (follows: {_e(m['follows'])}). {_e(m['how'])}</p>"
        for m in document["methodology"]
    )
    readback = "\n".join(
        f"<div>{_e(field)} = {_e(scalar_text(value_at(document, field)))}</div>"
        for field in readback_fields(document)
    )
    return _PAGE.substitute(
        title=_e(document["title"]),
        meta=meta,
        code=_e(code),
        verify_path=_e(document["verification"].get("verify_path") or VERIFY_PATH.format(code=code)),
        statement=_e(document["statement"]),
        covers=_covers(document),
        results=_figure_rows(document, key_figures(document)),
        segments=_segments_html(document),
        schedule=_schedule_html(document),
        boundary=_e(document["scope"]["boundary"]),
        counted="".join(f"<li>{_e(x)}</li>" for x in document["scope"]["counted"]),
        not_counted="".join(f"<li>{_e(x)}</li>" for x in document["scope"]["not_counted"]),
        methodology=methodology,
        inputs=_input_rows(document),
        notes="".join(f"<li>{_e(n)}</li>" for n in document["notes"]),
        sig=SIGNIFICANT_FIGURES,
        readback_title=READBACK_START + ":",
        readback=readback,
    )


def _no_fetching(url: str, *args: Any, **kwargs: Any) -> dict:
    raise ValueError(f"the report fetches no external resources (asked for {url})")


def render_pdf(document: dict) -> bytes:
    """The report as an A4 PDF (WeasyPrint), self-contained: inline CSS, the machine's own fonts, nothing
    fetched (any URL is refused)."""
    if not isinstance(document, Mapping):
        raise ValueError("document must be a report (a dict from build_certificate)")
    from weasyprint import HTML  # heavy import (Pango): only where PDFs are made

    return HTML(string=_html(document), url_fetcher=_no_fetching, base_url=None).write_pdf()
