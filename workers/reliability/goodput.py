"""Goodput: the share of a run's wall time that produced training progress that was kept.

In the spirit of Google's ``ml-goodput-measurement`` badput taxonomy (program start-up, checkpoint
save/restore, wasted progress from disruptions, other) and Meta's ETTR (effective training time ratio, the
Llama 3 paper's "> 90% effective training time"), computed from rank 0's timeline
(:mod:`workers.training.supervision.progress`), never estimated:

- ``productive_s``: the step time of every step whose result was kept, i.e. its last execution (a step
  re-run after a restart was productive only the second time).
- ``lost_progress_s``: the step time of the executions that a restart rolled back (trained after the
  snapshot the run went back to).
- ``snapshot_stall_s``: what snapshots cost the training thread (staging), over kept and lost steps.
- ``restore_s``: finding, verifying and loading snapshots after a restart.
- ``startup_s``: from the launch to the first rank ready (torchrun, rendezvous, imports, building the
  model), and from each restarted process's start to ready.
- ``fault_wait_s``: from the last sign of life of a run that failed to the start of the restarted processes
  (detecting the failure, stopping the survivors, re-forming the group).
- ``other_s``: the rest of the wall time (publishing, the end of the run, anything not listed).

``goodput = productive_s / wall_s``.
"""

from __future__ import annotations


def goodput(events: list[dict], *, launch_unix: float, end_unix: float) -> dict:
    wall = max(0.0, end_unix - launch_unix)
    kept: dict[int, dict] = {}
    lost_s = stall_s = restore_s = startup_s = wait_s = 0.0
    by_restart: dict[int, list[dict]] = {}
    for e in events:
        by_restart.setdefault(int(e.get("restart", 0)), []).append(e)
        if e.get("event") == "step":
            stall_s += float(e.get("stall_s") or 0.0)
            previous = kept.get(e["step"])
            if previous is not None:  # re-run after a restart: the earlier execution was lost
                lost_s += float(previous.get("step_time_s") or 0.0)
            kept[e["step"]] = e
        elif e.get("event") == "resumed":
            restore_s += float(e.get("seconds") or 0.0)
    # executions rolled back but never re-run (the run ended or failed before reaching them again) are
    # kept above; the lost ones are exactly those superseded
    last_seen = launch_unix
    for restart in sorted(by_restart):
        evs = by_restart[restart]
        start = next((e["t"] for e in evs if e.get("event") == "start"), None)
        ready = next((e["t"] for e in evs if e.get("event") == "ready"), None)
        if start is not None:
            if restart == 0:
                startup_s += max(0.0, start - launch_unix)
            else:
                wait_s += max(0.0, start - last_seen)
            if ready is not None:
                startup_s += max(0.0, ready - start)
        last_seen = max([last_seen, *(e["t"] for e in evs if "t" in e)])
    productive = sum(float(e.get("step_time_s") or 0.0) for e in kept.values())
    badput = {
        "startup_s": startup_s,
        "restore_s": restore_s,
        "snapshot_stall_s": stall_s,
        "lost_progress_s": lost_s,
        "fault_wait_s": wait_s,
    }
    badput["other_s"] = max(0.0, wall - productive - sum(badput.values()))
    return {
        "wall_s": round(wall, 4),
        "productive_s": round(productive, 4),
        "goodput": round(productive / wall, 5) if wall > 0 else None,
        "badput": {k: round(v, 4) for k, v in badput.items()},
        "steps_kept": len(kept),
    }


def kept_losses(events: list[dict]) -> dict[int, float]:
    """Each step's loss from its last execution (what the run's loss curve is, after its restarts)."""
    out: dict[int, float] = {}
    for e in events:
        if e.get("event") == "step":
            out[int(e["step"])] = float(e["loss"])
    return dict(sorted(out.items()))
