"""The degrees of one run, this rank's coordinates in them and the ``DeviceMesh`` they span (torchtitan's
``parallel_dims.py``).

Rank layout: ``rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank`` (tensor parallel
innermost: the fastest links; then context parallel; pipeline outermost). Parameters are replicated over
the ``dp * cp`` ranks of a stage, so DDP/FSDP reduce gradients over that flattened ``dp_cp`` group.
Expert-parallel groups are ``ep`` consecutive ranks of it; the ``dp * cp / ep`` ranks that hold the same
experts form the expert-data-parallel (``edp``) group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh

from workers.training.config import ParallelConfig


@dataclass(frozen=True)
class ParallelDims:
    """The degrees of one run and this rank's coordinates in them (torchtitan's ``ParallelDims``)."""

    dp: int
    tp: int
    pp: int
    ep: int
    world_size: int
    cp: int = 1

    def __post_init__(self):
        if self.dp * self.cp * self.tp * self.pp != self.world_size:
            raise ValueError(
                f"tp*pp*dp*cp = {self.tp}*{self.pp}*{self.dp}*{self.cp} = "
                f"{self.dp * self.cp * self.tp * self.pp} but the world size is {self.world_size}"
            )
        if self.replicas % self.ep:
            raise ValueError(f"ep ({self.ep}) must divide dp*cp ({self.replicas})")

    @property
    def replicas(self) -> int:
        """Ranks of one stage holding the same (non-expert) parameters: ``dp * cp``."""
        return self.dp * self.cp

    @classmethod
    def from_strategy(cls, s: ParallelConfig, world_size: int) -> ParallelDims:
        return cls(dp=s.dp, tp=s.tp, pp=s.pp, ep=s.ep, world_size=world_size, cp=s.cp)

    def coordinates(self, rank: int) -> dict[str, int]:
        dc = (rank // self.tp) % self.replicas  # index in the flattened dp x cp group
        return {
            "pp": rank // (self.tp * self.replicas),
            "dp": dc // self.cp,
            "cp": dc % self.cp,
            "tp": rank % self.tp,
            "ep": dc % self.ep,
            "edp": dc // self.ep,
        }

    def build_mesh(self, device_type: str) -> tuple[DeviceMesh, DeviceMesh | None]:
        """One mesh ``(pp, dp, tp)``, or ``(pp, dp, cp, tp)`` with its ``dp_cp`` flattening when ``cp > 1``;
        with ``ep > 1`` a second view ``(pp, edp, ep, tp)`` of the same ranks (DeviceMesh cannot split one
        dim in two after the fact without private APIs)."""
        ranks = torch.arange(self.world_size)
        if self.cp == 1:
            mesh = DeviceMesh(
                device_type, ranks.view(self.pp, self.dp, self.tp), mesh_dim_names=("pp", "dp", "tp")
            )
        else:
            mesh = DeviceMesh(
                device_type,
                ranks.view(self.pp, self.dp, self.cp, self.tp),
                mesh_dim_names=("pp", "dp", "cp", "tp"),
            )
            # DeviceMesh._flatten is private, but it is how torchtitan builds its dp_shard_cp mesh, and FSDP2
            # with TP needs the data-parallel and TP meshes to share one root (a second DeviceMesh would not)
            mesh["dp", "cp"]._flatten("dp_cp")
        moe_mesh = None
        if self.ep > 1:
            moe_mesh = DeviceMesh(
                device_type,
                ranks.view(self.pp, self.replicas // self.ep, self.ep, self.tp),
                mesh_dim_names=("pp", "edp", "ep", "tp"),
            )
        return mesh, moe_mesh

    def replica_mesh(self, mesh: DeviceMesh) -> DeviceMesh:
        """The 1-D mesh over which gradients are reduced: ``dp``, or ``dp_cp`` with context parallelism."""
        return mesh["dp"] if self.cp == 1 else mesh["dp_cp"]
