"""The runtime's side of a Hugging Face model: the model built from its checkpoint instead of a fresh init, and
the trained model written back out as a Hugging Face directory at the end of a run, from any layout.

Export from a parallel run: each pipeline stage's first replica (tp, cp and dp coordinates 0) writes its
stage's tensors as one safetensors shard (``model-0000k-of-0000P.safetensors``, k its pp rank), gathered
from the layout first (a DTensor's ``full_tensor()``: tp and FSDP shards; an all-gather over the EP group for
the experts it split); rank 0 writes the index, ``config.json`` and the tokenizer's files. The directory
must be one filesystem every stage's writer sees (as ``snapshot_dir`` must).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from workers.training.hf.keys import checkpoint_names
from workers.training.hf.weights import (
    INDEX,
    SINGLE,
    hf_state_dict,
    load_hf_weights,
    write_config_and_tokenizer,
)
from workers.training.model import Transformer, skip_default_init

EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_model(cfg) -> Transformer:
    """The run's model: our deterministic init, or for ``cfg.hf_model`` the model without any init (every
    parameter is its checkpoint's: :func:`weights_loader` fills each stage once the layout has split it)."""
    if not cfg.hf_model:
        return Transformer.build(cfg.model, cfg.seed)
    with skip_default_init():
        return Transformer(cfg.model)


def weights_loader(cfg):
    """``parallelize``'s ``load_weights`` for ``cfg.hf_model`` (None without one): a stage's tensors from the
    checkpoint, and zeros for what the checkpoint does not hold (our router's balancing bias)."""
    if not cfg.hf_model:
        return None

    def load(part: Transformer) -> int:
        with torch.no_grad():
            for name, tensor in part.state_dict(keep_vars=True).items():
                if not checkpoint_names(cfg.model, name):
                    tensor.zero_()
        return load_hf_weights(part, cfg.model, cfg.hf_model)  # the tensors read

    return load


def tokenizer_dir(cfg) -> Path | None:
    """The directory of the run's tokenizer files (None for byte tokens)."""
    from workers.training.corpora import tokenizer_for

    file = tokenizer_for(cfg)
    return None if file is None else file.parent


def export_dtype(cfg) -> torch.dtype:
    """The source checkpoint's dtype (a bf16 model goes back bf16), else fp32."""
    source = cfg.model.arch.hf_config or {}  # (our own GPT's architecture carries no config)
    return EXPORT_DTYPES.get(
        str(source.get("dtype") or source.get("torch_dtype") or "float32"), torch.float32
    )


def _full(tensor: torch.Tensor, ep_group) -> torch.Tensor:
    """The whole tensor behind this rank's piece of it (a collective where the layout split it)."""
    from workers.training.parallel.expert import is_expert_param

    whole = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
    if ep_group is not None and is_expert_param(tensor) and dist.get_world_size(ep_group) > 1:
        pieces = [torch.empty_like(whole) for _ in range(dist.get_world_size(ep_group))]
        dist.all_gather(pieces, whole.contiguous(), group=ep_group)
        whole = torch.cat(pieces, dim=0)
    return whole.detach().cpu()


def export_parallel(pm, cfg, out_dir: str | Path, rank: int) -> Path:
    """Every rank calls it (collectives); returns the directory written."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    dims, coords = pm.dims, pm.coords
    ep_group = pm.ep_group if dims.ep > 1 else None
    state: dict[str, torch.Tensor] = {}
    for part in pm.raw_parts:
        seen: set[int] = set()
        for key, tensor in sorted(part.state_dict(keep_vars=True).items()):
            name = key.replace("_checkpoint_wrapped_module.", "")  # recompute's wrapper, where it shows
            if id(tensor) in seen or not checkpoint_names(cfg.model, name):
                continue  # a tied matrix once; what the checkpoint does not hold
            seen.add(id(tensor))
            state[name] = _full(tensor, ep_group)
    writer = coords["tp"] == 0 and coords["cp"] == 0 and coords["dp"] == 0
    dtype = export_dtype(cfg)
    written: dict[str, str] = {}
    if writer:
        out.mkdir(parents=True, exist_ok=True)
        file = SINGLE if dims.pp == 1 else f"model-{coords['pp'] + 1:05d}-of-{dims.pp:05d}.safetensors"
        tensors = {
            k: v.to(dtype) if v.is_floating_point() else v for k, v in hf_state_dict(state, cfg.model).items()
        }
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        written = {k: file for k in tensors} | {
            "": str(sum(v.numel() * v.element_size() for v in tensors.values()))
        }
    maps: list[dict] = [{} for _ in range(dist.get_world_size())] if dist.is_initialized() else [written]
    if dist.is_initialized():
        dist.all_gather_object(maps, written)
    if rank == 0:
        if dims.pp > 1:
            total = sum(int(m.pop("", 0)) for m in maps)
            weight_map = {k: v for m in maps for k, v in m.items()}
            (out / INDEX).write_text(
                json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
            )
        write_config_and_tokenizer(cfg.model, out, tokenizer_dir=tokenizer_dir(cfg), dtype=dtype)
    if dist.is_initialized():
        dist.barrier()
    return out
