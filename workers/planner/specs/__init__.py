"""Typed inputs of the planner: the JSON contracts (``model.json``, ``cluster.json``, ``training.json``,
``strategy.json``) as dataclasses that parse and validate themselves.

Every ``from_dict`` raises :class:`SpecError` naming each offending field and the rule it breaks, so the
CLI can print it and a DRF serializer can turn it into field-level 400s. ``to_dict`` gives back the
contract shape with the same field names.

One module per document: ``model`` (``model.json``), ``cluster`` (``cluster.json``), ``training``
(``training.json``), ``strategy`` (``strategy.json`` and the pipeline stage split); ``validation`` holds
what every parser shares (:class:`SpecError`, the field bounds, the checker), ``inputs`` parses the three
inputs of a search at once and ``schema`` derives each document's JSON schema. Every name is importable
from here.
"""

from .cluster import ClusterSpec, DeviceSpec, LinkSpec, TierSpec
from .inputs import load_inputs
from .model import ACTIVATIONS, OWN_ARCHITECTURE, OWN_FAMILY, ArchitectureSpec, ModelSpec, MoESpec
from .schema import FIELD_CHOICES, document_schema
from .strategy import (
    PLAIN_STRATEGY,
    RECOMPUTE_MODES,
    RECOMPUTE_SHORT,
    STRATEGY_FIELDS,
    Strategy,
    balanced_stage_split,
    stage_split_problem,
    stage_split_summary,
    strategy_short_name,
)
from .training import DTYPE_BYTES, DTYPES, FRAMEWORKS, OPTIMIZERS, TrainingConfig
from .validation import DOCUMENT_NAMES, MAX_NAME_CHARS, MAXIMA, SpecError, name_problem

__all__ = [
    "ACTIVATIONS",
    "OWN_ARCHITECTURE",
    "OWN_FAMILY",
    "ArchitectureSpec",
    "DOCUMENT_NAMES",
    "DTYPES",
    "DTYPE_BYTES",
    "FRAMEWORKS",
    "MAXIMA",
    "MAX_NAME_CHARS",
    "OPTIMIZERS",
    "PLAIN_STRATEGY",
    "RECOMPUTE_MODES",
    "RECOMPUTE_SHORT",
    "STRATEGY_FIELDS",
    "FIELD_CHOICES",
    "ClusterSpec",
    "DeviceSpec",
    "LinkSpec",
    "MoESpec",
    "ModelSpec",
    "SpecError",
    "Strategy",
    "TierSpec",
    "TrainingConfig",
    "balanced_stage_split",
    "document_schema",
    "load_inputs",
    "name_problem",
    "stage_split_problem",
    "stage_split_summary",
    "strategy_short_name",
]
