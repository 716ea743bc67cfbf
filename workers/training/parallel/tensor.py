"""Tensor and sequence parallelism with DTensor ``parallelize_module`` (Megatron-LM's layout, as in
torchtitan's ``apply_tp``)."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from workers.training.model import Transformer


def apply_tp(part: Transformer, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Megatron-style TP with DTensor (torchtitan ``apply_tp``): q/k/v and w1/w3 column-parallel, wo and
    w2 row-parallel; with sequence parallel the norms and the residual stream are sharded on the sequence
    dim and the all-reduces become all-gather + reduce-scatter (Korthikanti et al. 2022, sec. 4.2.2).
    MoE layers keep experts whole on every TP rank (no expert tensor parallel): their input is gathered to
    the full sequence and their output re-sharded."""
    seq = Shard(1) if sequence_parallel else Replicate()
    top_plan = {}
    if part.tok_embeddings is not None:
        top_plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if part.norm is not None:
        if sequence_parallel:
            top_plan["norm"] = SequenceParallel()
        top_plan["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Replicate())
    if top_plan:
        parallelize_module(part, tp_mesh, top_plan)
    if part.config.tied_embeddings and part.tok_embeddings is not None and part.output is not None:
        # each module got a DTensor of its own; both are Shard(0) of the same [vocab, hidden] matrix
        part.output.weight = part.tok_embeddings.weight
    for block in part.layers.values():
        plan = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=seq),
        }
        if block.attention.q_norm is not None:
            # Qwen3's per-head q/k norms see only this rank's heads: as replicated DTensors over the heads'
            # dim (torchtitan's Qwen3 plan) their gradients come out partial and are summed over tp
            plan["attention.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
            plan["attention.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        if sequence_parallel:
            plan["attention_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
            plan["attention"] = PrepareModuleInput(
                input_layouts=(Shard(1), None, None), desired_input_layouts=(Replicate(), None, None)
            )
        if block.moe is None:
            plan["feed_forward.w1"] = ColwiseParallel()
            plan["feed_forward.w2"] = RowwiseParallel(output_layouts=seq)
            if block.feed_forward.w3 is not None:
                plan["feed_forward.w3"] = ColwiseParallel()
            if sequence_parallel:
                plan["feed_forward"] = PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                )
        elif sequence_parallel:
            plan["moe"] = PrepareModuleInputOutput(
                input_layouts=(Shard(1),),
                desired_input_layouts=(Replicate(),),
                use_local_input=True,
                output_layouts=(Replicate(),),
                desired_output_layouts=(Shard(1),),
                use_local_output=True,
            )
        parallelize_module(block, tp_mesh, plan)


def tp_shard_count(param: DTensor) -> int:
    """Distinct pieces a DTensor is cut into (product of the mesh sizes of its ``Shard`` dims)."""
    n = 1
    for mesh_dim, placement in enumerate(param.placements):
        if not (placement.is_replicate() or placement.is_partial()):  # Shard and FSDP's _StridedShard
            n *= param.device_mesh.size(mesh_dim)
    return n


def reduce_partial_grads(params: Iterable[nn.Parameter]) -> None:
    """Redistribute gradients that DTensor left ``Partial`` to their parameter's placements."""
    # Without a data-parallel wrapper, DTensor leaves the gradient of a replicated sequence-parallel
    # norm weight as Partial (a partial sum per TP rank); FSDP2/replicate reduce it themselves.
    for p in params:
        g = p.grad
        if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
            p.grad = g.redistribute(g.device_mesh, p.placements)
