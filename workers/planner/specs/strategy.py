"""``strategy.json``: one point of the search space (:class:`Strategy`), its plain values
(:data:`PLAIN_STRATEGY`), its one short name, and the pipeline stage split (:func:`balanced_stage_split`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .validation import MAXIMA, DocumentChecker, SpecError

RECOMPUTE_MODES = ("none", "selective", "full")

STRATEGY_FIELDS = (
    "tp",
    "pp",
    "dp",
    "ep",
    "cp",
    "vpp",
    "micro_batch_size",
    "recompute",
    "zero_stage",
    "sequence_parallel",
)

PLAIN_STRATEGY: dict[str, Any] = {
    "tp": 1,
    "pp": 1,
    "dp": 1,
    "ep": 1,
    "cp": 1,
    "vpp": 1,
    "micro_batch_size": 1,
    "recompute": "none",
    "zero_stage": 0,
    "sequence_parallel": False,
}
"""Each strategy field at the value that adds nothing: one rank, nothing sharded, split or recomputed.
:meth:`Strategy.completed` fills the fields a strategy leaves open with it; :meth:`Strategy.short_name`
leaves out the fields at it."""

# the recompute mode in a short name: ``-rsel`` / ``-rfull`` (``none`` is left out)
RECOMPUTE_SHORT = {"selective": "sel", "full": "full"}


def balanced_stage_split(num_layers: int, pp: int) -> tuple[int, ...]:
    """Layers on each of ``pp`` pipeline stages when a strategy does not list them (``layers_per_stage``
    absent): the even split when ``pp`` divides ``num_layers``; otherwise every stage gets
    ``num_layers // pp`` and the remainder goes one layer each to the middle stages, first to last, then
    (only when the remainder is ``pp - 1``) to the first stage.

    Why the middle: at equal layer counts the end stages are the heavy ones -- the first holds the
    embedding and, under 1F1B, ``pp`` micro-batches of activations; the last the LM head, fp32 logits and
    the loss -- so the split that is as even as possible and keeps the ends one layer lighter is the
    balanced one. It is Llama 3 405B's published layout (126 layers on pp = 16: 7, 8 x 14, 7; Dubey et al.
    2024 §3.3.2: one layer fewer on the first and on the last stage, to balance the embedding and the
    output layer and loss) and what Megatron-LM's ``--decoder-first-pipeline-num-layers`` /
    ``--decoder-last-pipeline-num-layers`` express.
    When one layer is left after the middle stages, the first stage takes it: its embedding is a lookup,
    the last stage's LM head a GEMM the size of a fraction of a layer. O(pp), no search."""
    if not 1 <= pp <= num_layers:
        raise ValueError(f"pp={pp} must be between 1 and num_layers ({num_layers})")
    base, extra = divmod(num_layers, pp)
    split = [base] * pp
    for stage in [*range(1, pp - 1), 0][:extra]:
        split[stage] += 1
    return tuple(split)


def stage_split_summary(split) -> tuple[int, int, int]:
    """``(first, middle, last)`` of a stage split: layers on the first stage, the most layers on a stage
    between the first and the last (0 when ``pp <= 2``), and layers on the last stage (the same stage as
    the first when ``pp == 1``). What the cost model needs of a split (see ``CostModel.stage_layers``)."""
    split = tuple(split)
    return split[0], max(split[1:-1], default=0), split[-1]


