"""The three input documents of a search (``model.json``, ``cluster.json``, ``training.json``) parsed at
once."""

from __future__ import annotations

from .cluster import ClusterSpec
from .model import ModelSpec
from .training import TrainingConfig
from .validation import SpecError


def load_inputs(model: dict, cluster: dict, training: dict) -> tuple[ModelSpec, ClusterSpec, TrainingConfig]:
    """Parse the three documents, reporting the errors of all of them at once (fields prefixed with
    ``model.``, ``cluster.``, ``training.``)."""
    errors: dict[str, list[str]] = {}
    out = []
    for prefix, cls, data in (
        ("model", ModelSpec, model),
        ("cluster", ClusterSpec, cluster),
        ("training", TrainingConfig, training),
    ):
        try:
            out.append(cls.from_dict(data))
        except SpecError as exc:
            errors.update(exc.prefixed(prefix).errors)
            out.append(None)
    if errors:
        raise SpecError(errors)
    return out[0], out[1], out[2]
