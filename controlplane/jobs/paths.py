"""The paths a job request names (its Hugging Face model, tokenizer and corpus) must lie under a directory the
operator allows (``settings.DATA_ROOTS``, ``CANN_TRAIN_DATA_ROOTS``): a user's job reads what their team put
there, never the control plane's files; a job's own code (its entrypoint and working directory) under the
code directories (``settings.CODE_ROOTS``, ``CANN_TRAIN_CODE_ROOTS``). A path is resolved as the nodes would open it (symlinks followed,
``..`` refused outright) before it is compared; each problem is the field's 400. And the control plane's own
directory of a job's attempt (``job_dir``)."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings
from rest_framework.exceptions import ValidationError

from controlplane.jobs.models import TrainingJob

PATH_OPTIONS = ("hf_model", "tokenizer", "data")


def path_problem(value: str, *, code: bool = False) -> str | None:
    """Why ``value`` may not be read by a job (None: it may). ``code``: a user's entrypoint or working
    directory, under the code directories (``settings.CODE_ROOTS``) instead of the data ones."""
    configured = settings.CODE_ROOTS if code else settings.DATA_ROOTS
    roots = [Path(os.path.realpath(r)) for r in configured]
    allowed = ", ".join(str(r) for r in configured) or "none"
    if not roots:
        setting = "CANN_TRAIN_CODE_ROOTS" if code else "CANN_TRAIN_DATA_ROOTS"
        return f"this deployment allows no {'code' if code else 'data'} directories (set {setting})"
    path = Path(value)
    if not path.is_absolute():
        return f"must be an absolute path on the nodes, under one of the allowed directories ({allowed})"
    if ".." in path.parts:
        return "must not contain '..'"
    real = Path(os.path.realpath(path))
    if not any(real == root or root in real.parents for root in roots):
        why = " (a symlink out of them is followed)" if real != path else ""
        return f"{value} is outside the directories this deployment allows ({allowed}){why}"
    try:
        exists = real.exists()
    except OSError as exc:  # a name too long for the filesystem, say: the person's to fix, never a 500
        return f"{value} cannot be read: {exc.strerror or exc}"
    if not exists:
        return f"{value} does not exist"
    return None


def check_job_paths(config: dict) -> None:
    errors = {
        name: [problem]
        for name in PATH_OPTIONS
        if (value := config.get(name)) and (problem := path_problem(str(value)))
    }
    if errors:
        raise ValidationError(errors)


def job_dir(job: TrainingJob, attempt: int) -> Path:
    path = Path(settings.VAR_DIR) / "jobs" / str(job.pk) / f"attempt-{attempt}"
    path.mkdir(parents=True, exist_ok=True)
    return path