@dataclass(frozen=True)
class Strategy:
    """One point of the search space (``strategy.json``). Any field may be None: "search it".

    The degrees multiply to the device count: ``tp * pp * dp * cp``; ``ep`` shards the experts over the
    ``dp * cp`` ranks of a pipeline stage. Ranks are placed with ``order`` (innermost first).
    """

    tp: int | None = None
    """Tensor-parallel degree (Megatron-LM column/row split of every layer)."""
    pp: int | None = None
    """Pipeline-parallel stages."""
    dp: int | None = None
    """Data-parallel replicas."""
    ep: int | None = None
    """Expert-parallel degree (divides dp * cp); 1 for dense models."""
    cp: int | None = None
    """Context-parallel degree (sequence split with ring attention)."""
    vpp: int | None = None
    """Virtual pipeline chunks per stage (interleaved 1F1B); 1 = plain 1F1B."""
    micro_batch_size: int | None = None
    """Sequences per micro-batch."""
    recompute: str | None = None
    """Activation recomputation: none, selective (attention core) or full (whole layer)."""
    zero_stage: int | None = None
    """ZeRO stage: 0 none, 1 optimizer states sharded (Megatron distributed optimizer), 2 + gradients,
    3 + parameters (FSDP)."""
    sequence_parallel: bool | None = None
    """Megatron sequence parallelism for the non-tensor-parallel regions (needs tp > 1 to matter)."""
    layers_per_stage: tuple[int, ...] | None = None
    """Transformer layers on each pipeline stage, first to last: ``pp`` integers >= 1 summing to
    ``num_layers`` (the first stage also holds the embedding, the last the LM head and loss). Optional:
    absent (null) is :func:`balanced_stage_split` -- the even split when ``pp`` divides ``num_layers``, else
    the most even one with the end stages a layer lighter (Llama 3 405B: 7, 8 x 14, 7). Uneven stages need
    ``vpp = 1``. Plans write it out whenever their split is uneven."""
    order: str = "tp-cp-ep-dp-pp"
    """Rank placement, innermost (fastest-varying, closest on the topology) first."""

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, *, partial: bool = True) -> Strategy:
        d = d or {}
        c = DocumentChecker(d, "strategy")
        opt = None if partial else dataclasses.MISSING
        spec: dict[str, Any] = {}
        for name in ("tp", "pp", "dp", "ep", "cp", "vpp", "micro_batch_size"):
            spec[name] = c.integer(name, default=opt)
        spec["zero_stage"] = c.integer("zero_stage", minimum=0, default=opt)
        if spec["zero_stage"] is not None and spec["zero_stage"] > 3:
            c.fail("zero_stage", f"must be 0, 1, 2 or 3, got {spec['zero_stage']}")
            spec["zero_stage"] = None
        spec["recompute"] = c.choice("recompute", RECOMPUTE_MODES, default=opt)
        sp = c.get("sequence_parallel")
        if sp is not None and not isinstance(sp, bool):
            c.fail("sequence_parallel", f"must be true, false or null, got {sp!r}")
            sp = None
        elif sp is None and not partial:
            c.fail("sequence_parallel", "is required")
        spec["sequence_parallel"] = sp
        spec["layers_per_stage"] = _layers_per_stage(c, spec["pp"], spec["vpp"])
        order = c.get("order") or "tp-cp-ep-dp-pp"
        parts = order.split("-") if isinstance(order, str) else []
        if sorted(parts) != sorted(["tp", "cp", "ep", "dp", "pp"]):
            c.fail("order", f"must be a permutation of tp-cp-ep-dp-pp, got {order!r}")
            order = "tp-cp-ep-dp-pp"
        spec["order"] = order
        c.done()
        return cls(**spec)

    def to_dict(self) -> dict[str, Any]:
        d = {name: getattr(self, name) for name in STRATEGY_FIELDS}
        if self.layers_per_stage is not None:
            d["layers_per_stage"] = list(self.layers_per_stage)
        if self.order != "tp-cp-ep-dp-pp":
            d["order"] = self.order
        return d

    def fixed_fields(self) -> dict[str, Any]:
        """The fields this (partial) strategy pins, without the ones left to the search."""
        return {k: v for k, v in self.to_dict().items() if v is not None}

    def stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """Layers on each pipeline stage: :attr:`layers_per_stage`, or :func:`balanced_stage_split` when it is
        absent (``pp`` left open counts as 1). Raises :class:`SpecError` (``layers_per_stage``) when the listed
        split does not fit ``pp`` stages of ``num_layers`` layers, and (``pp``) when ``pp`` exceeds the layers."""
        pp = self.pp or 1
        if self.layers_per_stage is None:
            if pp > num_layers:
                raise SpecError("pp", f"pp={pp} exceeds num_layers ({num_layers}): a stage needs a layer")
            return balanced_stage_split(num_layers, pp)
        if problem := stage_split_problem(self.layers_per_stage, pp, num_layers):
            raise SpecError("layers_per_stage", problem)
        return tuple(self.layers_per_stage)

    @property
    def is_complete(self) -> bool:
        return all(getattr(self, name) is not None for name in STRATEGY_FIELDS)

    def completed(self) -> Strategy:
        """This strategy with every field it leaves open (None) at its :data:`PLAIN_STRATEGY` value."""
        return dataclasses.replace(
            self, **{k: v for k, v in PLAIN_STRATEGY.items() if getattr(self, k) is None}
        )

    def short_name(self) -> str:
        """The one short name of a strategy, wherever one is shown (plans, jobs, the runtime's events)::

            tp{tp}-pp{pp}-dp{dp}-ep{ep}[-cp{cp}][-vpp{vpp}][-z{zero_stage}][-r{sel|full}][-sp]

        The four degrees always; ``cp``/``vpp`` above 1, the ZeRO stage above 0, the recompute mode other than
        ``none`` and ``sp`` (sequence parallelism, only with ``tp > 1``: it is a no-op without) when set, in
        that order: ``tp1-pp1-dp2-ep1``, ``tp2-pp4-dp8-ep2-cp2-z1-rsel``, ``tp8-pp8-dp16-ep1-z1-rfull-sp``.
        ``micro_batch_size`` is left out (a batching choice, not a layout: a job keeps its name across batch
        sizes), and so is ``order`` (a placement, not a layout: the runtime places ranks in it).
        Open fields are named at their :data:`PLAIN_STRATEGY` value."""
        s = self.completed()
        parts = [f"tp{s.tp}", f"pp{s.pp}", f"dp{s.dp}", f"ep{s.ep}"]
        if s.cp > 1:
            parts.append(f"cp{s.cp}")
        if s.vpp > 1:
            parts.append(f"vpp{s.vpp}")
        if s.zero_stage:
            parts.append(f"z{s.zero_stage}")
        if s.recompute != "none":
            parts.append(f"r{RECOMPUTE_SHORT[s.recompute]}")
        if s.sequence_parallel and s.tp > 1:
            parts.append("sp")
        return "-".join(parts)


