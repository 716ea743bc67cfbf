"""The control plane's API as the green CLI uses it: submit a job (carbon-aware or not), follow it, fetch its
energy and carbon report. Plain HTTP with a token (``requests``): the engine holds no job, the control plane
stores it and its measurements, so the CLI asks it, as any other API client would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

TERMINAL = ("succeeded", "failed", "cancelled")


class ApiError(RuntimeError):
    """The control plane refused (``status`` 4xx: the message says what to fix) or failed (5xx)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _message(response) -> str:
    try:
        body = response.json()
    except ValueError:
        body = response.text[:300]
    detail = body.get("detail", body) if isinstance(body, dict) else body
    return f"HTTP {response.status_code}: {detail}"


@dataclass
class ControlPlane:
    url: str
    token: str
    timeout_s: float = 120.0

    def __post_init__(self):
        import requests

        self.url = self.url.rstrip("/")
        self._http = requests.Session()
        self._http.headers.update({"Authorization": f"Token {self.token}", "Accept": "application/json"})

    def _call(self, method: str, path: str, ok: tuple[int, ...] = (200,), **kw):
        import requests

        try:
            response = self._http.request(method, f"{self.url}{path}", timeout=self.timeout_s, **kw)
        except requests.RequestException as exc:
            raise ApiError(0, f"cannot reach the control plane at {self.url}: {exc}") from exc
        if response.status_code not in ok:
            raise ApiError(response.status_code, _message(response))
        return response

    def submit_job(self, body: dict) -> dict:
        """``POST /api/jobs/``: the new job's row (state ``queued``, or ``scheduled`` for a carbon-aware one)."""
        return self._call("POST", "/api/jobs/", ok=(201,), json=body).json()

    def job(self, job_id: int) -> dict:
        return self._call("GET", f"/api/jobs/{job_id}/").json()

    def follow(
        self,
        job_id: int,
        *,
        every_s: float = 2.0,
        timeout_s: float | None = None,
        sleep: Callable = time.sleep,
    ) -> Iterator[dict]:
        """The job's row every ``every_s`` until it ends (the last one yielded is terminal), or until
        ``timeout_s`` has passed (the last one yielded is not: the job goes on without us)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            row = self.job(job_id)
            yield row
            if row["state"] in TERMINAL or (deadline is not None and time.monotonic() >= deadline):
                return
            sleep(every_s)

    def report(self, job_id: int) -> tuple[dict, bytes, bool]:
        """Issue (or fetch the one issued before) the job's energy and carbon report: ``(row, pdf, issued)``;
        ``issued`` is False when the report existed already."""
        issued = self._call("POST", f"/api/jobs/{job_id}/certificate/", ok=(200, 201))
        row = issued.json()
        pdf = self._call("GET", row["pdf_url"])
        if not pdf.content.startswith(b"%PDF"):
            raise ApiError(pdf.status_code, f"{row['pdf_url']} did not answer a PDF")
        return row, pdf.content, issued.status_code == 201
