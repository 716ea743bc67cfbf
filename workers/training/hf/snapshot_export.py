"""A snapshot of a run as a Hugging Face directory, in one process, on any machine that sees the snapshot
(``cann-train export --snapshot DIR --out OUT``).

The snapshot's manifest says its model (``info.model``, the ``model.json`` of the run) and the layout it was
taken on; its model state is loaded into one whole :class:`Transformer` with DCP (the snapshot's own
reader, deltas rebuilt from their full snapshot), the expert weights an expert-parallel run kept per rank
(``...experts.w1@ep0of2``) joined back, and written with :func:`workers.training.hf.weights.save_hf`. A
gradient log (``snapshot_delta: log``) holds gradients, not weights: export the full snapshot it continues,
or the run's end (``save_hf``)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from workers.training.checkpoint import storage
from workers.training.hf.keys import is_stacked
from workers.training.hf.weights import save_hf
from workers.training.model import Transformer, skip_default_init


class ExportError(ValueError):
    """A snapshot that cannot be exported; the message says why and what to do instead."""


def export_snapshot(
    snapshot: str | Path, out: str | Path, *, tokenizer_dir: str | Path | None = None
) -> Path:
    from workers.planner.specs import ModelSpec, SpecError

    snapshot = Path(snapshot)
    root, name = snapshot.parent, snapshot.name
    try:
        info, _ = storage.find_exactly(root, name)
    except (storage.CorruptSnapshot, FileNotFoundError) as exc:
        raise ExportError(f"{snapshot}: {exc}") from None
    manifest = info.manifest
    if manifest.get("kind") == "log":
        base = (manifest.get("base") or {}).get("name", "the full snapshot before it")
        raise ExportError(
            f"{name} is a gradient log, not weights: export {base}, or the run's end (--save-hf)"
        )
    doc = (manifest.get("info") or {}).get("model")
    if not isinstance(doc, dict):
        raise ExportError(f"{name} does not say its model (taken before snapshots recorded it)")
    try:
        spec = ModelSpec.from_dict(doc)
    except SpecError as exc:
        raise ExportError(f"{name}: its model does not parse ({exc})") from None
    if spec.architecture is None:
        raise ExportError(f"{name} is of our own GPT ({spec.name}), which has no Hugging Face form")
    with skip_default_init():
        model = Transformer(spec)
    state = model.state_dict()
    ep = int(((manifest.get("layout") or {}).get("strategy") or {}).get("ep") or 1)
    target: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if key in ("output.weight",) and spec.tied_embeddings:
            continue
        if ep > 1 and is_stacked(key):  # each EP rank's experts under a name of its own
            for i, piece in enumerate(tensor.chunk(ep)):
                target[f"{key}@ep{i}of{ep}"] = piece.clone()
        else:
            target[key] = tensor
    # the snapshot's own reader (not a SnapshotManager: it would tidy the directory a live run writes into)
    dcp.load({"model": target}, storage_reader=storage.SnapshotReader(root, info.name))
    whole = {}
    for key in state:
        if ep > 1 and is_stacked(key):
            whole[key] = torch.cat([target[f"{key}@ep{i}of{ep}"] for i in range(ep)])
        elif key in target:
            whole[key] = target[key]
    return save_hf(whole, spec, out, tokenizer_dir=tokenizer_dir)
