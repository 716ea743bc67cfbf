"""The degrees of one run, this rank's coordinates in them and the ``DeviceMesh`` they span (torchtitan's
``parallel_dims.py``).

Rank layout: the strategy's ``order`` (``strategy.order``, innermost first, default ``tp-cp-ep-dp-pp``).
Its dense dimensions (the order without ``ep``) number the ranks, innermost fastest, exactly as the
planner's :func:`~workers.planner.costmodel.group_strides` assumes: the innermost dimension has stride 1,
the next the size of the first, and so on. The default ``tp-cp-dp-pp`` gives
``rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank`` (tensor parallel innermost: the
fastest links; pipeline outermost); ``cp-tp-ep-dp-pp`` puts the context-parallel peers on consecutive ranks
instead, ``tp-cp-ep-pp-dp`` places the pipeline stages of a replica before the replicas.

Parameters are replicated over the ``dp * cp`` ranks of a stage, so DDP/FSDP reduce gradients over that
flattened ``dp_cp`` group, numbered with the one of ``cp`` / ``dp`` that comes first in the order
fastest (its index ``dc`` in :meth:`ParallelDims.coordinates`). Expert-parallel groups are ``ep``
consecutive members of it (Megatron-Core's expert decomposition, the planner's ``group_strides``); the
``dp * cp / ep`` ranks that hold the same experts form the expert-data-parallel (``edp``) group.

Where ``ep`` sits in the order does not matter (the planner costs such orders alike,
:func:`~workers.planner.costmodel.dense_order`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch.distributed.device_mesh import DeviceMesh

from workers.training.config import ParallelConfig

DEFAULT_ORDER = "tp-cp-ep-dp-pp"
"""The planner's default placement (``Strategy.order``, ``workers.planner.costmodel.DEFAULT_ORDER``)."""
DIMENSIONS = ("tp", "cp", "ep", "dp", "pp")


