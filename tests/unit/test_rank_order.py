"""The runtime places ranks in the planner's ``strategy.order``: the groups ``ParallelDims.coordinates``
implies have the member strides the planner's ``group_strides`` / ``gradient_group_stride`` cost, and the
``DeviceMesh`` ``build_mesh`` returns numbers every rank as ``coordinates`` does (checked on torch's fake
process group: one process plays each rank in turn, no communication)."""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np
import pytest
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.testing._internal.distributed.fake_pg import FakeStore

from workers.planner.costmodel import (
    CANDIDATE_ORDERS,
    DEFAULT_ORDER,
    Layouts,
    gradient_group_stride,
    group_strides,
)
from workers.planner.specs import Strategy
from workers.training.config import ParallelConfig
from workers.training.parallel.dims import DEFAULT_ORDER as RUNTIME_DEFAULT_ORDER
from workers.training.parallel.dims import ParallelDims

DEGREES = {
    "tp2-cp2-dp2-pp2-ep2": dict(tp=2, cp=2, dp=2, pp=2, ep=2),
    "tp2-dp4-ep4": dict(tp=2, cp=1, dp=4, pp=1, ep=4),
    "cp2-dp2-ep2": dict(tp=1, cp=2, dp=2, pp=1, ep=2),
    "tp2-cp2-dp4-pp2-ep4": dict(tp=2, cp=2, dp=4, pp=2, ep=4),  # EP spans cp and part of dp
    "cp4-dp2-pp2-ep2": dict(tp=1, cp=4, dp=2, pp=2, ep=2),  # EP inside cp, EDP across cp and dp
}
ALL_ORDERS = ["-".join(p) for p in itertools.permutations(["tp", "cp", "ep", "dp", "pp"])]


def dims_of(degrees: dict, order: str) -> ParallelDims:
    w = degrees["tp"] * degrees["cp"] * degrees["dp"] * degrees["pp"]
    return ParallelDims(world_size=w, order=order, **degrees)


def groups(d: ParallelDims, kind: str) -> list[list[int]]:
    """The rank groups of ``kind`` by coordinates alone: the ranks agreeing on the coordinates it fixes."""
    fixed = {
        "tp": ("pp", "dp", "cp"),
        "cp": ("pp", "dp", "tp"),
        "dp": ("pp", "cp", "tp"),
        "pp": ("dp", "cp", "tp"),
        "ep": ("pp", "tp", "edp"),
        "edp": ("pp", "tp", "ep"),
        "dp_cp": ("pp", "tp"),
    }[kind]
    out = defaultdict(list)
    for r in range(d.world_size):
        c = d.coordinates(r)
        out[tuple(c[k] for k in fixed)].append(r)
    return [sorted(g) for g in out.values()]


def gaps(group: list[int]) -> set[int]:
    return set(np.diff(group).tolist())


def planner_strides(degrees: dict, order: str) -> tuple[dict[str, int], int]:
    """``group_strides`` and ``gradient_group_stride`` of one layout, built as the planner tests do."""
    one = dict(vpp=1, mbs=1, rc=0, zero=0, sp=0)
    L = Layouts(**{k: np.array([v]) for k, v in {**degrees, **one}.items()})
    s = group_strides(L, order)
    return {k: int(v[0]) for k, v in s.items()}, int(gradient_group_stride(L, s, order)[0])


