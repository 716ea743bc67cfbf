"""The emulated two-tier network: built and removed cleanly, its rate limit measurable, gloo runs across it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT
from workers.training.comm import netem

pytestmark = pytest.mark.skipif(bool(netem.unavailable_reason()), reason=netem.unavailable_reason() or "ok")


def test_network_is_created_and_removed_cleanly():
    with netem.TwoTierNetwork(nodes=3, inter_node_gbit=1.0) as net:
        names = set(netem.list_namespaces())
        assert set(net.namespaces) | {net.switch} <= names
        assert [n.address for n in net.node_list] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
        probe = "import socket; s = socket.socket(); s.settimeout(3); print(s.connect_ex(('10.77.0.3', 9)))"
        out = net.run(0, [sys.executable, "-c", probe])
        assert out.returncode == 0 and out.stdout.strip() == "111"  # ECONNREFUSED: node 2 is reachable
        created = set(net.namespaces) | {net.switch}
    assert not created & set(netem.list_namespaces())


def test_network_is_removed_even_when_the_body_fails():
    with pytest.raises(RuntimeError, match="boom"), netem.TwoTierNetwork(nodes=2) as net:
        created = set(net.namespaces) | {net.switch}
        raise RuntimeError("boom")
    assert not created & set(netem.list_namespaces())


def test_stale_namespaces_of_dead_processes_are_removed():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = f"ct-{dead.pid}-n0"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    try:
        with netem.TwoTierNetwork(nodes=1):
            assert stale not in netem.list_namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", stale], capture_output=True)


def test_inter_node_rate_limit_is_measurable():
    with netem.TwoTierNetwork(nodes=2, inter_node_gbit=0.5) as net:
        inter = net.measure_gbit(0, 1, megabytes=24)
        intra = net.measure_gbit(0, 0, megabytes=24)
    assert 0.35 <= inter <= 0.55, f"inter-node goodput {inter:.2f} Gbit/s on a 0.5 Gbit/s link"
    assert intra > 2 * inter, f"node loopback {intra:.2f} Gbit/s should not be shaped"


_RANK = textwrap.dedent(
    """
    import json, os, sys, time
    import torch, torch.distributed as dist
    from workers.training.comm.hierarchical import hierarchical_all_reduce, node_groups
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    intra, inter = node_groups(int(os.environ["RANKS_PER_NODE"]))
    x = torch.randn(int(os.environ["NUMEL"]), generator=torch.Generator().manual_seed(dist.get_rank()))
    flat = x.clone(); dist.all_reduce(flat)
    hier = hierarchical_all_reduce(x.clone(), intra, inter)
    timings = {"flat": [], "hierarchical": []}
    for _ in range(3):
        for name in timings:
            y = x.clone(); dist.barrier(); t0 = time.perf_counter()
            dist.all_reduce(y) if name == "flat" else hierarchical_all_reduce(y, intra, inter)
            timings[name].append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        print(json.dumps({"max_diff": float((hier - flat).abs().max()),
                          **{k: sorted(v)[1] for k, v in timings.items()}}))
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_gloo_ranks_in_two_nodes_all_reduce_across_the_shaped_link():
    nodes, per_node = 2, 2
    with netem.TwoTierNetwork(nodes=nodes, inter_node_gbit=0.5) as net:
        procs = []
        for rank in range(nodes * per_node):
            env = {
                "RANK": str(rank),
                "WORLD_SIZE": str(nodes * per_node),
                "MASTER_PORT": "29533",
                "RANKS_PER_NODE": str(per_node),
                "NUMEL": str(2_000_000),
                "PYTHONPATH": str(ROOT),
            }
            procs.append(
                net.popen(
                    rank // per_node,
                    [sys.executable, "-c", _RANK],
                    env=env,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        outs = [p.communicate(timeout=180)[0] for p in procs]
        assert [p.returncode for p in procs] == [0] * len(procs)
    result = json.loads(outs[0].strip().splitlines()[-1])
    print(f"\n2 nodes x 2 ranks, 8 MB all-reduce over 0.5 Gbit/s: {result}")
    assert result["max_diff"] < 1e-4
    assert result["flat"] > 0 and result["hierarchical"] > 0
