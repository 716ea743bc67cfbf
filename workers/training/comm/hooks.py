"""DDP communication hooks, selectable per job by name (the names: ``workers.training.comm_methods``).

``HOOKS`` maps a name to a factory ``(process_group, options, mesh=None) -> (state, hook)``:

=============  ==================================================================================
``allreduce``  torch's plain all-reduce hook (the dense baseline, with our timing)
``fp16``       torch's ``fp16_compress_hook``          ``bf16``  torch's ``bf16_compress_hook``
``powerSGD``   torch's PowerSGD (options of ``PowerSGDState``, plus ``batched``)
``topk_ef``    top-k + error feedback: ``density``, ``warmup_steps``, ``start_density``,
               ``value_dtype`` (fp16|bf16|fp32), ``dense_fallback``
``sign_ef``    scaled sign + error feedback: ``chunk``
``hierarchical`` intra-node reduce-scatter / inter-node all-reduce / intra-node all-gather:
               ``ranks_per_node`` (or a 2-D mesh), ``inter_node`` (dense|topk) + the top-k options
``adaptive``   per bucket dense / fp16 / top-k at a density of ``ladder``, chosen each step from the
               measured link throughput, exposed comm and residual norm (:mod:`.adaptive`)
=============  ==================================================================================

Every state has ``comm_stats()`` (per-step ``comm_s_total``, ``comm_s_exposed``, ``bytes_sent``,
``wire_bytes``, ...; see :mod:`.stats`), ``state_dict()`` and ``load_state_dict()`` (error-feedback
residuals and step counters: part of the training checkpoint).
"""

from __future__ import annotations

from collections.abc import Callable

import torch.distributed as dist

from workers.training.comm import adaptive, compression, hierarchical, torch_hooks
from workers.training.comm.bucketing import choose_bucket_cap_mb


def _topk_ef(process_group, options=None, mesh=None):
    return compression.TopKState(process_group, options), compression.topk_ef_hook


def _sign_ef(process_group, options=None, mesh=None):
    return compression.SignState(process_group, options), compression.sign_ef_hook


def _adaptive(process_group, options=None, mesh=None):
    return adaptive.AdaptiveState(process_group, options), adaptive.adaptive_hook


def _hierarchical(process_group, options=None, mesh=None):
    return hierarchical.HierarchicalState(process_group, options, mesh), hierarchical.hierarchical_hook


def _torch(factory):
    def make(process_group, options=None, mesh=None):
        return factory(process_group, options)

    return make


HOOKS: dict[str, Callable] = {
    "allreduce": _torch(torch_hooks.make_allreduce),
    "fp16": _torch(torch_hooks.make_fp16),
    "bf16": _torch(torch_hooks.make_bf16),
    "powerSGD": _torch(torch_hooks.make_powersgd),
    "topk_ef": _topk_ef,
    "sign_ef": _sign_ef,
    "hierarchical": _hierarchical,
    "adaptive": _adaptive,
}


def _parse_value(text: str):
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_hook_spec(spec: str) -> tuple[str, dict]:
    """``"topk_ef:density=0.01,warmup_steps=200"`` -> ``("topk_ef", {"density": 0.01, "warmup_steps": 200})``."""
    name, _, rest = spec.partition(":")
    options = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"comm hook option {item!r} is not key=value")
        options[key.strip()] = _parse_value(value.strip())
    return name.strip(), options


def build_hook(name: str, process_group=None, options: dict | None = None, mesh=None):
    """``(state, hook)`` for the hook called ``name`` (options may also come as ``name:key=value,...``)."""
    name, spec_options = parse_hook_spec(name)
    if name not in HOOKS:
        raise ValueError(f"unknown comm hook {name!r}; choose from {sorted(HOOKS)}")
    return HOOKS[name](process_group, {**spec_options, **(options or {})}, mesh)


def register_comm_hook(ddp_model, name: str, options: dict | None = None, *, process_group=None, mesh=None):
    """Build the hook called ``name`` for ``ddp_model``'s process group and register it; returns the state
    (query ``state.comm_stats()`` after each backward, checkpoint ``state.state_dict()``)."""
    group = process_group if process_group is not None else getattr(ddp_model, "process_group", None)
    state, hook = build_hook(name, group, options, mesh)
    for store in (getattr(state, "residuals", None), getattr(state, "momentum_buffers", None)):
        if isinstance(store, compression.ResidualStore):
            store.bind_parameter_names(ddp_model.module)
    ddp_model.register_comm_hook(state, hook)
    return state


def get_hook(
    name: str, options: dict | None = None, process_group: dist.ProcessGroup | None = None, mesh=None
):
    """``(hook, state)``, the order ``DistributedDataParallel.register_comm_hook(state, hook)`` is fed in
    by ``workers.training.parallelize``. Prefer :func:`register_comm_hook`, which also names the
    residuals by parameter (stable checkpoints) and uses the DDP model's own process group."""
    state, hook = build_hook(name, process_group, options, mesh)
    return hook, state


__all__ = ["HOOKS", "build_hook", "choose_bucket_cap_mb", "get_hook", "parse_hook_spec", "register_comm_hook"]
