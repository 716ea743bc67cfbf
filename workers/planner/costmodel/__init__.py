"""The analytical cost model: FLOPs, memory and communication of a parallel layout, vectorised.

Every function takes a :class:`Layouts` (one numpy array per strategy field, one element per candidate)
so that ``evaluate`` (one layout) and ``search`` (a million) run the same code. Only numpy is imported.

Units: bytes, seconds, FLOPs. ``T`` is tokens per micro-batch on one context-parallel rank
(``micro_batch_size * seq_length / cp``).

Pipeline stages may be uneven (``strategy.layers_per_stage``). Each layout's split is summarised by the
layers on its first stage, on its heaviest middle stage and on its last stage
(:meth:`CostModel.stage_layers`); each of the three is charged its own layers, the first the embedding
and the last the LM head, logits and loss; step time follows the slowest of them and memory the largest.

One module per concern: ``layouts`` (the candidate arrays), ``placement`` (which links and switches a
parallel group crosses), ``collectives`` (the alpha-beta collective times), ``compute``, ``memory`` and
``communication`` (the terms of :class:`CostModel`, one method per parallel dimension in the last) and
``step``, where :class:`CostModel` composes them into step time and throughput. Every name is importable
from here.
"""

from .collectives import (
    all_reduce_time,
    all_to_all_time,
    p2p_time,
    reduce_scatter_time,
    shard_collective_time,
)
from .compute import gemm_efficiency, gemm_time
from .layouts import RECOMPUTE_CODES, RECOMPUTE_NAMES, GiB, Layouts
from .placement import (
    CANDIDATE_ORDERS,
    DEFAULT_ORDER,
    GroupLinks,
    block_per_node,
    cross_tier_fraction,
    dense_order,
    gradient_group_stride,
    group_links,
    group_strides,
)
from .step import CostModel

__all__ = [
    "CANDIDATE_ORDERS",
    "DEFAULT_ORDER",
    "RECOMPUTE_CODES",
    "RECOMPUTE_NAMES",
    "CostModel",
    "GiB",
    "GroupLinks",
    "Layouts",
    "all_reduce_time",
    "all_to_all_time",
    "block_per_node",
    "cross_tier_fraction",
    "dense_order",
    "gemm_efficiency",
    "gemm_time",
    "gradient_group_stride",
    "group_links",
    "group_strides",
    "p2p_time",
    "reduce_scatter_time",
    "shard_collective_time",
]
