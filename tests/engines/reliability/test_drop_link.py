"""A node's link dropped (``drop-link``) on the emulated two-tier network, with real torchrun agents.

Two "nodes" (network namespaces, ``workers.training.comm.netem``), one torchrun agent and one rank each, DDP
over gloo across the link (c10d rendezvous on node 0's address). When rank 1 has committed step K the
injector takes down the link of the node that holds it: both ranks wait in their all-reduce, none stopped,
and the watch's hang timeout finds it, records a ``drop-link`` fault, kills the ranks and brings the link
up; torchrun restarts the group from the newest snapshot, and every step's loss equals the run that had no
fault, bit for bit (DDP on CPU).
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.engines.training.harness import job
from workers.reliability.cli import run_elastic
from workers.reliability.elastic import ElasticWatch
from workers.reliability.faults import FaultInjector
from workers.training.comm import netem
from workers.training.launch import render_torchrun_command, torchrun_env
from workers.training.supervision.supervisor import stop_groups

pytestmark = pytest.mark.skipif(bool(netem.unavailable_reason()), reason=netem.unavailable_reason() or "ok")
STEPS = 24
DROP_AT_STEP = 5
HANG_TIMEOUT_S = 3.0  # as test_elastic_recovery.py; a step of the tiny model took 0.1-0.3 s here
RDZV_PORT = 29517  # any port: node 0's namespace is new and holds nothing else


def link_is_up(namespace: str) -> bool:
    out = subprocess.run(
        ["ip", "-n", namespace, "-o", "link", "show", netem.IFNAME],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return "UP" in out.split("<", 1)[1].split(">", 1)[0].split(",")


def reaches(net: netem.TwoTierNetwork, src: int, dst: int) -> bool:
    """A TCP connect from node ``src`` to a closed port of node ``dst`` is refused (the node answered)."""
    probe = (
        "import socket; s = socket.socket(); s.settimeout(1); "
        f"print(s.connect_ex(({net.node_list[dst].address!r}, 9)))"
    )
    return net.run(src, [sys.executable, "-c", probe]).stdout.strip() == "111"  # ECONNREFUSED


def test_drop_link_cuts_the_node_of_the_rank_off_until_its_link_is_restored():
    with netem.TwoTierNetwork(nodes=2) as net:
        rank1 = net.popen(1, [sys.executable, "-c", "import time; print(flush=True); time.sleep(60)"],
                          stdout=subprocess.PIPE)  # fmt: skip
        rank1.stdout.readline()  # in node 1 now (`ip netns exec` has joined the namespace and exec'd)
        injector = FaultInjector("drop-link@step=2:rank=1", world_size=2)
        doc = {"rank": 1, "pid": rank1.pid, "phase": "training", "restart": 0}
        assert injector.poll({1: {**doc, "step": 1}}) == []  # not due yet
        [fired] = injector.poll({1: {**doc, "step": 2}})
        node1 = net.namespaces[1]
        assert (fired.kind, fired.rank, fired.pid, fired.refused) == ("drop-link", 1, rank1.pid, False)
        assert fired.detail == f"ctnet0 of {node1} down" and list(injector.links_down) == [node1]
        assert not link_is_up(node1) and link_is_up(net.namespaces[0])
        assert not reaches(net, 0, 1)
        assert injector.restore_links() == [node1] and injector.links_down == {}
        assert link_is_up(node1) and reaches(net, 0, 1)
        assert injector.poll({1: {**doc, "step": 3}}) == []  # once


def run_on_two_nodes(net: netem.TwoTierNetwork, cfg, run_dir: Path, *, inject: str, timeout_s: float = 180):
    """``cfg`` with one rank on each node of ``net``, restarts allowed, under one ElasticWatch that sees
    both nodes' ranks (their progress files share a directory); returns the agents' exit codes and the
    watch. The agents are started as ``workers.training.comm.compare.run_on_network`` starts them."""
    run_dir.mkdir(parents=True)
    config_path = run_dir / "job.json"
    cfg.save(config_path)
    injector = FaultInjector(inject, world_size=2, snapshot_dir=cfg.snapshot_dir)
    watch = ElasticWatch(
        run_dir, hang_timeout_s=HANG_TIMEOUT_S, snapshot_dir=cfg.snapshot_dir, injector=injector
    )
    env = {**torchrun_env(), **watch.env, "OMP_NUM_THREADS": "1"}
    run_id, procs, logs = uuid.uuid4().hex[:12], [], []
    try:
        for node in net.node_list:
            cmd = render_torchrun_command(str(config_path), nnodes=2, nproc_per_node=1, node_rank=node.index,
                                          rdzv_endpoint=f"{net.node_list[0].address}:{RDZV_PORT}", run_id=run_id,
                                          max_restarts=3, warm=True, summary_path=str(run_dir / "summary.json"))  # fmt: skip
            # the agent's own address, and who hosts the rendezvous store (torch knows a host by its name only)
            at = cmd.index("-m", 2)
            cmd[at:at] = [
                f"--local-addr={node.address}",
                f"--rdzv-conf=is_host={str(node.index == 0).lower()}",
            ]
            logs.append((run_dir / f"node{node.index}.log").open("wb"))
            procs.append(net.popen(node.index, cmd, env, stdout=logs[-1], stderr=subprocess.STDOUT,
                                   start_new_session=True))  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            watch.poll()
            time.sleep(0.05)
    finally:
        stop_groups(procs, grace_s=5.0)
        for log in logs:
            log.close()
        watch.finish()
    return [p.returncode for p in procs], watch


@pytest.mark.long
@pytest.mark.slow
def test_a_dropped_node_link_is_found_recovered_and_the_losses_stay_bit_for_bit(tmp_path):
    strategy = {"dp": 2, "micro_batch_size": 2}
    # no ``resume``: torchrun counts only failures as restarts, and node 1's agent, cut off from the
    # rendezvous store while the link is down, usually re-joins as a membership change and starts its rank
    # with the old count; the ranks agree on the highest count (Trainer._agree_on_restart), so it resumes
    cfg = job("tiny-dense.json", strategy, steps=STEPS, profile_every=0, snapshot_every=2,
              snapshot_dir=str(tmp_path / "snap"))  # fmt: skip
    t0 = time.monotonic()
    with netem.TwoTierNetwork(nodes=2) as net:
        created = set(net.namespaces) | {net.switch}
        codes, watch = run_on_two_nodes(
            net, cfg, tmp_path / "faulty", inject=f"drop-link@step={DROP_AT_STEP}:rank=1"
        )
        links_up = {ns: link_is_up(ns) for ns in net.namespaces}
    faulty_s = time.monotonic() - t0
    assert not created & set(netem.list_namespaces())
    logs = "\n".join(
        (tmp_path / "faulty" / f"node{i}.log").read_text(errors="replace")[-3000:] for i in (0, 1)
    )
    assert codes == [0, 0], logs
    assert all(links_up.values()), links_up
    report = watch.report()
    [fired] = watch.injector.fired
    assert fired.kind == "drop-link" and not fired.refused and fired.step >= DROP_AT_STEP
    assert [(f["kind"], f["rank"]) for f in report["faults"]] == [("drop-link", 1)], report["faults"]
    [fault] = report["faults"]
    assert f"injected fault drop-link@step={DROP_AT_STEP}:rank=1" in fault["message"]
    assert "(stopped)" not in fault["message"] and "is up again" in fault["message"]
    assert fault["fault_unix"] == fired.fired_unix and fault["rto_s"] > HANG_TIMEOUT_S
    assert fault["steps_lost"] == fault["step"] - (fault["resumed_from_step"] or 0)
    assert report["restarts"] == 1
    t1 = time.monotonic()
    reference = run_elastic(job("tiny-dense.json", strategy, steps=STEPS, profile_every=0), 2,
                            run_dir=tmp_path / "reference", max_restarts=0, hang_timeout_s=60, timeout=180)  # fmt: skip
    reference_s = time.monotonic() - t1
    assert reference["exit_code"] == 0, reference["log_tail"]
    ref = reference["report"]["losses"]
    assert sorted(report["losses"]) == list(range(1, STEPS + 1)) == sorted(ref)
    assert report["losses"] == ref  # every step, bit for bit: the restarted group continued the same run
    print(
        f"\ndrop-link at step {fired.step}: found after {fault['detected_unix'] - fired.fired_unix:.1f} s, "
        f"back to step {fault['resumed_from_step']} ({fault['steps_lost']} lost), RTO {fault['rto_s']:.1f} s; "
        f"faulty run {faulty_s:.1f} s, reference {reference_s:.1f} s"
    )
