"""The levels of the ``adaptive`` comm hook (:mod:`.adaptive`) and what each costs before it is measured.

A level is a name: ``dense``, ``hier``, ``fp16``, ``topk@<density>`` or ``hier_topk@<density>``. These
functions read a level's collective family, codec, the keys its costs are learnt under, its density and
its flat twin; :func:`parse_ladder` reads the ``ladder`` option.
"""

from __future__ import annotations

# Top-k compression cost per element before the first top-k step measures it: 65-80 ms for 20.7M
# elements in 57 tensors, one uncontended thread (docs/comm.md, "Where top-k's step time goes") ~ 3.5 ns.
TOPK_CODEC_S_PER_ELEMENT = 3.5e-9
# fp16 cast + copy back before it is measured: two passes over fp32 memory, ~2 x 0.4 ns/element at the
# ~10 GB/s one core streams (order of magnitude; replaced by the measurement after one fp16 step).
FP16_CODEC_S_PER_ELEMENT = 1e-9
# 10 % and 1 %; DGC's 0.1 % on request (ladder=0.1/0.01/0.001): on the bench's models it costs loss that
# 300 steps do not recover (comm-tiny, fixed top-k 0.1 % with DGC's recipe: +9.4 % vs dense; each parameter
# is sent a third of a time in the run), and with it in the ladder the controller went there on slow links
DEFAULT_LADDER = (0.1, 0.01)

# the hierarchical families' extra cost per bucket element before it is measured: the shared-memory
# reduce-scatter and all-gather stream the bucket ~3 times (~1 ns/element, as FP16_CODEC_S_PER_ELEMENT), and
# hier_topk also selects the top-k of the rank's 1/L shard (TOPK_CODEC_S_PER_ELEMENT per shard element)
HIER_S_PER_ELEMENT = 1e-9
HIER_FAMILIES = ("hier", "hier_allgather")


def level_family(level: str) -> str:
    """The collective a level's transfer uses (``hier*``: through the node hierarchy)."""
    if level.startswith("hier"):
        return "hier_allgather" if "@" in level else "hier"
    return "allgather" if level.startswith("topk") else "allreduce"


def level_kind(level: str) -> str:
    """The codec a level runs on the autograd thread (the hierarchy's stages run on their own threads)."""
    if level.startswith("hier"):
        return "hier"
    return "topk" if level.startswith("topk") else level


def level_cost_key(level: str) -> str:
    """What a transfer's extra cost is learnt under: the family, or for a top-k level the level itself (a
    larger k costs more per element to select, gather and add: one estimate for 10 % and 1 % made the
    model call 10 % cheap and keep buckets there, 20.7M model)."""
    return level if "@" in level else level_family(level)


def level_codec_key(level: str) -> str:
    """What a level's codec time on the autograd thread is learnt under (a flat top-k level: itself)."""
    return level if level.startswith("topk@") else level_kind(level)


def level_is_sparse(level: str) -> bool:
    """Whether the level withholds an error-feedback residual (a top-k level, flat or hierarchical)."""
    return "@" in level


def level_density(level: str) -> float:
    return float(level.split("@", 1)[1]) if "@" in level else 1.0


def flat_twin(level: str) -> str:
    """The flat level a hierarchical one becomes where the job has no hierarchy (resumed elsewhere)."""
    if level == "hier":
        return "dense"
    return level.removeprefix("hier_")


def parse_ladder(value) -> tuple[float, ...]:
    if isinstance(value, int | float):
        parts = [float(value)]
    else:
        parts = [float(x) for x in str(value).replace("/", " ").split()]
    if not parts or any(not 0.0 < d < 1.0 for d in parts):
        raise ValueError(
            f"adaptive: ladder must be densities in (0, 1) separated by '/' (e.g. 0.1/0.01/0.001), got {value!r}"
        )
    return tuple(sorted(set(parts), reverse=True))
