"""The Green page's parts (its view is the dashboard app's, ``controlplane.dashboard.views.green_page``: it
shows the teams' job energy too, and green sits below jobs) and the energy reports' pages. A report's own
page (``/green/reports/<code>/``) verifies it: against the job's stored measurements on every visit, and
against a downloaded PDF uploaded to it."""

from __future__ import annotations

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render

from controlplane.green.certificate_apis import MAX_PDF_BYTES, CertificateRowSerializer
from controlplane.green.certificates import (
    certificate_of,
    certificate_verify,
    certificate_verify_upload,
)
from workers.green.certificate import covers, value_at


class PdfCheckForm(forms.Form):
    file = forms.FileField(label="A downloaded report (PDF)")

    def clean_file(self):
        upload = self.cleaned_data["file"]
        if upload.size > MAX_PDF_BYTES:
            raise forms.ValidationError(f"At most {MAX_PDF_BYTES // 2**20} MiB: a report is about 40 KB.")
        return upload


# the figures the report page shows, as (label, path in the document's results, unit)
REPORT_FIGURES = (
    ("Facility energy", "kwh.facility", "kWh"),
    ("IT energy", "kwh.it", "kWh"),
    ("Carbon, location-based", "kgco2e_location", "kgCO2e"),
    ("Carbon, market-based", "kgco2e_market", "kgCO2e"),
    ("SCI", "sci.value", "gCO2e per 1M tokens"),
    ("Tokens per kWh", "tokens_per_kwh", ""),
    ("Tokens", "tokens", ""),
    ("Steps trained twice after faults (badput)", "recomputed.steps", "steps"),
    ("Facility energy of the steps trained twice", "recomputed.kwh_facility", "kWh"),
)


@login_required
def green_report(request, code: str):
    """One energy report: its figures, and whether it verifies (the stored document rebuilt from the job's
    measurements on every visit; a downloaded PDF too when one is uploaded here)."""
    report = certificate_of(request.user, code)
    if report is None:  # another team's report, a mistyped code or none: the same 404
        raise Http404("No such report among your teams' reports.")
    form, status, pdf_error = PdfCheckForm(), 200, ""
    pdf = None
    if request.method == "POST":
        form = PdfCheckForm(request.POST, request.FILES)
        if form.is_valid():
            pdf = form.cleaned_data["file"].read()
        else:
            status = 400
    try:
        result = certificate_verify(report) if pdf is None else certificate_verify_upload(report, pdf)
    except ValueError as exc:  # not a readable report PDF: the stored one is still checked and shown
        result, status, pdf_error = certificate_verify(report), 400, str(exc)
    results = report.document.get("results") or {}
    row = CertificateRowSerializer(report).data
    figures = [
        {"label": label, "value": value, "unit": unit, "field": f"results.{path}"}
        for label, path, unit in REPORT_FIGURES
        if (value := value_at(results, path)) is not None
    ]
    return render(
        request,
        "green/report.html",
        {
            "report": report,
            "row": row,
            "document": report.document,
            "figures": figures,
            "covers": covers(results),
            "schedule": results.get("schedule"),
            "result": result,
            "form": form,
            "pdf_error": pdf_error,
            # an upload that could not be read is one clear failure, not a green "Verified." of the stored copy
            "upload_failed": bool(pdf_error or form.errors),
        },
        status=status,
    )
