"""The energy and carbon reports of finished jobs: ``/api/certificates/`` (list), ``<code>/`` (the document),
``<code>/pdf`` (download), ``<code>/verify`` (GET: rebuild from the stored measurements and compare; POST a
downloaded PDF: also compare everything it prints). ``/api/public/certificates/<code>/verify`` is the same check
without a login, for anyone holding the report (rate-limited; it shows only what the PDF prints). A report is
issued from its job: ``POST /api/jobs/<id>/certificate/`` (``controlplane.jobs.apis``)."""

from __future__ import annotations

from django.http import Http404, HttpResponse
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from controlplane.green.certificates import (
    certificate_by_code,
    certificate_of,
    certificate_verify,
    certificate_verify_upload,
    certificates_of,
    public_verdict,
)

MAX_PDF_BYTES = 5 * 2**20  # a report is ~40 KB; anything near this is not one


class CertificateRowSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    code = serializers.CharField(help_text="the verification code printed on the report")
    job = serializers.IntegerField(source="job_id")
    job_name = serializers.CharField(source="job.name")
    team = serializers.CharField(source="team.slug")
    issued_at = serializers.DateTimeField()
    kwh = serializers.SerializerMethodField(
        help_text="facility energy of the whole job (a report issued before format 2: of its last attempt)"
    )
    covers = serializers.SerializerMethodField(help_text="'whole job', or 'last attempt' (a format 1 report)")
    kgco2e = serializers.SerializerMethodField(help_text="location-based; null without a carbon intensity")
    estimate = serializers.SerializerMethodField(help_text="true when the energy is an estimate, not metered")
    pdf_url = serializers.SerializerMethodField()
    verify_url = serializers.SerializerMethodField()
    page_url = serializers.SerializerMethodField(help_text="the report's page: its figures, verified")

    def _results(self, obj) -> dict:
        return obj.document.get("results") or {}

    def get_kwh(self, obj) -> float | None:
        return (self._results(obj).get("kwh") or {}).get("facility")

    def get_covers(self, obj) -> str:
        return "whole job" if "segments" in self._results(obj) else "last attempt"

    def get_kgco2e(self, obj) -> float | None:
        return self._results(obj).get("kgco2e_location")

    def get_estimate(self, obj) -> bool:
        meter = (obj.document.get("inputs") or {}).get("energy") or {}
        return not meter.get("measured", False)

    def get_pdf_url(self, obj) -> str:
        return f"/api/certificates/{obj.code}/pdf"

    def get_verify_url(self, obj) -> str:
        return f"/api/certificates/{obj.code}/verify"

    def get_page_url(self, obj) -> str:
        return reverse("green-report", args=[obj.code])


class MismatchSerializer(serializers.Serializer):
    field = serializers.CharField()
    certified = serializers.JSONField(allow_null=True, help_text="what the report (or the PDF) says")
    recomputed = serializers.JSONField(allow_null=True, help_text="what the stored measurements give")


class VerificationSerializer(serializers.Serializer):
    valid = serializers.BooleanField()
    code_matches = serializers.BooleanField()
    figures_match = serializers.BooleanField()
    mismatches = MismatchSerializer(many=True)
    checked = serializers.CharField()
    pdf = serializers.JSONField(
        required=False, help_text="the uploaded PDF's own comparison, when one was sent"
    )


class PublicJobSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()


class PublicVerificationSerializer(serializers.Serializer):
    code = serializers.CharField()
    job = PublicJobSerializer(help_text="as the report prints it")
    issued_at = serializers.CharField()
    valid = serializers.BooleanField()
    code_matches = serializers.BooleanField()
    figures_match = serializers.BooleanField()
    mismatches = MismatchSerializer(many=True, help_text="among the figures the PDF prints")
    other_differences = serializers.IntegerField(
        help_text="differences of the stored report outside what the PDF prints (its team sees them)"
    )
    checked = serializers.CharField()
    pdf = serializers.JSONField(
        required=False, help_text="the uploaded PDF's own comparison, when one was sent"
    )


