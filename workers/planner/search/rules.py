"""The divisibility rules a layout obeys, shared by :func:`~.what_if.evaluate` (as field errors) and the
enumeration (as rejection counts), and the pipeline stage split of a layout."""

from __future__ import annotations

from ..specs import (
    ClusterSpec,
    ModelSpec,
    Strategy,
    TrainingConfig,
    balanced_stage_split,
    stage_split_problem,
)


def divisors(n: int) -> list[int]:
    """Positive divisors of n, ascending."""
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i * i != n:
                large.append(n // i)
        i += 1
    return small + large[::-1]


def tp_rule(model: ModelSpec, tp: int) -> str | None:
    if model.num_attention_heads % tp or model.num_kv_heads % tp:
        return f"tp={tp} must divide num_attention_heads ({model.num_attention_heads}) and num_kv_heads ({model.num_kv_heads})"
    if model.ffn_hidden_size % tp or (model.moe and model.moe.expert_ffn_hidden_size % tp):
        return f"tp={tp} must divide ffn_hidden_size (and expert_ffn_hidden_size)"
    return None


def cp_rule(model: ModelSpec, cp: int) -> str | None:
    if model.seq_length % cp:
        return f"cp={cp} must divide seq_length ({model.seq_length})"
    return None


def pp_rule(model: ModelSpec, pp: int) -> str | None:
    # pp need not divide the layers (uneven stages, strategy.layers_per_stage), but every stage needs one
    if pp > model.num_layers:
        return (
            f"pp={pp} exceeds num_layers ({model.num_layers}): every pipeline stage needs at least one layer"
        )
    return None


def ep_rule(model: ModelSpec, ep: int, dp: int, cp: int) -> str | None:
    if model.moe is None:
        return None if ep == 1 else f"ep={ep} must be 1 for a dense model"
    if model.moe.num_experts % ep or (dp * cp) % ep:
        return f"ep={ep} must divide num_experts ({model.moe.num_experts}) and dp*cp ({dp * cp})"
    return None


def vpp_rule(model: ModelSpec, pp: int, vpp: int, split: tuple[int, ...] | None = None) -> str | None:
    """``split``: the layers per stage (default: :func:`balanced_stage_split`). Interleaving needs them
    equal: Megatron-LM's and torch's interleaved 1F1B cut every stage into ``vpp`` equal chunks."""
    split = split or balanced_stage_split(model.num_layers, pp)
    if vpp > 1 and len(set(split)) > 1:
        return (
            f"vpp={vpp} needs equal layers per stage; these stages are uneven ({stage_split_text(split)}): "
            "interleaved 1F1B with uneven stages is not supported (use vpp = 1)"
        )
    per_stage = split[0]
    if per_stage % vpp or (vpp > 1 and pp == 1):
        return f"vpp={vpp} must divide the layers per stage ({per_stage}) and needs pp > 1"
    return None


def stage_split_text(split) -> str:
    """``7, 8 x 14, 7``: a stage split with runs of equal counts folded."""
    runs: list[list[int]] = []
    for n in split:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return ", ".join(f"{n} x {k}" if k > 2 else ", ".join([str(n)] * k) for n, k in runs)


def stage_split(model: ModelSpec, pp: int, pinned: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Layers per stage of a layout with ``pp`` stages: the ``pinned`` ``strategy.layers_per_stage`` or the
    balanced split (:func:`balanced_stage_split`)."""
    return tuple(pinned) if pinned is not None else balanced_stage_split(model.num_layers, pp)


def stage_split_errors(model: ModelSpec, s: Strategy) -> dict[str, list[str]]:
    """What is wrong with ``s.layers_per_stage`` for this model (its length is checked by the parser when
    ``pp`` is given; here against ``pp`` and the model's ``num_layers``)."""
    if s.layers_per_stage is None:
        return {}
    problem = stage_split_problem(s.layers_per_stage, s.pp or len(s.layers_per_stage), model.num_layers)
    return {"strategy.layers_per_stage": [problem]} if problem else {}


def layout_errors(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingConfig, s: Strategy
) -> dict[str, list[str]]:
    """Every divisibility rule a complete strategy breaks, keyed by ``strategy.<field>``. A layout may take
    fewer devices than the cluster has: part of one node or whole nodes (``ClusterSpec.devices_problem``)."""
    errors: dict[str, list[str]] = {}

    def add(name, msg):
        if msg:
            errors.setdefault(f"strategy.{name}", []).append(msg)

    world = s.tp * s.pp * s.dp * s.cp
    if problem := cluster.devices_problem(world):
        add("dp", f"tp*pp*dp*cp = {world}: {problem}")
    add("tp", tp_rule(model, s.tp))
    add("cp", cp_rule(model, s.cp))
    add("pp", pp_rule(model, s.pp))
    add("ep", ep_rule(model, s.ep, s.dp, s.cp))
    errors.update(stage_split_errors(model, s))
    if not errors.get("strategy.pp") and not errors.get("strategy.layers_per_stage"):
        add("vpp", vpp_rule(model, s.pp, s.vpp, s.layers_per_stage))
    gbs = training.global_batch_size
    if gbs % (s.dp * s.micro_batch_size):
        add(
            "micro_batch_size",
            f"dp*micro_batch_size = {s.dp * s.micro_batch_size} must divide global_batch_size ({gbs})",
        )
    elif s.vpp > 1 and (gbs // (s.dp * s.micro_batch_size)) % s.pp:
        add(
            "vpp",
            f"interleaving needs the {gbs // (s.dp * s.micro_batch_size)} micro-batches to be divisible by pp={s.pp}",
        )
    return errors