def planner_links(degrees: dict, order: str, devices_per_node: int) -> dict:
    """The planner's ``CostModel.links`` of one layout on a cluster of ``devices_per_node`` ranks per node,
    keyed like :func:`groups` (``dp_cp`` for the gradient group)."""
    from tests.unit.planner_helpers import a100_cluster
    from workers.planner import ClusterSpec, CostModel, ModelSpec, TrainingConfig
    from workers.planner.hardware import efficiency_for
    from workers.training.examples import example

    world = degrees["tp"] * degrees["cp"] * degrees["dp"] * degrees["pp"]
    doc = a100_cluster(max(1, -(-world // devices_per_node)))
    doc["devices_per_node"] = devices_per_node
    cm = CostModel(
        ModelSpec.from_dict(example("tiny-dense.json")),
        ClusterSpec.from_dict(doc),
        TrainingConfig.from_dict({"global_batch_size": 8}),
        efficiency_for("A100")[1],
        order=order,
    )
    one = dict(vpp=1, mbs=1, rc=0, zero=0, sp=0)
    L = Layouts(**{k: np.array([v]) for k, v in {**degrees, **one}.items()})
    links = cm.links(L)
    return {"ep": links["ep"], "edp": links["edp"], "dp_cp": links["dp"]}


def test_the_runtime_default_is_the_planners():
    assert RUNTIME_DEFAULT_ORDER == DEFAULT_ORDER == Strategy().order == ParallelDims(1, 1, 1, 1, 1).order


@pytest.mark.parametrize("order", ALL_ORDERS)
@pytest.mark.parametrize("degrees", list(DEGREES.values()), ids=list(DEGREES))
def test_coordinates_are_a_bijection_and_rank_of_inverts_them(order, degrees):
    d = dims_of(degrees, order)
    seen = set()
    for r in range(d.world_size):
        c = d.coordinates(r)
        assert d.rank_of(c["pp"], c["dp"], c["cp"], c["tp"]) == r
        assert c["dp_cp"] == c["edp"] * d.ep + c["ep"]
        assert 0 <= c["ep"] < d.ep and 0 <= c["edp"] < d.replicas // d.ep
        seen.add((c["pp"], c["dp"], c["cp"], c["tp"]))
    assert len(seen) == d.world_size  # every coordinate is one rank


def test_the_default_order_keeps_the_old_layout():
    d = dims_of(DEGREES["tp2-cp2-dp2-pp2-ep2"], DEFAULT_ORDER)
    for pp, dp, cp, tp in itertools.product(range(2), repeat=4):
        r = ((pp * d.dp + dp) * d.cp + cp) * d.tp + tp
        dc = dp * d.cp + cp
        assert d.coordinates(r) == dict(pp=pp, dp=dp, cp=cp, tp=tp, dp_cp=dc, ep=dc % d.ep, edp=dc // d.ep)


@pytest.mark.parametrize("order", CANDIDATE_ORDERS)
@pytest.mark.parametrize("degrees", list(DEGREES.values()), ids=list(DEGREES))
def test_groups_have_the_planners_strides(order, degrees):
    d = dims_of(degrees, order)
    stride, gradient = planner_strides(degrees, order)
    for kind in ("tp", "cp", "dp", "pp"):
        for g in groups(d, kind):
            assert len(g) == degrees[kind]
            if len(g) > 1:
                assert gaps(g) == {stride[kind]}, (kind, g)
    outer, inner = d.replica_dims
    # the dp x cp block of a (pp, tp) slab, inner dimension fastest (Megatron-Core's RankGenerator)
    block = [
        o * d.strides[outer] + i * d.strides[inner]
        for o, i in itertools.product(range(degrees[outer]), range(degrees[inner]))
    ]
    n_ep = d.replicas // d.ep
    ep_groups = {tuple(g) for g in groups(d, "ep")}
    edp_groups = {tuple(g) for g in groups(d, "edp")}
    gradient_groups = {tuple(g) for g in groups(d, "dp_cp")}
    for pp, tp in itertools.product(range(d.pp), range(d.tp)):
        base = d.rank_of(pp=pp, tp=tp)
        members = [base + x for x in block]
        assert tuple(sorted(members)) in gradient_groups
        for j in range(n_ep):  # EP: ep consecutive members of the block
            assert tuple(sorted(members[j * d.ep : (j + 1) * d.ep])) in ep_groups
        for e in range(d.ep):  # EDP: the members holding the same experts
            assert tuple(sorted(members[e :: d.ep])) in edp_groups
    # the planner costs each group through its (size, stride) as group_links reads them: whether it leaves
    # a node and how many members share one; the true groups must agree for any node size
    sizes = {"ep": d.ep, "edp": n_ep, "dp_cp": d.replicas}
    planner = {"ep": stride["ep"], "edp": stride["edp"], "dp_cp": gradient}
    for n in (2, 4, 8):
        links = planner_links(degrees, order, n)
        for kind, size in sizes.items():
            if size == 1:
                continue
            inter, per_node = bool(links[kind].inter[0]), int(links[kind].per_node[0])
            for g in groups(d, kind):
                nodes = defaultdict(int)
                for r in g:
                    nodes[r // n] += 1
                assert inter == (len(nodes) > 1), (kind, n, g, planner[kind])
                assert per_node == max(nodes.values()), (kind, n, g, planner[kind])


def test_the_seed_layouts_ep_group_spans_two_nodes_in_every_candidate_order():
    """The seed scenario's best layout (tp2 cp2 ep8, here with dp4): with cp innermost the 8-wide EP group
    is 2 cp x 4 dp ranks with tp between them (ranks 0, 1, 4, 5, ..., 13), two 8-device nodes as in the
    default order; the planner costs it so (it once gave it stride 1: one node, a placement gain that did
    not exist)."""
    degrees = dict(tp=2, cp=2, dp=4, pp=1, ep=8)
    d = dims_of(degrees, "cp-tp-ep-dp-pp")
    assert groups(d, "ep") == [[0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15]]
    default = dims_of(degrees, DEFAULT_ORDER)
    assert groups(default, "ep") == [[0, 2, 4, 6, 8, 10, 12, 14], [1, 3, 5, 7, 9, 11, 13, 15]]
    for order in ("cp-tp-ep-dp-pp", DEFAULT_ORDER):
        stride, _ = planner_strides(degrees, order)
        assert 8 * stride["ep"] == 16  # spans two 8-device nodes


@pytest.mark.parametrize("order", ALL_ORDERS)
def test_the_runtime_accepts_every_order_the_planner_accepts(order):
    s = ParallelConfig.from_dict({"tp": 2, "dp": 2, "micro_batch_size": 1, "order": order})
    assert s.order == order
    assert ParallelDims.from_strategy(s, 4).order == order
    assert ParallelConfig.from_dict(s.to_dict()) == s  # and writes it back out


def test_a_bad_order_is_refused():
    with pytest.raises(ValueError, match="permutation"):
        ParallelDims(dp=2, tp=1, pp=1, ep=1, world_size=2, order="tp-dp-pp")


def play_each_rank(world_size: int):
    """Yield each rank with torch's fake process group initialised as that rank."""
    for rank in range(world_size):
        dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
        try:
            yield rank
        finally:
            dist.destroy_process_group()


@pytest.mark.parametrize("order", CANDIDATE_ORDERS)
@pytest.mark.parametrize("degrees", list(DEGREES.values()), ids=list(DEGREES))
def test_build_mesh_gives_the_groups_of_coordinates(order, degrees):
    d = dims_of(degrees, order)
    by_kind = {kind: groups(d, kind) for kind in ("tp", "cp", "dp", "pp", "ep", "edp", "dp_cp")}
    for rank in play_each_rank(d.world_size):
        mesh, moe_mesh = d.build_mesh("cpu")
        d.check_mesh(rank, mesh, moe_mesh)  # coordinates and group ranks are this rank's coordinates
        c = d.coordinates(rank)
        meshes = {k: mesh[k] for k in ("tp", "dp", "pp")}
        if d.cp > 1:
            meshes |= {"cp": mesh["cp"], "dp_cp": mesh["dp_cp"]}
        assert d.replica_mesh(mesh) == meshes["dp_cp" if d.cp > 1 else "dp"]
        if d.ep > 1:
            meshes |= {"ep": moe_mesh["ep"], "edp": moe_mesh["edp"]}
        else:
            assert moe_mesh is None
        for kind, sub in meshes.items():
            members = dist.get_process_group_ranks(sub.get_group())
            (want,) = [g for g in by_kind[kind] if rank in g]
            assert sorted(members) == want, (kind, rank)
            assert sub.mesh.tolist() == want  # the mesh lists them in coordinate order
            assert members.index(rank) == c[kind]
            assert d.groups(rank)[kind] == want


def test_a_naive_dp_cp_flattening_would_disagree_with_its_group():
    """Why ``build_mesh`` puts the outer of dp / cp first: flattening ``(dp, cp)`` with dp innermost in the
    order gives each rank a DTensor coordinate that is not its rank in the flattened group (FSDP2 shards by
    the group rank, DCP places the shards by the coordinate)."""
    d = dims_of(DEGREES["cp2-dp2-ep2"], "tp-dp-cp-ep-pp")
    disagree = []
    naive_grid = d._rank_grid().permute(0, 2, 1, 3).contiguous()  # (pp, cp, dp, tp) -> (pp, dp, cp, tp)
    assert naive_grid.flatten().tolist() == [0, 2, 1, 3]  # dp stride 1, cp stride 2
    for rank in play_each_rank(d.world_size):
        naive = DeviceMesh("cpu", naive_grid, mesh_dim_names=("pp", "dp", "cp", "tp"))
        flat = naive["dp", "cp"]._flatten("dp_cp")
        if flat.get_coordinate()[0] != flat.get_group().rank():
            disagree.append(rank)
            with pytest.raises(RuntimeError, match="mesh dim dp_cp"):
                d.check_mesh(rank, naive)
        else:
            d.check_mesh(rank, naive)
    assert disagree == [1, 2]  # coordinates 1 and 2 are the 2nd and 1st member of the group [0, 1, 2, 3]
