"""A hot-swap run's figures, from the replicas' progress and event files and the faults the supervisor
fired: recovery and rejoin times, steps lost, checksums after a rejoin, goodput."""

from __future__ import annotations

import json
from pathlib import Path


def read_status(run_dir: Path, n: int) -> dict | None:
    """``replica<n>.json`` (None while absent or being replaced)."""
    try:
        doc = json.loads((Path(run_dir) / f"replica{n}.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def read_events(run_dir: Path, n: int) -> list[dict]:
    """``replica<n>.events.jsonl``, whole lines only (a kill may cut the last one)."""
    path = Path(run_dir) / f"replica{n}.events.jsonl"
    out = []
    if not path.exists():
        return out
    for line in path.read_bytes().split(b"\n"):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out


def summarize(
    run_dir: Path, *, replicas: int, steps: int, fired: list[dict], launch: float, end: float | None
) -> dict:
    """The run's figures, from the replicas' event files and the faults the supervisor fired."""
    events = {n: read_events(run_dir, n) for n in range(replicas)}
    commits = {n: [e for e in evs if e.get("event") == "commit"] for n, evs in events.items()}
    losses: dict[int, float] = {}
    for n in sorted(commits, reverse=True):  # the lowest replica that committed a step wins
        for e in commits[n]:
            losses[e["step"]] = e["loss"]
    losses = dict(sorted(losses.items()))
    processes = []
    for n, evs in events.items():
        for pid in dict.fromkeys(e["pid"] for e in evs):
            mine = [e for e in commits[n] if e["pid"] == pid]
            committed = [e["step"] for e in mine]
            healed = [e for e in evs if e["pid"] == pid and e.get("event") == "healed"]
            processes.append(
                {
                    "replica": n,
                    "pid": pid,
                    "attempt": next(e["attempt"] for e in evs if e["pid"] == pid),
                    "steps_committed": len(committed),
                    "first_step": min(committed, default=None),
                    "last_step": max(committed, default=None),
                    "duplicate_commits": len(committed) - len(set(committed)),
                    "gaps": sum(1 for a, b in zip(committed, committed[1:], strict=False) if b != a + 1),
                    "failed_attempts": sum(1 for e in evs if e["pid"] == pid and e.get("event") == "failed"),
                    "healed": [
                        {"from_step": h["from_step"], "to_step": h["to_step"], "s": h["seconds"]}
                        for h in healed
                    ],
                    "finished": any(e["pid"] == pid and e.get("event") == "done" for e in evs),
                }
            )
    out_faults = [_fault_figures(f, events, commits) for f in fired]
    checksums_ok, checksums = _checksums(out_faults, events)
    return {
        "steps": max(losses, default=0),
        "replicas": replicas,
        "faults": out_faults,
        "loss_last": losses[max(losses)] if losses else None,
        "losses": losses,
        "checksums_equal_after_rejoin": checksums_ok,
        "checksums": checksums,
        "goodput": _goodput(commits, events, replicas, launch, end),
        "replica_processes": processes,
        "run_dir": str(run_dir),
    }


def _fault_figures(fault: dict, events: dict[int, list[dict]], commits: dict[int, list[dict]]) -> dict:
    n, t_kill = fault["replica"], fault["t_kill"]
    survivors = [e for m, cs in commits.items() if m != n for e in cs]
    # The first step the survivors committed without the killed replica: one whose quorum was formed after
    # the kill (a commit needs every member's all-reduce, which a dead process cannot give). A step whose
    # quorum was formed before may still commit after the kill, carrying the victim's last gradient.
    after = sorted((e for e in survivors if e["t_compute"] > t_kill), key=lambda e: e["t_commit"])
    first = after[0] if after else None
    before = sorted(e["t_commit"] - e["t_compute"] for e in survivors if e["t_commit"] < t_kill)
    last_before = max(
        (e["step"] for e in survivors if first is not None and e["t_commit"] < first["t_commit"]),
        default=None,
    )
    failed = [
        e
        for m, evs in events.items()
        if m != n
        for e in evs
        if e.get("event") == "failed"
        and e["t_end"] > t_kill
        and (first is None or e["t_end"] <= first["t_commit"])
    ]
    new = [e for e in events[n] if e["pid"] != fault["pid"] and e.get("t", e.get("t_commit", 0)) > t_kill]
    new_pid = next((e["pid"] for e in new), None)
    rejoin = next((e for e in new if e.get("event") == "commit"), None)
    healed = next((e for e in new if e.get("event") == "healed"), None)
    back = rejoin["t_commit"] if rejoin else (healed["t"] if healed else None)
    return {
        "kind": "replica-killed",
        "replica": n,
        "step": fault["step_at_kill"],
        "requested_step": fault["step"],
        "rto_s": round(first["t_commit"] - t_kill, 4) if first else None,
        # a survivor's step (quorum -> commit) before the kill: the RTO holds at least one of them when the
        # kill lands between two steps
        "step_s_before": round(before[len(before) // 2], 4) if before else None,
        "rejoin_s": round(back - t_kill, 4) if back is not None else None,
        "steps_lost": max(0, last_before + 1 - first["step"]) if first and last_before is not None else 0,
        "survivor_next_step": first["step"] if first else None,
        "survivor_failed_attempts": len(failed),
        "rejoined_at_step": rejoin["step"] if rejoin else (healed["to_step"] if healed else None),
        "heal_s": healed["seconds"] if healed else None,
        "pid_killed": fault["pid"],
        "pid_restarted": new_pid,
        "successor": fault["successor"],
        "successor_was_ready": fault["successor_was_ready"],
    }


def _checksums(faults: list[dict], events: dict[int, list[dict]]) -> tuple[bool, dict]:
    """Parameter + optimizer-state checksums: at each rejoin step every replica that committed it, and at
    the end every replica. Equal everywhere = the rejoined replica holds exactly the survivors' state."""
    final = {}
    for n, evs in events.items():
        done = [e for e in evs if e.get("event") == "done"]
        if done:
            final[n] = done[-1]["checksum"]
    at_rejoin = []
    ok = len(final) == len(events) and len(set(final.values())) == 1
    for f in faults:
        step = f["rejoined_at_step"]
        if step is None:
            ok = False
            continue
        sums = {
            n: e["checksum"]
            for n, evs in events.items()
            for e in evs
            if e.get("event") == "commit" and e["step"] == step and e.get("checksum")
        }
        at_rejoin.append({"step": step, "by_replica": sums})
        # a rejoin by healing at the very end has no commit of its own: the final checksums decide
        if len(sums) >= 2 and len(set(sums.values())) != 1:
            ok = False
    return ok, {"final": final, "at_rejoin": at_rejoin}


def _goodput(commits, events, replicas: int, launch: float, end: float | None) -> dict:
    """Replica-seconds: each replica slot's committed step time (forward, backward, all-reduce, optimizer;
    the quorum wait before it excluded) over the wall time from launch to the last replica done, averaged
    over the slots. A slot that is down, starting, healing or redoing a failed step produces nothing."""
    end = end or max(
        (e.get("t", e.get("t_commit", launch)) for evs in events.values() for e in evs), default=launch
    )
    wall = max(0.0, end - launch)
    productive = sum(e["t_commit"] - e["t_compute"] for cs in commits.values() for e in cs) / replicas
    failed = sum(
        e["t_end"] - e["t_compute"] for evs in events.values() for e in evs if e.get("event") == "failed"
    )
    quorum = sum(e["t_compute"] - e["t_start"] for cs in commits.values() for e in cs)
    ready = [
        e["t"] for evs in events.values() for e in evs if e.get("event") == "ready" and e["attempt"] == 1
    ]
    return {
        "wall_s": round(wall, 4),
        "productive_s": round(productive, 4),
        "goodput": round(productive / wall, 5) if wall > 0 else None,
        "badput": {
            "startup_s": round(max(ready, default=launch) - launch, 4),
            "failed_steps_s": round(failed / replicas, 4),
            "quorum_s": round(quorum / replicas, 4),
        },
    }
