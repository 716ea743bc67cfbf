"""A Hugging Face job's trained model as a download: the directory its ranks wrote at the end (``save_hf``:
``submit.hf_export_dir_of``), zipped once beside it (the zip is rebuilt when the directory is newer)."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from rest_framework.exceptions import APIException, NotFound

from controlplane.common.models import JobState
from controlplane.jobs.models import TrainingJob


class ExportNotReady(APIException):
    status_code = 409
    default_detail = "The job's export is written when it succeeds."


def hf_export_zip(job: TrainingJob) -> Path:
    """The zip of ``job``'s Hugging Face export (404: it has none; 409: not yet)."""
    save = (job.config or {}).get("save_hf")
    if not save:
        raise NotFound(
            f"Job {job.pk} did not start from a Hugging Face checkpoint (hf_model): it has no export."
        )
    if job.state != JobState.SUCCEEDED:
        raise ExportNotReady(
            f"Job {job.pk} is {job.state}: its Hugging Face export is written when it succeeds."
        )
    directory = Path(save)
    files = sorted(p for p in directory.glob("*") if p.is_file()) if directory.is_dir() else []
    if not any(p.name == "config.json" for p in files):
        raise NotFound(
            f"Job {job.pk}'s export is missing from {directory} (the run ended without writing it)."
        )
    target = directory.with_suffix(".zip")
    newest = max(p.stat().st_mtime for p in files)
    if not target.exists() or target.stat().st_mtime < newest:
        tmp = target.with_suffix(f".zip.tmp-{os.getpid()}")
        with zipfile.ZipFile(tmp, "w") as z:
            for p in files:  # safetensors do not compress: stored; the JSON files deflated
                kind = zipfile.ZIP_STORED if p.suffix == ".safetensors" else zipfile.ZIP_DEFLATED
                z.write(p, arcname=p.name, compress_type=kind)
        os.replace(tmp, target)
    return target
