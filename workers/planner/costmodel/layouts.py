"""Candidate layouts as numpy arrays (:class:`Layouts`: one array per strategy field, one element per
candidate), the recompute codes they use, and the two per-layout facts every cost term reads of the
recompute mode (:func:`recompute_flags`, :func:`layer_passes`)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from ..specs import Strategy, stage_split_summary

GiB = float(1 << 30)
RECOMPUTE_CODES = {"none": 0, "selective": 1, "full": 2}
RECOMPUTE_NAMES = {v: k for k, v in RECOMPUTE_CODES.items()}


@dataclass
class Layouts:
    """Candidate strategies as parallel numpy arrays (recompute coded 0 none, 1 selective, 2 full)."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray
    cp: np.ndarray
    vpp: np.ndarray
    mbs: np.ndarray
    rc: np.ndarray
    zero: np.ndarray
    sp: np.ndarray
    first_layers: np.ndarray | None = None
    """Layers on the first pipeline stage. None, with the two below: the balanced split of each ``pp``
    (:func:`~workers.planner.specs.balanced_stage_split`), which the cost model works out itself."""
    mid_layers: np.ndarray | None = None
    """Most layers on a stage between the first and the last (0 when pp <= 2)."""
    last_layers: np.ndarray | None = None
    """Layers on the last pipeline stage (the first stage itself when pp == 1)."""

    def arrays(self) -> list[tuple[str, np.ndarray]]:
        """``(field name, array)`` of the fields this instance holds (a stage split left out is skipped)."""
        return [(f.name, getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None]

    @property
    def shape(self) -> tuple[int, ...]:
        """Broadcast shape of the fields: (n,) for a flat list, (rows, extras) for a factored grid."""
        return np.broadcast_shapes(*(a.shape for _name, a in self.arrays()))

    def __len__(self) -> int:
        return int(np.prod(self.shape))

    @classmethod
    def from_strategies(cls, strategies: list[Strategy], num_layers: int | None = None) -> Layouts:
        """The strategies as arrays. Their stage splits are carried when any lists ``layers_per_stage``
        (the others then take :meth:`Strategy.stage_layers` of ``num_layers``, which is required);
        otherwise left to the cost model (the balanced split of each ``pp``)."""

        def col(name, conv=int):
            return np.array([conv(getattr(s, name)) for s in strategies], dtype=np.int64)

        stages: dict[str, np.ndarray] = {}
        if any(s.layers_per_stage is not None for s in strategies):
            if num_layers is None and any(s.layers_per_stage is None for s in strategies):
                raise ValueError("num_layers is needed to split the strategies without layers_per_stage")
            rows = [stage_split_summary(s.layers_per_stage or s.stage_layers(num_layers)) for s in strategies]
            for j, name in enumerate(("first_layers", "mid_layers", "last_layers")):
                stages[name] = np.array([r[j] for r in rows], dtype=np.int64)
        return cls(
            tp=col("tp"),
            pp=col("pp"),
            dp=col("dp"),
            ep=col("ep"),
            cp=col("cp"),
            vpp=col("vpp"),
            mbs=col("micro_batch_size"),
            rc=np.array([RECOMPUTE_CODES[s.recompute] for s in strategies]),
            zero=col("zero_stage"),
            sp=col("sequence_parallel", lambda v: 1 if v else 0),
            **stages,
        )

    @classmethod
    def grid(cls, base: np.ndarray, rcs, zeros, sps) -> Layouts:
        """A factored grid: ``base`` rows (tp, cp, pp, dp, ep, vpp, mbs[, first, mid, last stage layers])
        times the recompute, ZeRO and sequence-parallel options, as arrays of shape (rows,1,1,1),
        (1,R,1,1), (1,1,Z,1), (1,1,1,S) that numpy broadcasts: a term is computed once per distinct value of
        the fields it depends on."""
        b = [base[:, i].reshape(-1, 1, 1, 1) for i in range(base.shape[1])]
        stages = {}
        if len(b) >= 10:
            stages = dict(first_layers=b[7], mid_layers=b[8], last_layers=b[9])
        return cls(
            tp=b[0],
            cp=b[1],
            pp=b[2],
            dp=b[3],
            ep=b[4],
            vpp=b[5],
            mbs=b[6],
            rc=np.asarray(rcs, dtype=np.int64).reshape(1, -1, 1, 1),
            zero=np.asarray(zeros, dtype=np.int64).reshape(1, 1, -1, 1),
            sp=np.asarray(sps, dtype=np.int64).reshape(1, 1, 1, -1),
            **stages,
        )

    def take(self, idx) -> Layouts:
        """Rows of a flat list."""
        return Layouts(**{name: a[idx] for name, a in self.arrays()})

    def flat(self, index: tuple[np.ndarray, ...] | None = None) -> Layouts:
        """A flat list of the layouts at ``index`` (a tuple from ``np.nonzero`` on the grid shape)."""
        shape = self.shape
        out = {}
        for name, a in self.arrays():
            arr = np.broadcast_to(a, shape)
            out[name] = arr[index] if index is not None else arr.reshape(-1)
        return Layouts(**out)

    def strategy(self, i: int, order: str = "tp-cp-ep-dp-pp") -> Strategy:
        """The i-th layout of a flat list as a :class:`Strategy` (without ``layers_per_stage``: the arrays
        hold only a summary of the split; ``search`` writes the split out)."""
        return Strategy(
            tp=int(self.tp[i]),
            pp=int(self.pp[i]),
            dp=int(self.dp[i]),
            ep=int(self.ep[i]),
            cp=int(self.cp[i]),
            vpp=int(self.vpp[i]),
            micro_batch_size=int(self.mbs[i]),
            recompute=RECOMPUTE_NAMES[int(self.rc[i])],
            zero_stage=int(self.zero[i]),
            sequence_parallel=bool(self.sp[i]),
            order=order,
        )


def recompute_flags(L: Layouts) -> tuple[np.ndarray, np.ndarray]:
    """``(full, selective)`` recompute of each layout as 0.0 / 1.0 floats."""
    return (L.rc == 2).astype(np.float64), (L.rc == 1).astype(np.float64)


def layer_passes(L: Layouts) -> np.ndarray:
    """Forward-pass equivalents a layer runs per micro-batch."""
    full, _sel = recompute_flags(L)
    return 3.0 + full  # forward, backward (2x forward, Narayanan et al. SC'21 §3.1) and recompute
