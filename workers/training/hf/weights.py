"""Hugging Face safetensors checkpoints into the runtime's model, and the runtime's model back out as a
directory ``transformers.AutoModelForCausalLM.from_pretrained`` loads.

Reading: ``model.safetensors``, or the shards a ``model.safetensors.index.json`` names, opened with
``safetensors.safe_open`` (memory-mapped): a rank reads only the tensors of the module it is given, so a
pipeline stage built first reads only its own layers. Every problem is an :class:`HFWeightsError` naming
the tensor: missing, of another shape, or left over (a checkpoint of another model).

Writing: one ``model.safetensors`` up to ``shard_bytes`` (default 4 GiB), else shards named like the hub's
(``model-00001-of-00003.safetensors``) with their index; the ``config.json``
(:func:`workers.planner.specs.hf.hf_config_from_spec`); the tokenizer files of ``tokenizer_dir`` copied.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from workers.planner.specs import ModelSpec
from workers.planner.specs.hf import hf_config_from_spec
from workers.training.hf.keys import IGNORED, checkpoint_names, is_stacked

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
    "chat_template.jinja",
)
DEFAULT_SHARD_BYTES = 4 << 30


class HFWeightsError(ValueError):
    """A checkpoint that does not fit the model (or cannot be read); the message names the tensor."""


def checkpoint_files(directory: str | Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it."""
    directory = Path(directory)
    if (index := directory / INDEX).exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise HFWeightsError(f"{index}: not a safetensors index ({exc})") from None
        return {name: directory / file for name, file in weight_map.items()}
    if (single := directory / SINGLE).exists():
        from safetensors import safe_open

        with _opened(single, safe_open) as f:
            return {name: single for name in f.keys()}
    raise HFWeightsError(f"{directory}: no {SINGLE} or {INDEX} (Hugging Face safetensors weights)")


def _opened(path: Path, safe_open):
    try:
        return safe_open(str(path), framework="pt")
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for a bad file
        raise HFWeightsError(f"{path}: not a readable safetensors file ({exc})") from None


def load_hf_weights(model: nn.Module, spec: ModelSpec, directory: str | Path, *, strict: bool = True) -> int:
    """Copy the checkpoint's tensors into ``model`` (a whole :class:`Transformer` or a pipeline stage of
    one: only the tensors its parameters need are read). Returns the tensors read. ``strict``: tensors of
    the checkpoint that no layer of the *whole* model names are an error (another model's checkpoint)."""
    from safetensors import safe_open

    files = checkpoint_files(directory)
    state = model.state_dict(keep_vars=True)
    wanted = {name: checkpoint_names(spec, name) for name in _unique_names(state)}
    missing = sorted({key for keys in wanted.values() for key in keys} - set(files))
    if missing:
        raise HFWeightsError(
            f"{directory}: the checkpoint lacks {len(missing)} tensor(s) the model needs, e.g. {', '.join(missing[:3])}"
        )
    if strict:
        _check_leftovers(spec, files, directory)
    handles: dict[Path, object] = {}
    read = 0
    try:
        with torch.no_grad():
            for name, keys in wanted.items():
                if not keys:
                    continue
                parts = []
                for key in keys:
                    path = files[key]
                    if path not in handles:
                        handles[path] = _opened(path, safe_open).__enter__()
                    parts.append(handles[path].get_tensor(key))
                tensor = torch.stack(parts) if is_stacked(name) else parts[0]
                target = state[name]
                if tuple(tensor.shape) != tuple(target.shape):
                    raise HFWeightsError(
                        f"{keys[0]}: shape {tuple(tensor.shape)} in the checkpoint, {tuple(target.shape)} in the model ({name})"
                    )
                target.copy_(tensor.to(target.dtype))
                read += len(keys)
    finally:
        for handle in handles.values():
            handle.__exit__(None, None, None)
    return read


def _unique_names(state: dict[str, torch.Tensor]) -> Iterable[str]:
    """The names of a state dict's parameters and persistent buffers, a tied matrix once (under the
    embedding's name)."""
    seen: set[int] = set()
    for name, tensor in state.items():
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        yield name


def _check_leftovers(spec: ModelSpec, files: dict[str, Path], directory) -> None:
    from workers.training.model import Transformer

    with torch.device("meta"):
        whole = Transformer(spec)
    named = {
        key
        for name in _unique_names(whole.state_dict(keep_vars=True))
        for key in checkpoint_names(spec, name)
    }
    extra = sorted(k for k in set(files) - named if not IGNORED.search(k))
    if extra:
        raise HFWeightsError(
            f"{directory}: {len(extra)} tensor(s) of the checkpoint are not of this model "
            f"({spec.arch.family}, {spec.num_layers} layers), e.g. {', '.join(extra[:3])}"
        )


def hf_state_dict(state: dict[str, torch.Tensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
    """The runtime's full state dict (plain tensors, the runtime's names) in the checkpoint's names."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        keys = checkpoint_names(spec, name)
        if is_stacked(name):
            for e, key in enumerate(keys):
                out[key] = tensor[e].contiguous()
        elif keys:
            out[keys[0]] = tensor.contiguous()
    return out


def save_hf(
    state: dict[str, torch.Tensor],
    spec: ModelSpec,
    out_dir: str | Path,
    *,
    tokenizer_dir: str | Path | None = None,
    dtype: torch.dtype | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> Path:
    """Write ``state`` (the runtime's full state dict, one process) as a Hugging Face model directory."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        k: (v.detach().to("cpu", dtype) if dtype is not None and v.is_floating_point() else v.detach().cpu())
        for k, v in hf_state_dict(state, spec).items()
    }
    for stale in [*out.glob("model*.safetensors"), out / INDEX]:
        stale.unlink(missing_ok=True)
    shards, current, size = [], {}, 0
    for key in sorted(tensors):
        nbytes = tensors[key].numel() * tensors[key].element_size()
        if current and size + nbytes > shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[key] = tensors[key]
        size += nbytes
    shards.append(current)
    if len(shards) == 1:
        save_file(shards[0], str(out / SINGLE), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards, 1):
            name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(out / name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, name))
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        (out / INDEX).write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
        )
    return write_config_and_tokenizer(spec, out, tokenizer_dir=tokenizer_dir, dtype=dtype)


def write_config_and_tokenizer(
    spec: ModelSpec, out: Path, *, tokenizer_dir: str | Path | None = None, dtype: torch.dtype | None = None
) -> Path:
    """A model directory's ``config.json`` (the spec's, in ``dtype``) and its tokenizer's files."""
    config = hf_config_from_spec(spec)
    if dtype is not None:
        config["torch_dtype"] = config["dtype"] = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            if (src := Path(tokenizer_dir) / name).is_file():
                shutil.copyfile(src, out / name)
    return out
