"""Candidate enumeration: every layout that obeys the divisibility rules and the pinned fields, as the
base rows and options of a factored grid (:meth:`~workers.planner.costmodel.Layouts.grid`), with the
rejections counted by reason."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from ..costmodel import RECOMPUTE_CODES
from ..specs import ClusterSpec, ModelSpec, Strategy, TrainingConfig, stage_split_summary
from .rules import cp_rule, divisors, pp_rule, stage_split, tp_rule

# rejection reasons (keys of stats["rejected"])
R_TP = "tp does not divide attention/kv heads (or ffn sizes)"
R_CP = "cp does not divide seq_length"
R_PP = "pp exceeds num_layers"
R_DP = "dp does not divide global_batch_size"
R_EP = "ep does not divide num_experts and dp*cp"
R_VPP = "vpp does not divide layers per stage (or pp == 1)"
R_VPP_UNEVEN = "vpp > 1 with uneven pipeline stages (not supported)"
R_INTERLEAVE = "interleaved schedule needs micro-batches divisible by pp"
R_MBS = "micro_batch_size does not divide the batch per replica"
R_MEM = "exceeds device memory"


def _options(fixed: Any, values: list) -> list:
    return values if fixed is None else [v for v in values if v == fixed] or []


def _pinned_pp(fixed: Strategy) -> int | None:
    """The pp a partial strategy pins: its ``pp``, or the length of a pinned ``layers_per_stage``."""
    return fixed.pp if fixed.layers_per_stage is None else len(fixed.layers_per_stage)


def enumerate_layouts(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingConfig, fixed: Strategy
) -> tuple[np.ndarray, tuple[list, list, list], Counter]:
    """All layouts obeying the divisibility rules and the fixed fields, factored as ``base`` rows
    (tp, cp, pp, dp, ep, vpp, mbs, and with a pinned split the first, heaviest middle and last stage's
    layers) times ``extras`` = (recompute codes, ZeRO stages, sp flags) for :meth:`Layouts.grid`;
    rejections are counted by reason at the level where the rule fires (one count per rejected partial
    layout).

    Each pp gets one stage split: ``fixed.layers_per_stage`` (which pins pp to its length) or the balanced
    split (:func:`balanced_stage_split`: even when pp divides the layers)."""
    n = cluster.num_devices
    gbs = training.global_batch_size
    pinned = fixed.layers_per_stage
    fixed_pp = _pinned_pp(fixed)
    rejected: Counter = Counter()
    blocks: list[np.ndarray] = []
    # a pinned split travels with the rows; the balanced one the cost model works out from pp itself
    # (CostModel.stage_layers), which keeps the common case's grid as small as it was
    columns = 7 if pinned is None else 10
    for tp in _options(fixed.tp, divisors(n)):
        if tp_rule(model, tp):
            rejected[R_TP] += 1
            continue
        for cp in _options(fixed.cp, divisors(n // tp)):
            if cp_rule(model, cp):
                rejected[R_CP] += 1
                continue
            for pp in _options(fixed_pp, divisors(n // (tp * cp))):
                if pp_rule(model, pp):
                    rejected[R_PP] += 1
                    continue
                dp = n // (tp * cp * pp)
                if fixed.dp is not None and dp != fixed.dp:
                    continue
                if gbs % dp:
                    rejected[R_DP] += 1
                    continue
                if model.moe is None:
                    eps = _options(fixed.ep, [1])
                    if fixed.ep not in (None, 1):
                        rejected[R_EP] += 1
                else:
                    eps = []
                    for ep in _options(fixed.ep, divisors(model.moe.num_experts)):
                        if (dp * cp) % ep:
                            rejected[R_EP] += 1
                        else:
                            eps.append(ep)
                    if fixed.ep is not None and model.moe.num_experts % fixed.ep:
                        rejected[R_EP] += 1
                split = stage_split(model, pp, pinned)
                vpps = []
                if len(set(split)) > 1:  # uneven stages: plain 1F1B only
                    vpps = _options(fixed.vpp, [1])
                    if fixed.vpp not in (None, 1):
                        rejected[R_VPP_UNEVEN] += 1
                else:
                    per_stage = split[0]
                    for v in _options(fixed.vpp, divisors(per_stage)):
                        if v > 1 and pp == 1:
                            rejected[R_VPP] += 1
                        else:
                            vpps.append(v)
                    if fixed.vpp is not None and per_stage % fixed.vpp:
                        rejected[R_VPP] += 1
                per_replica = gbs // dp
                mbss = _options(fixed.micro_batch_size, divisors(per_replica))
                if fixed.micro_batch_size is not None and per_replica % fixed.micro_batch_size:
                    rejected[R_MBS] += 1
                if not (eps and vpps and mbss):
                    continue
                # the (ep, vpp, mbs) sub-grid of this (tp, cp, pp) in numpy: a Python loop over it
                # dominated the search time
                ne, nv, nm = len(eps), len(vpps), len(mbss)
                e = np.repeat(np.asarray(eps, dtype=np.int64), nv * nm)
                v = np.tile(np.repeat(np.asarray(vpps, dtype=np.int64), nm), ne)
                b = np.tile(np.asarray(mbss, dtype=np.int64), ne * nv)
                bad = (v > 1) & ((per_replica // b) % pp != 0)
                rejected[R_INTERLEAVE] += int(bad.sum())
                keep = ~bad
                k = int(keep.sum())
                block = np.empty((k, columns), dtype=np.int64)
                block[:, 0], block[:, 1], block[:, 2], block[:, 3] = tp, cp, pp, dp
                block[:, 4], block[:, 5], block[:, 6] = e[keep], v[keep], b[keep]
                if pinned is not None:
                    block[:, 7], block[:, 8], block[:, 9] = stage_split_summary(split)
                blocks.append(block)
    base = np.concatenate(blocks) if blocks else np.zeros((0, columns), dtype=np.int64)
    extras = (
        [RECOMPUTE_CODES[fixed.recompute]] if fixed.recompute else [0, 1, 2],
        [fixed.zero_stage] if fixed.zero_stage is not None else [0, 1, 2, 3],
        [int(fixed.sequence_parallel)] if fixed.sequence_parallel is not None else [0, 1],
    )
    return base, extras, rejected


def dp_degrees_allowed(model: ModelSpec, cluster: ClusterSpec, fixed: Strategy) -> list[int]:
    """The data-parallel degrees left once tp, cp and pp obey the model's shape (and the fixed fields)."""
    n, out = cluster.num_devices, set()
    for tp in _options(fixed.tp, divisors(n)):
        if tp_rule(model, tp):
            continue
        for cp in _options(fixed.cp, divisors(n // tp)):
            if cp_rule(model, cp):
                continue
            for pp in _options(_pinned_pp(fixed), divisors(n // (tp * cp))):
                dp = n // (tp * cp * pp)
                if not pp_rule(model, pp) and fixed.dp in (None, dp):
                    out.add(dp)
    return sorted(out)
