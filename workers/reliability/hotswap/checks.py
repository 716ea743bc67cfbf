"""What a hot-swap run accepts: every reason it cannot run, as one ``ValueError``."""

from __future__ import annotations

from workers.reliability.hotswap.limits import FAULT_KINDS


def check_hot_swap_input(
    cfg,
    replicas: int,
    *,
    steps: int,
    inject,
    heartbeat_timeout_ms: int,
    timeout_s: float,
    target: int | None = None,
    spares: int = 0,
) -> list[tuple[str, int]]:
    """Every reason this run cannot be a hot-swap run, as one ``ValueError``; the faults, sorted by step."""
    errors: list[str] = []
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 2:
        errors.append(
            f"replicas must be an integer >= 2 (a survivor must keep training while one is replaced), got {replicas!r}"
        )
        replicas = 0
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        errors.append(f"steps must be an integer >= 1, got {steps!r}")
        steps = 0
    if (
        isinstance(heartbeat_timeout_ms, bool)
        or not isinstance(heartbeat_timeout_ms, int)
        or heartbeat_timeout_ms < 1
    ):
        errors.append(f"heartbeat_timeout_ms must be an integer >= 1, got {heartbeat_timeout_ms!r}")
    if not isinstance(timeout_s, int | float) or isinstance(timeout_s, bool) or not timeout_s > 0:
        errors.append(f"timeout_s must be a number > 0, got {timeout_s!r}")
    if isinstance(spares, bool) or not isinstance(spares, int) or spares < 0:
        errors.append(f"spares must be an integer >= 0, got {spares!r}")
    if target is not None and (
        isinstance(target, bool) or not isinstance(target, int) or not 0 <= target < max(replicas, 1)
    ):
        errors.append(f"target must be a replica index in 0..{replicas - 1}, got {target!r}")
    faults: list[tuple[str, int]] = []
    for item in inject or ():
        if not isinstance(item, list | tuple) or len(item) != 2:
            errors.append(f"inject items are (kind, step) pairs, got {item!r}")
            continue
        kind, step = item
        if kind not in FAULT_KINDS:
            errors.append(f"unknown fault kind {kind!r} for hot swap (known: {', '.join(FAULT_KINDS)})")
            continue
        if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step < max(steps, 1):
            errors.append(
                f"{kind}@step={step!r}: the step must be an integer in 1..{steps - 1} "
                "(a fault fires after a committed step, before the last one)"
            )
            continue
        faults.append((kind, step))
    errors += _layout_errors(cfg, replicas)
    if errors:
        raise ValueError("; ".join(errors))
    return sorted(faults, key=lambda f: f[1])


def _layout_errors(cfg, replicas: int) -> list[str]:
    """Hot swap replaces whole data-parallel replicas of one rank each: a layout that splits the model
    (TP/PP/CP/EP) or shards it across the replicas (ZeRO/FSDP) loses state with any one process."""
    from workers.training.config import JobConfig

    if not isinstance(cfg, JobConfig):
        return [f"cfg must be a JobConfig, got {type(cfg).__name__}"]
    errors = []
    s = cfg.strategy
    split = {name: getattr(s, name) for name in ("tp", "pp", "cp", "ep") if getattr(s, name) > 1}
    if split:
        degrees = ", ".join(f"{k}={v}" for k, v in split.items())
        errors.append(
            f"strategy.{next(iter(split))}: hot swap replaces data-parallel replicas; a failure in a "
            f"{degrees} group breaks the group, use restart recovery (whole-group restart from a snapshot)"
        )
    if s.zero_stage:
        errors.append(
            f"strategy.zero_stage: hot-swap replicas hold the whole model (plain data parallel); got zero_stage "
            f"{s.zero_stage}, whose shards die with their rank: use zero_stage 0 or restart recovery"
        )
    if cfg.model.moe is not None:
        errors.append(
            "model.moe: hot swap trains dense models (MoE balancing is not exchanged between replicas)"
        )
    if cfg.comm_hook:
        errors.append("comm_hook: hot-swap replicas all-reduce plain gradients; leave comm_hook out")
    if replicas:
        gbs, mbs = cfg.training.global_batch_size, s.micro_batch_size
        if gbs % (replicas * mbs):
            errors.append(
                f"training.global_batch_size: must be divisible by replicas*micro_batch_size "
                f"({replicas}*{mbs}), got {gbs}"
            )
    return errors
