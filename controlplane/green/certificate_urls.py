"""``/api/certificates/``: energy and carbon reports by their verification code (certificate_apis.py)."""

from django.urls import path

from controlplane.green import certificate_apis as apis

urlpatterns = [
    path("", apis.CertificateListApi.as_view(), name="certificate-list"),
    path("<str:code>/", apis.CertificateDetailApi.as_view(), name="certificate-detail"),
    path("<str:code>/pdf", apis.CertificatePdfApi.as_view(), name="certificate-pdf"),
    path("<str:code>/verify", apis.CertificateVerifyApi.as_view(), name="certificate-verify"),
]