@dataclass(frozen=True)
class ParallelDims:
    """The degrees of one run and this rank's coordinates in them (torchtitan's ``ParallelDims``)."""

    dp: int
    tp: int
    pp: int
    ep: int
    world_size: int
    cp: int = 1
    order: str = DEFAULT_ORDER
    """Rank placement, innermost first: a permutation of ``tp-cp-ep-dp-pp`` (``strategy.order``)."""

    def __post_init__(self):
        if self.dp * self.cp * self.tp * self.pp != self.world_size:
            raise ValueError(
                f"tp*pp*dp*cp = {self.tp}*{self.pp}*{self.dp}*{self.cp} = "
                f"{self.dp * self.cp * self.tp * self.pp} but the world size is {self.world_size}"
            )
        if self.replicas % self.ep:
            raise ValueError(f"ep ({self.ep}) must divide dp*cp ({self.replicas})")
        if not isinstance(self.order, str) or sorted(self.order.split("-")) != sorted(DIMENSIONS):
            raise ValueError(f"order must be a permutation of {'-'.join(DIMENSIONS)}, got {self.order!r}")

    @property
    def replicas(self) -> int:
        """Ranks of one stage holding the same (non-expert) parameters: ``dp * cp``."""
        return self.dp * self.cp

    @classmethod
    def from_strategy(cls, s: ParallelConfig, world_size: int) -> ParallelDims:
        return cls(dp=s.dp, tp=s.tp, pp=s.pp, ep=s.ep, world_size=world_size, cp=s.cp, order=s.order)

    # ------------------------------------------------------------------------------------------ layout

    @cached_property
    def dense_order(self) -> tuple[str, ...]:
        """The dimensions that number the ranks, innermost first: ``order`` without ``ep``."""
        return tuple(p for p in self.order.split("-") if p != "ep")

    @property
    def sizes(self) -> dict[str, int]:
        return {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp}

    @cached_property
    def strides(self) -> dict[str, int]:
        """Global-rank distance between neighbours of each dense dimension (the planner's ``group_strides``
        of tp / cp / dp / pp)."""
        out, acc = {}, 1
        for name in self.dense_order:
            out[name] = acc
            acc *= self.sizes[name]
        return out

    @cached_property
    def replica_dims(self) -> tuple[str, str]:
        """``(outer, inner)`` of ``dp`` / ``cp``: the inner one (first in the order) varies fastest in the
        flattened ``dp_cp`` index and in the expert-parallel groups carved from it."""
        if self.dense_order.index("cp") < self.dense_order.index("dp"):
            return "dp", "cp"
        return "cp", "dp"

    def rank_of(self, pp: int = 0, dp: int = 0, cp: int = 0, tp: int = 0) -> int:
        """The global rank at a (pp, dp, cp, tp) coordinate (the inverse of :meth:`coordinates`)."""
        coords = {"pp": pp, "dp": dp, "cp": cp, "tp": tp}
        for name, c in coords.items():
            if not 0 <= c < self.sizes[name]:
                raise ValueError(f"{name} coordinate {c} is outside 0..{self.sizes[name] - 1}")
        return sum(coords[name] * self.strides[name] for name in self.dense_order)

    def coordinates(self, rank: int) -> dict[str, int]:
        """This rank's index in each dimension: ``pp``, ``dp``, ``cp``, ``tp``; ``dp_cp``, its index in the
        flattened replica group (the inner of dp / cp fastest); ``ep`` and ``edp``, its index in the
        expert-parallel group and which of them it is (``dp_cp = edp * ep + ep_rank``)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside 0..{self.world_size - 1}")
        out = {name: (rank // self.strides[name]) % self.sizes[name] for name in ("pp", "dp", "cp", "tp")}
        outer, inner = self.replica_dims
        dc = out[inner] + self.sizes[inner] * out[outer]
        out.update(dp_cp=dc, ep=dc % self.ep, edp=dc // self.ep)
        return out

    def _rank_grid(self) -> torch.Tensor:
        """The global ranks as a ``(pp, outer, inner, tp)`` tensor (``outer``/``inner``: :attr:`replica_dims`),
        ``grid[pp, o, i, tp]`` being the rank at that coordinate."""
        outermost_first = list(reversed(self.dense_order))
        ranks = torch.arange(self.world_size).view(*(self.sizes[n] for n in outermost_first))
        outer, inner = self.replica_dims
        return ranks.permute(*(outermost_first.index(n) for n in ("pp", outer, inner, "tp"))).contiguous()

    def groups(self, rank: int) -> dict[str, list[int]]:
        """The members of each of ``rank``'s groups in coordinate order (``tp``, ``cp``, ``dp``, ``pp``, the
        gradient group ``dp_cp`` and, with ``ep > 1``, ``ep`` and ``edp``): where the order put them."""
        c, grid = self.coordinates(rank), self._rank_grid()
        outer, inner = self.replica_dims
        at = {"pp": c["pp"], outer: c[outer], inner: c[inner], "tp": c["tp"]}
        axes = ("pp", outer, inner, "tp")
        out = {}
        for name in ("tp", "cp", "dp", "pp"):
            index = tuple(slice(None) if a == name else at[a] for a in axes)
            out[name] = grid[index].tolist()
        block = grid[c["pp"], :, :, c["tp"]].flatten().tolist()
        out["dp_cp"] = block
        if self.ep > 1:
            out["ep"] = block[c["edp"] * self.ep : (c["edp"] + 1) * self.ep]
            out["edp"] = block[c["ep"] :: self.ep]
        return out

    def build_mesh(self, device_type: str) -> tuple[DeviceMesh, DeviceMesh | None]:
        """One mesh ``(pp, dp, tp)``, or with ``cp > 1`` ``(pp, dp, cp, tp)`` -- ``(pp, cp, dp, tp)`` when
        ``dp`` comes before ``cp`` in the order -- with its ``dp_cp`` flattening; with ``ep > 1`` a second
        view ``(pp, edp, ep, tp)`` of the same ranks (DeviceMesh cannot split one dim in two after the fact
        without private APIs). Each mesh coordinate is the rank's :meth:`coordinates`.

        The two of dp / cp go outer first because a flattened dim's DTensor coordinate is its row-major
        index in the mesh while its process group numbers members by global rank (FSDP2 shards by the
        latter, DCP places the shards by the former): with the inner one last the two agree."""
        grid = self._rank_grid()
        outer, inner = self.replica_dims
        if self.cp == 1:
            mesh = DeviceMesh(
                device_type, grid.reshape(self.pp, self.dp, self.tp), mesh_dim_names=("pp", "dp", "tp")
            )
        else:
            mesh = DeviceMesh(device_type, grid, mesh_dim_names=("pp", outer, inner, "tp"))
            # DeviceMesh._flatten is private, but it is how torchtitan builds its dp_shard_cp mesh, and FSDP2
            # with TP needs the data-parallel and TP meshes to share one root (a second DeviceMesh would not)
            mesh[outer, inner]._flatten("dp_cp")
        moe_mesh = None
        if self.ep > 1:
            moe_mesh = DeviceMesh(
                device_type,
                grid.reshape(self.pp, self.replicas // self.ep, self.ep, self.tp),
                mesh_dim_names=("pp", "edp", "ep", "tp"),
            )
        return mesh, moe_mesh

    def check_mesh(self, rank: int, mesh: DeviceMesh, moe_mesh: DeviceMesh | None = None) -> None:
        """Raise unless, on this ``rank``, every dim of the meshes :meth:`build_mesh` returned numbers it as
        :meth:`coordinates` does, both as a mesh coordinate (DTensor's) and as its rank in the dim's process
        group (the collectives', torch's pipeline stages'). Local: no communication."""
        want = self.coordinates(rank)
        dims = [(mesh, d) for d in mesh.mesh_dim_names] + ([(mesh, "dp_cp")] if self.cp > 1 else [])
        if moe_mesh is not None:
            dims += [(moe_mesh, "edp"), (moe_mesh, "ep")]
        for m, d in dims:
            sub = m[d]
            got = (sub.get_coordinate()[0], sub.get_local_rank())
            if got != (want[d], want[d]):
                raise RuntimeError(
                    f"rank {rank}: mesh dim {d} numbers it {got} (coordinate, group rank), the layout "
                    f"{self.order} says {want[d]}"
                )

    def replica_mesh(self, mesh: DeviceMesh) -> DeviceMesh:
        """The 1-D mesh over which gradients are reduced: ``dp``, or ``dp_cp`` with context parallelism."""
        return mesh["dp"] if self.cp == 1 else mesh["dp_cp"]
