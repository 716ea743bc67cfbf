"""Energy and carbon reports of finished jobs: issue one (services), read and verify them (selectors).

A report is built by the engine (``workers.green.certificate``) from what the control plane stored for the
job: the run summary's ``energy`` block (the finishing segment's :meth:`EnergyAccount.summary`) and the last
energy event of every segment before it (:func:`controlplane.green.selectors.energy_segments`), added up into
the whole job. Verification rebuilds the report
from the job's stored measurements as they are now, with the report's own issue time and schedule, and
compares it field by field with the stored document; the HMAC over the document (the secret key) catches
an edit of the stored document itself.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework.exceptions import APIException

from controlplane.accounts.selectors import scoped
from controlplane.common.models import JobState
from controlplane.green.certificate_models import GreenCertificate
from controlplane.green.selectors import energy_segments, job_energy


class NoReport(APIException):
    status_code = 409
    default_code = "no_report"


def _secret() -> bytes:
    return settings.SECRET_KEY.encode()


def report_inputs(job, *, format_version: int = 2) -> tuple[dict, dict]:
    """(the job's printed identity, the energy summary) a report of ``job`` is built from; ``NoReport`` with
    what is missing. A report covers the whole job (every attempt and restart, added up by
    :func:`workers.green.certificate.whole_job_summary`); ``format_version`` 1 rebuilds a report issued when
    reports covered the attempt that finished the job, as it was built then."""
    if job.state != JobState.SUCCEEDED:
        raise NoReport(f"Job {job.pk} is {job.state}: a report covers a job that finished (succeeded).")
    summary = (job.measured or {}).get("energy")
    if not summary:
        raise NoReport(
            f"Job {job.pk} has no energy summary: it ran before energy metering, or with energy.enabled false."
        )
    if format_version >= 2:
        return _whole_job_inputs(job, summary)
    totals = job_energy(job) or {}
    identity = _identity(
        job,
        steps=(job.measured or {}).get("steps"),
        attempts=job.attempts,
        results_cover=(
            f"attempt {job.attempts}, the one that finished the job"
            if job.attempts > 1
            else "the job's only attempt"
        ),
        # every attempt's energy up to its last sample (a failed attempt's after it is not known)
        kwh_all_attempts=totals.get("kwh"),
        kgco2e_all_attempts=totals.get("kgco2e"),
    )
    return identity, summary


def _identity(job, **more) -> dict:
    """What a report prints of the job in its header: what it is and where it ran, then ``more``."""
    return {
        "id": job.pk,
        "name": job.name,
        "team": job.team.slug,
        "model": ((job.config or {}).get("model") or {}).get("name"),
        "device": (job.measured or {}).get("device"),
        "world_size": job.world_size,
        "nodes": job.nnodes,
        **more,
    }


def _whole_job_inputs(job, finished: dict) -> tuple[dict, dict]:
    from workers.green.certificate import whole_job_summary

    segments = energy_segments(job)
    if not segments:
        raise NoReport(f"Job {job.pk} has an energy summary but no energy events: its stream was not stored.")
    identity = _identity(
        job,
        attempts=job.attempts,
        last_step=segments[-1]["step"],
        results_cover="the whole job: every attempt and restart, added up",
    )
    return identity, whole_job_summary(finished, segments)


def schedule_of(job) -> dict | None:
    """The carbon-aware schedule the job ran under (its stored result: the predicted saving), or None."""
    schedule = job.green_schedule
    return None if schedule is None else schedule.result


def _build(job, *, issued_at: datetime, schedule: dict | None, format_version: int = 2) -> dict:
    from workers.green.certificate import build_certificate

    identity, summary = report_inputs(job, format_version=format_version)
    return build_certificate(
        job=identity, energy_summary=summary, schedule=schedule, issued_at=issued_at, secret=_secret()
    )


def certificate_issue(*, job, user) -> tuple[GreenCertificate, bool]:
    """The job's report: the one issued before, else a new one (document and PDF). (report, created)."""
    existing = GreenCertificate.objects.filter(job=job).first()
    if existing is not None:
        return existing, False
    from workers.green.certificate import pdf_text, printed_digest, render_pdf

    document = _build(job, issued_at=timezone.now().replace(microsecond=0), schedule=schedule_of(job))
    pdf = render_pdf(document)
    text = pdf_text(pdf)
    try:
        with transaction.atomic():
            report = GreenCertificate.objects.create(
                team=job.team,
                job=job,
                code=document["verification"]["code"],
                digest=document["verification"]["digest"],
                issued_at=datetime.fromisoformat(document["issued_at"]),
                document=document,
                pdf=pdf,
                printed_text=text,
                printed_digest=printed_digest(text, _secret()),
                created_by=user,
            )
    except IntegrityError:  # issued by a concurrent request a moment ago
        return GreenCertificate.objects.get(job=job), False
    return report, True


def certificates_of(user):
    return scoped(GreenCertificate.objects.all(), user).select_related("job", "team").order_by("-issued_at")


def _by_code(reports, code: str) -> GreenCertificate | None:
    """The report of ``reports`` with ``code`` as a person may type it; None for a malformed or unknown one."""
    from workers.green.certificate import normalise_code

    try:
        code = normalise_code(code)
    except ValueError:
        return None
    return reports.filter(code=code).first()


def certificate_of(user, code: str) -> GreenCertificate | None:
    return _by_code(certificates_of(user), code)


def certificate_by_code(code: str) -> GreenCertificate | None:
    """Any team's report by its verification code: what a holder of the PDF has (a code is 100 random-looking
    bits of an HMAC: it cannot be guessed), for the public check. None for a malformed or unknown code."""
    return _by_code(GreenCertificate.objects.select_related("job"), code)


def public_verdict(report: GreenCertificate, result: dict) -> dict:
    """What anyone holding ``report`` learns from a check (``result``: :func:`certificate_verify`'s): the
    verdict, and the differences among what the PDF prints (its verification block's figures and code, and,
    for an uploaded copy, its printed words); any other difference of the stored document is counted, not
    shown (its team sees them)."""
    from workers.green.certificate import readback_fields

    printed = {*readback_fields(report.document), "verification.code"}
    # the split per attempt is printed too (its table)
    shown = [
        m for m in result["mismatches"] if m["field"] in printed or m["field"].startswith("results.segments.")
    ]
    job = report.document.get("job") or {}
    out = {
        "code": report.code,
        "job": {"id": job.get("id"), "name": job.get("name")},
        "issued_at": report.document.get("issued_at"),
        "valid": result["valid"],
        "code_matches": result["code_matches"],
        "figures_match": result["figures_match"],
        "mismatches": shown,
        "other_differences": len(result["mismatches"]) - len(shown),
        "checked": result["checked"],
    }
    if "pdf" in result:
        out["pdf"] = result["pdf"]
    return out


def certificate_verify_upload(report: GreenCertificate, pdf: bytes) -> dict:
    """:func:`certificate_verify` with an uploaded PDF; ``ValueError`` with what a person should do when the
    upload is not a readable report (not a PDF, or one pypdf cannot read: its errors are of many types)."""
    try:
        return certificate_verify(report, pdf=pdf)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - pypdf's errors on a damaged file (PdfReadError and others)
        raise ValueError(
            f"that PDF cannot be read ({type(exc).__name__}): upload the report as downloaded"
        ) from None


def _printed_text(report: GreenCertificate) -> str:
    """The words the issued PDF prints, as stored at issue (its HMAC checked); a report issued before they
    were stored, or whose stored text no longer matches its HMAC, gets them from its stored PDF (stored
    again, so that the next check does not read the PDF)."""
    import hmac

    from workers.green.certificate import pdf_text, printed_digest

    text = report.printed_text
    if text and hmac.compare_digest(report.printed_digest, printed_digest(text, _secret())):
        return text
    text = pdf_text(bytes(report.pdf))
    report.printed_text, report.printed_digest = text, printed_digest(text, _secret())
    GreenCertificate.objects.filter(pk=report.pk).update(
        printed_text=report.printed_text, printed_digest=report.printed_digest
    )
    return text


def certificate_verify(report: GreenCertificate, *, pdf: bytes | None = None) -> dict:
    """Rebuild ``report`` from its job's stored measurements and compare: ``{valid, code_matches,
    figures_match, mismatches: [{field, certified, recomputed}], checked}``. With ``pdf``, everything that
    PDF prints is compared with what the issued one prints (the code, every figure, every word)."""
    from workers.green.certificate import verify_certificate, verify_pdf

    try:
        recomputed = _build(
            report.job,
            issued_at=datetime.fromisoformat(report.document["issued_at"]),
            schedule=schedule_of(report.job),
            format_version=int(report.document.get("format_version") or 1),
        )
    except (NoReport, ValueError) as exc:
        detail = exc.detail if isinstance(exc, APIException) else str(exc)
        return {
            "valid": False,
            "code_matches": False,
            "figures_match": False,
            "mismatches": [
                {"field": "job", "certified": "the stored measurements", "recomputed": str(detail)}
            ],
            "checked": "stored document",
        }
    result = verify_certificate(report.document, recomputed=recomputed, secret=_secret())
    result["checked"] = "stored document"
    if pdf is not None:
        printed = verify_pdf(pdf, report.document, _secret(), expected=_printed_text(report))
        result["pdf"] = printed
        result["valid"] = bool(result["valid"] and printed["valid"])
        result["checked"] = "stored document and the uploaded PDF"
    return result
