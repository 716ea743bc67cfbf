"""Forms of the job pages."""

from __future__ import annotations

from django import forms

from controlplane.jobs.selectors import MAX_COMPARED, jobs_of


class CompareForm(forms.Form):
    """``?ids=1,2,3``: 1 to 5 distinct jobs of the user's teams."""

    ids = forms.CharField(max_length=200, help_text=f"comma-separated job ids, at most {MAX_COMPARED}")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user

    def clean_ids(self) -> list[int]:
        raw = [part.strip() for part in self.cleaned_data["ids"].split(",") if part.strip()]
        # ids are 64-bit in the database: a longer number is no job (not an overflow deep in the query)
        bad = [part for part in raw if not (part.isascii() and part.isdigit() and len(part) <= 18)]
        if bad:
            raise forms.ValidationError(
                f"Job ids are whole numbers separated by commas; {', '.join(repr(b) for b in bad[:3])} is not."
            )
        ids = list(dict.fromkeys(int(part) for part in raw))
        if not ids:
            raise forms.ValidationError("Pick at least one job to compare.")
        if len(ids) > MAX_COMPARED:
            raise forms.ValidationError(
                f"Compare at most {MAX_COMPARED} jobs at once; you picked {len(ids)}."
            )
        found = set(jobs_of(self.user).filter(pk__in=ids).values_list("pk", flat=True))
        missing = [i for i in ids if i not in found]
        if missing:
            raise forms.ValidationError(
                f"No job {', '.join(f'#{i}' for i in missing)} among your teams' jobs."
            )
        return ids

    def jobs(self):
        by_id = {j.pk: j for j in jobs_of(self.user).filter(pk__in=self.cleaned_data["ids"])}
        return [by_id[i] for i in self.cleaned_data["ids"]]