class PdfUploadSerializer(serializers.Serializer):
    file = serializers.FileField(help_text="the report PDF as downloaded")


def _report(request, code: str):
    report = certificate_of(request.user, code)
    if report is None:  # another team's report, a mistyped code or none: the same 404
        raise Http404("No such report among your teams' reports.")
    return report


class CertificateListApi(APIView):
    @extend_schema(responses={200: CertificateRowSerializer(many=True)})
    def get(self, request):
        """Your teams' energy and carbon reports, newest first."""
        return Response(CertificateRowSerializer(certificates_of(request.user)[:500], many=True).data)


class CertificateDetailApi(APIView):
    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request, code: str):
        """The report's document: scope, methodology, inputs with sources, results, notes, verification."""
        return Response(_report(request, code).document)


class CertificatePdfApi(APIView):
    @extend_schema(responses={(200, "application/pdf"): OpenApiTypes.BINARY})
    def get(self, request, code: str):
        """The report as a PDF (A4), as it was issued."""
        report = _report(request, code)
        response = HttpResponse(bytes(report.pdf), content_type="application/pdf")
        response["Content-Disposition"] = (
            f'attachment; filename="energy-report-job{report.job_id}-{report.code}.pdf"'
        )
        return response


class CertificateVerifyApi(APIView):
    parser_classes = [MultiPartParser, FormParser]

    @extend_schema(responses={200: VerificationSerializer})
    def get(self, request, code: str):
        """Rebuild the report from the job's stored measurements and compare it with the stored one, field by
        field; the code (an HMAC of the document) must match too. ``valid`` false names every difference."""
        return Response(certificate_verify(_report(request, code)))

    @extend_schema(
        request={"multipart/form-data": PdfUploadSerializer}, responses={200: VerificationSerializer}
    )
    def post(self, request, code: str):
        """As GET, and also compare everything a downloaded PDF prints (its code, every figure and word) with
        the report as issued."""
        report = _report(request, code)
        return Response(_check_upload(request, report))


def _check_upload(request, report) -> dict:
    data = PdfUploadSerializer(data=request.data)
    data.is_valid(raise_exception=True)
    upload = data.validated_data["file"]
    if upload.size > MAX_PDF_BYTES:
        raise ValidationError({"file": [f"at most {MAX_PDF_BYTES // 2**20} MiB: a report is ~40 KB"]})
    try:
        return certificate_verify_upload(report, upload.read())
    except ValueError as exc:
        raise ValidationError({"file": [str(exc)]}) from None


def _public_report(code: str):
    report = certificate_by_code(code)
    if report is None:
        raise Http404("No report has that verification code: check it against the one printed on the report.")
    return report


THROTTLED = OpenApiResponse(
    OpenApiTypes.OBJECT, description="too many checks from this caller: try again after Retry-After seconds"
)


class PublicCertificateVerifyApi(APIView):
    """The check a report's holder runs without an account: the report says anyone holding it can ask the
    control plane that issued it. By the printed code only; it answers what the PDF itself prints (the
    verdict, and which printed figure differs), never the team's other data; rate-limited per caller
    (``CANN_TRAIN_REPORT_CHECKS_RATE``, 20/min by default)."""

    permission_classes = [AllowAny]
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "report-check"
    parser_classes = [MultiPartParser, FormParser]

    @extend_schema(responses={200: PublicVerificationSerializer, 429: THROTTLED})
    def get(self, request, code: str):
        """Whether the report with this code still matches the stored measurements (no login)."""
        report = _public_report(code)
        return Response(public_verdict(report, certificate_verify(report)))

    @extend_schema(
        request={"multipart/form-data": PdfUploadSerializer},
        responses={200: PublicVerificationSerializer, 429: THROTTLED},
    )
    def post(self, request, code: str):
        """As GET, and whether a downloaded PDF prints exactly the issued report (no login)."""
        report = _public_report(code)
        return Response(public_verdict(report, _check_upload(request, report)))
