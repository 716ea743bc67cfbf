"""A job's tags and notes: what people write on it, checked."""

from __future__ import annotations

from rest_framework.exceptions import ValidationError

from controlplane.jobs.models import TrainingJob
from controlplane.live.feeds import notify_after_commit

MAX_TAGS, TAG_MAX_CHARS, NOTES_MAX_CHARS = 20, 40, 10_000


def _bad_characters(text: str, allowed: str = "") -> list[str]:
    """Control characters (Unicode Cc) and lone surrogates (Cs: no database stores them) in ``text``."""
    import unicodedata

    bad = {c for c in text if c not in allowed and unicodedata.category(c) in ("Cc", "Cs")}
    return [f"U+{ord(c):04X}" for c in sorted(bad)]


def clean_tags(tags: list) -> list[str]:
    """At most 20 labels of 1-40 characters, no control characters; surrounding spaces stripped, repeats
    dropped (first kept)."""
    if not isinstance(tags, list):
        raise ValidationError({"tags": ["must be a list of strings"]})
    out: list[str] = []
    for i, tag in enumerate(tags):
        if not isinstance(tag, str):
            raise ValidationError({"tags": [f"tag {i + 1} must be a string, got {type(tag).__name__}"]})
        tag = tag.strip()
        if not 1 <= len(tag) <= TAG_MAX_CHARS:
            raise ValidationError(
                {"tags": [f"tag {i + 1} has {len(tag)} characters; a tag has 1 to {TAG_MAX_CHARS}"]}
            )
        if bad := _bad_characters(tag):
            raise ValidationError({"tags": [f"tag {i + 1} contains control characters ({', '.join(bad)})"]})
        if tag not in out:
            out.append(tag)
    if len(out) > MAX_TAGS:
        raise ValidationError({"tags": [f"{len(out)} tags; a job carries at most {MAX_TAGS}"]})
    return out


def clean_notes(notes: str) -> str:
    """Free text of at most 10,000 characters; line breaks and tabs are fine, other control characters
    are not."""
    if not isinstance(notes, str):
        raise ValidationError({"notes": ["must be a string"]})
    if len(notes) > NOTES_MAX_CHARS:
        raise ValidationError({"notes": [f"{len(notes):,} characters; at most {NOTES_MAX_CHARS:,}"]})
    if bad := _bad_characters(notes, allowed="\n\r\t"):
        raise ValidationError({"notes": [f"contains control characters ({', '.join(bad)})"]})
    return notes


def job_annotate(*, job: TrainingJob, tags: list | None = None, notes: str | None = None) -> TrainingJob:
    """Set a job's tags and/or notes (each replaces what was there); open job lists of the team refresh."""
    changed = []
    if tags is not None:
        job.tags = clean_tags(tags)
        changed.append("tags")
    if notes is not None:
        job.notes = clean_notes(notes)
        changed.append("notes")
    if changed:
        job.save(update_fields=[*changed, "updated_at"])
        notify_after_commit("jobs", job.team_id, {"id": job.pk, "annotated": changed})
    return job
