"""What a run's inputs must be before any rank starts: the checks the CLI (exit 2) and the job API (a 400)
share, each a :class:`~workers.training.config.ConfigError` naming the option."""

from __future__ import annotations

from pathlib import Path


def check_run_inputs(cfg) -> None:
    """What must hold before any rank starts (``ConfigError`` naming the option): the checkpoint is the
    model's and its weights are there; the tokenizer fits the model and the corpus has what it reads."""
    from workers.training.config import ConfigError
    from workers.training.corpora import CorpusError, check_corpus, tokenizer_for

    if cfg.hf_model:
        from workers.training.hf import HFWeightsError, checkpoint_files

        if not Path(cfg.hf_model, "config.json").is_file():
            raise ConfigError("hf_model", f"{cfg.hf_model}: no config.json (a Hugging Face model directory)")
        try:
            checkpoint_files(cfg.hf_model)
        except HFWeightsError as exc:
            raise ConfigError("hf_model", str(exc)) from None
        if differences := model_differences(cfg.model, cfg.hf_model):
            raise ConfigError(
                "model", f"is not the model of hf_model's config.json: {'; '.join(differences)}"
            )
    try:
        tokenizer = tokenizer_for(cfg)
        if tokenizer is not None:
            if cfg.data is None:
                raise CorpusError(
                    "data", "a tokenizer needs a corpus: give data (text, JSONL, Parquet or .npy shards)"
                )
            check_corpus(cfg.data, tokenizer, cfg.data_field, cfg.model.vocab_size)
        elif cfg.val_fraction:
            raise CorpusError(
                "val_fraction", "a validation split needs a tokenizer's corpus (tokenizer or hf_model)"
            )
    except CorpusError as exc:
        raise ConfigError(exc.field, exc.message) from None


def model_differences(model, hf_model: str) -> list[str]:
    """How ``model`` (a ``ModelSpec``) differs from the model of ``hf_model``'s config (its name, sequence
    length and the carried config aside): what its weights would not fit."""
    from workers.planner.specs import SpecError
    from workers.planner.specs.hf import spec_from_hf_config

    try:
        theirs = spec_from_hf_config(hf_model, seq_length=model.seq_length).to_dict()
    except SpecError as exc:
        return [str(exc)]
    ours = model.to_dict()
    out = []
    for key in sorted(set(ours) | set(theirs)):
        if key in ("name", "seq_length"):
            continue
        a, b = ours.get(key), theirs.get(key)
        if key == "architecture":
            a = {k: v for k, v in (a or {}).items() if k != "hf_config"}
            b = {k: v for k, v in (b or {}).items() if k != "hf_config"}
        if a != b:
            out.append(
                f"{key} {a!r} here, {b!r} in the config"
                if key != "architecture"
                else "its architecture differs"
            )
    return out
