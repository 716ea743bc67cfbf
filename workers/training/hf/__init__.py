"""Hugging Face models in and out of the runtime: a ``config.json`` becomes ``model.json``
(:func:`workers.planner.specs.hf.spec_from_hf_config`, the planner's), its safetensors weights load into the
runtime's :class:`~workers.training.model.Transformer` (:mod:`.weights`, names mapped by :mod:`.keys`), and a
trained model goes back out as a directory ``transformers`` loads."""

from workers.planner.specs.hf import FAMILIES, hf_config_from_spec, read_hf_config, spec_from_hf_config
from workers.training.hf.keys import checkpoint_names
from workers.training.hf.weights import (
    HFWeightsError,
    checkpoint_files,
    hf_state_dict,
    load_hf_weights,
    save_hf,
)

__all__ = [
    "FAMILIES",
    "HFWeightsError",
    "checkpoint_files",
    "checkpoint_names",
    "hf_config_from_spec",
    "hf_state_dict",
    "load_hf_weights",
    "read_hf_config",
    "save_hf",
    "spec_from_hf_config",
]
