"""The check of a job's energy report over the whole job, shared by the tests whose jobs recover from a
fault: every metered segment (attempt, torchrun restart) is in it and added up, the steps trained twice
counted as badput, and it verifies."""

from __future__ import annotations

import pytest


def check_whole_job_report(client, job_id: int, *, segments: set[tuple[int, int]]) -> dict:
    """Issue the report of job ``job_id`` through the API and check it covers ``segments`` ((attempt,
    restart) pairs), each one's figures its last energy event's; the stored document."""
    from controlplane.green.certificate_models import GreenCertificate
    from controlplane.jobs.models import TrainingJob
    from controlplane.live.models import StreamEvent

    r = client.post(f"/api/jobs/{job_id}/certificate/")
    assert r.status_code == 201, r.content
    row = r.json()
    assert row["covers"] == "whole job"
    document = GreenCertificate.objects.get(code=row["code"]).document
    results = document["results"]
    job = TrainingJob.objects.get(pk=job_id)
    last: dict[tuple[int, int], tuple[int, dict]] = {}
    for step, values in (
        StreamEvent.objects.filter(stream=job.stream, kind="energy")
        .order_by("seq")
        .values_list("step", "values")
    ):
        last[(values.get("attempt") or 1, values.get("restart") or 0)] = (step, values)
    assert set(last) == segments, sorted(last)
    split = {(s["attempt"], s["restart"]): s for s in results["segments"]}
    assert set(split) == segments
    for key, (step, values) in last.items():
        assert split[key]["last_step"] == step and split[key]["kwh"] == pytest.approx(values["kwh"], rel=1e-5)
        assert split[key]["first_step"] == values["from_step"] + 1
    assert results["kwh"]["facility"] == pytest.approx(sum(v["kwh"] for _, v in last.values()), rel=1e-5)
    assert row["kwh"] == results["kwh"]["facility"]
    # a segment's steps after the step the next one resumed from were trained twice: badput
    ordered = [split[k] for k in sorted(split)]
    expected = sum(
        max(0, a["last_step"] - (b["first_step"] - 1)) for a, b in zip(ordered, ordered[1:], strict=False)
    )
    assert results["recomputed"]["steps"] == expected
    assert (results["recomputed"]["kwh_facility"] > 0) == (expected > 0)
    assert document["job"]["results_cover"].startswith("the whole job")
    verdict = client.get(row["verify_url"]).json()
    assert verdict["valid"] and verdict["figures_match"], verdict
    return document