def stage_split_problem(split, pp: int, num_layers: int | None = None) -> str:
    """Why ``split`` cannot be ``layers_per_stage`` of ``pp`` stages (of ``num_layers`` layers, when given);
    "" when it can."""
    if len(split) != pp:
        return f"must list one layer count per pipeline stage (pp={pp}), got {len(split)}"
    if num_layers is not None and sum(split) != num_layers:
        return f"must sum to num_layers ({num_layers}), got {sum(split)} ({', '.join(map(str, split))})"
    return ""


def _layers_per_stage(c: DocumentChecker, pp: int | None, vpp: int | None) -> tuple[int, ...] | None:
    """``strategy.layers_per_stage``: null, or a list of integers >= 1, one per stage (``pp`` of them when
    ``pp`` is given); uneven only with ``vpp = 1``. The sum is checked against the model where the model is
    known (``workers.planner.search.layout_errors``)."""
    name = "layers_per_stage"
    value = c.get(name)
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not value:
        c.fail(name, f"must be a non-empty list of layer counts, one per pipeline stage, got {value!r}")
        return None
    if len(value) > MAXIMA["pp"]:
        c.fail(name, f"must have at most {MAXIMA['pp']:,.0f} stages, got {len(value):,}")
        return None
    bad = [
        f"stage {i}: {v!r}"
        for i, v in enumerate(value)
        if isinstance(v, bool) or not isinstance(v, int | float) or int(v) != v or v < 1
    ]
    if bad:
        shown = ", ".join(bad[:4]) + (", …" if len(bad) > 4 else "")
        c.fail(name, f"entries must be integers >= 1 (every stage holds a layer), got {shown}")
        return None
    split = tuple(int(v) for v in value)
    if any(v > MAXIMA["num_layers"] for v in split):
        c.fail(name, f"entries must be <= {MAXIMA['num_layers']:,.0f} (more than any model has)")
        return None
    if pp is not None and (problem := stage_split_problem(split, pp)):
        c.fail(name, problem)
        return None
    if vpp is not None and vpp > 1 and len(set(split)) > 1:
        c.fail(
            name,
            f"uneven stages ({', '.join(map(str, split))}) need vpp = 1, got vpp={vpp}: interleaved 1F1B "
            "with uneven stages is not supported",
        )
        return None
    return split


def strategy_short_name(doc: dict[str, Any] | None) -> str:
    """:meth:`Strategy.short_name` of a (partial) ``strategy.json`` document; omitted fields count as their
    :data:`PLAIN_STRATEGY` value. Raises :class:`SpecError` when the document breaks the contract."""
    return Strategy.from_dict(doc).short_name()
