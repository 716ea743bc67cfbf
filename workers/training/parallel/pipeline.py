"""Pipeline parallelism: split a plain model into stages and run them with torch's own
``torch.distributed.pipelining`` schedules (1F1B, or interleaved 1F1B with ``vpp`` stages per rank)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

from workers.planner.specs import balanced_stage_split
from workers.training.model import Transformer


def stage_layer_ranges(
    num_layers: int, num_stages: int, layers_per_stage: tuple[int, ...] | list[int] | None = None
) -> list[range]:
    """Layers of each stage: ``layers_per_stage`` consecutive layers each when given (``num_stages`` counts
    summing to ``num_layers``), else as even as possible (earlier stages take the remainder)."""
    if layers_per_stage is None:
        base, extra = divmod(num_layers, num_stages)
        layers_per_stage = [base + (1 if s < extra else 0) for s in range(num_stages)]
    if len(layers_per_stage) != num_stages or sum(layers_per_stage) != num_layers:
        raise ValueError(
            f"layers_per_stage {list(layers_per_stage)} must be {num_stages} counts summing to {num_layers}"
        )
    out, start = [], 0
    for n in layers_per_stage:
        out.append(range(start, start + n))
        start += n
    return out


def pipeline_split(
    model: Transformer,
    pp_rank: int,
    pp: int,
    vpp: int,
    layers_per_stage: tuple[int, ...] | list[int] | None = None,
) -> list[tuple[int, Transformer]]:
    """This rank's stages ``(stage_index, module)``: stage ``i`` lives on pp rank ``i % pp`` (the "loop"
    placement torch's ``ScheduleInterleaved1F1B`` expects). Each stage is a copy of the model with the
    layers it does not own deleted, the embedding kept only on stage 0, norm and output only on the last
    (torchtitan's ``pipeline_module_split``).

    With one stage per rank (``vpp == 1``) the layers split as ``layers_per_stage`` (the strategy's) or,
    when it is absent, as the planner's :func:`~workers.planner.specs.balanced_stage_split` costs them;
    virtual stages (``vpp > 1``, even splits only in the planner) as evenly as possible."""
    num_stages = pp * vpp
    if layers_per_stage is not None and vpp != 1:
        raise ValueError(f"layers_per_stage needs vpp = 1 (one stage per rank), got vpp={vpp}")
    if layers_per_stage is None and vpp == 1:
        layers_per_stage = balanced_stage_split(model.config.num_layers, pp)
    ranges = stage_layer_ranges(model.config.num_layers, num_stages, layers_per_stage)
    parts = []
    for stage_index in range(pp_rank, num_stages, pp):
        part = copy.deepcopy(model)
        for layer_id in list(part.layers.keys()):
            if int(layer_id) not in ranges[stage_index]:
                del part.layers[layer_id]
        if stage_index != 0:
            part.tok_embeddings = None
        if stage_index != num_stages - 1:
            part.norm, part.output = None, None
        parts.append((stage_index, part))
    return parts


def pipeline_bubble_fraction(pp: int, vpp: int, num_microbatches: int) -> float:
    """Idle share of an ideal 1F1B schedule: (p-1)/(v*m + p-1) (Narayanan et al. 2021, sec. 2.2)."""
    if pp == 1:
        return 0.0
    return (pp - 1) / (vpp * num_microbatches + pp - 1)


def build_pipeline_schedule(
    stages: list[tuple[int, nn.Module]],
    num_stages: int,
    device: torch.device,
    group: dist.ProcessGroup,
    num_microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
):
    """torch's schedule over this rank's ``(stage_index, wrapped part)`` stages of ``num_stages`` in all:
    ``Schedule1F1B`` for one stage per rank, ``ScheduleInterleaved1F1B`` for ``vpp`` > 1 of them."""
    pipeline_stages = [
        PipelineStage(part, stage_index, num_stages, device, group=group) for stage_index, part in stages
    ]
    if len(pipeline_stages) > 1:
        return ScheduleInterleaved1F1B(pipeline_stages, num_microbatches, loss_fn=loss_fn)
    return Schedule1F1B(pipeline_stages[0], num_microbatches, loss_fn=loss_fn)
