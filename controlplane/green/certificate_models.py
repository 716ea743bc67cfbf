"""The energy and carbon report of a finished job (imported by ``controlplane.green.models``)."""

from __future__ import annotations

from django.db import models

from controlplane.common.models import TeamOwned


class GreenCertificate(TeamOwned):
    """An issued report: the document (``workers.green.certificate.build_certificate``) and its PDF, exactly
    as issued. ``code`` is the verification code printed on it (an HMAC of the document under the secret
    key); verifying rebuilds the document from the job's stored measurements."""

    job = models.OneToOneField("jobs.TrainingJob", on_delete=models.CASCADE, related_name="certificate")
    code = models.CharField(max_length=24, unique=True)
    digest = models.CharField(max_length=64, help_text="HMAC-SHA256 of the document, hex")
    issued_at = models.DateTimeField()
    document = models.JSONField()
    pdf = models.BinaryField()
    printed_text = models.TextField(
        default="", blank=True, help_text="the text the PDF prints (what an uploaded copy is compared with)"
    )
    printed_digest = models.CharField(
        max_length=64, default="", blank=True, help_text="HMAC-SHA256 of the printed words, hex"
    )
    created_by = models.ForeignKey(
        "auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        app_label = "green"
        ordering = ["-issued_at"]

    def __str__(self) -> str:
        return f"report {self.code} of job {self.job_id}"
