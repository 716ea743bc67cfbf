"""Snapshot engine figures, measured side by side in one run, for a ~100M-parameter transformer trained
with AdamW on this machine's CPU (one rank, the real ``Trainer`` and ``SnapshotManager``):

1. Training-thread stall of a snapshot: a synchronous save (DCP's stock ``dcp.save`` with
   ``FileSystemWriter``; and our engine waited on) against the asynchronous snapshot (staging only).
2. What the background write costs the steps that run beside it (step time with / without a write).
3. Bytes on disk: raw state, a full zstd snapshot, and deltas taken k steps after their base: XOR deltas of
   the state, and logs of the gradients the optimizer consumed (``snapshot_delta: log``), with the restore
   time of a full snapshot + a chain of logs replayed on it (checked bit for bit against the live state).
4. Recovery (``--parts recovery``): the same model under torchrun with restart recovery
   (``workers.reliability``): a run without faults, then one rank SIGKILLed every ``--kill-every`` seconds
   for ``--minutes``: kill -> next committed step (RTO, with where its seconds went) and goodput with and
   without the kills.

5. Hot swap (``--parts hotswap``): the same model as torchft replica groups with a warm spare
   (``bench/hotswap.py``): one replica SIGKILLed, kill -> the survivors' next committed step.

    .venv/bin/python bench/elastic.py [--layers 12] [--hidden 768] [--ffn 2560] [--threads 1] [--json]
        [--parts snapshots recovery hotswap] [--logs 3] [--ranks 2] [--minutes 10] [--kill-every 60]
        [--memory-every 1] [--snapshot-interval 60]

A smoke run of the snapshot part on a small model: ``--parts snapshots --layers 2 --hidden 128 --ffn 256``.

``--threads`` is torch's intra-op threads for training: 1 leaves the second core to the writer, as an
accelerator's host leaves cores to the checkpoint writer (see docs/elastic.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from harness import bench_parser, scratch_dir, single_rank_rendezvous

from workers.devices import backend as device_mod

device_mod.prepare_environment()


def model_spec(layers: int, hidden: int, ffn: int, seq: int) -> dict:
    return {
        "name": f"bench-{layers}x{hidden}",
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": hidden // 64,
        "num_kv_heads": hidden // 64,
        "ffn_hidden_size": ffn,
        "vocab_size": 256,
        "seq_length": seq,
        "activation": "swiglu",
        "moe": None,
    }


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run(args) -> dict:
    """Parts 1-3: the snapshot engine's stall, write and bytes, in a scratch directory."""
    with scratch_dir("cann-elastic-bench-", args.dir) as work:
        return snapshot_figures(args, work)


def snapshot_figures(args, work: Path) -> dict:
    import torch
    import torch.distributed.checkpoint as dcp

    from workers.training.config import JobConfig
    from workers.training.model import num_params
    from workers.training.trainer import Trainer

    torch.set_num_threads(args.threads)
    single_rank_rendezvous()
    ks = sorted(set(args.k))
    cfg = JobConfig.from_dict(
        {
            "model": model_spec(args.layers, args.hidden, args.ffn, args.seq),
            "training": {"global_batch_size": args.batch, "optimizer": "adamw", "dtype": "fp32"},
            "steps": 1000,
            "lr": args.lr,
            "warmup_steps": 10,
            "device": "cpu",
            "snapshot_every": 1000,  # the manager exists; this script decides when to snapshot
            "snapshot_dir": str(work / "snapshots"),
            "snapshot_full_every": max(ks) + 2,
            "snapshot_keep": 1000,
        }
    )
    trainer = Trainer(cfg, rank=0, world_size=1)
    mgr = trainer.snapshots
    mgr.log = lambda line: None  # the figures are reported below, not line by line
    out: dict = {
        "params": num_params(cfg.model, active=False),
        "model": cfg.model.name,
        "threads": args.threads,
        "cpu_cores": os.cpu_count(),
        "lr": args.lr,
        "tokens_per_step": args.batch * args.seq,
    }

    def step() -> float:
        inputs, labels = trainer.loader.next_batch()
        t0 = time.perf_counter()
        trainer.train_step(inputs, labels)
        return time.perf_counter() - t0

    try:
        for _ in range(3):  # warm-up (the optimizer state exists after the first)
            step()
        quiet = [step() for _ in range(2)]
        state = trainer.snapshot_state()
        out["raw_state_bytes"] = sum(
            t.numel() * t.element_size() for t in _tensors(state) if isinstance(t, torch.Tensor)
        )

        # 1a. DCP's stock synchronous save (uncompressed, FileSystemWriter): the loop waits for all of it
        t0 = time.perf_counter()
        dcp.save(
            trainer.snapshot_state(),
            storage_writer=dcp.FileSystemWriter(str(work / "dcp-sync")),
            process_group=mgr.group,
        )
        out["dcp_sync_save_s"] = time.perf_counter() - t0
        out["dcp_sync_bytes"] = du(work / "dcp-sync")
        shutil.rmtree(work / "dcp-sync")

        out["prepare_s"] = mgr.prepare(trainer.snapshot_state())

        # 1b. our engine, waited on: staging + encoding + fsync + rename, a full snapshot
        t0 = time.perf_counter()
        base = mgr.save(trainer.step, trainer.snapshot_state)
        mgr.wait()
        out["engine_sync_full_s"] = time.perf_counter() - t0
        out["full"] = base.to_dict()

        # 2+3. asynchronous deltas k steps after the base; the steps beside each write are timed
        out["deltas"], during = [], []
        for k in range(1, max(ks) + 1):
            quiet.append(step())
            if k not in ks:
                continue
            record = mgr.save(trainer.step, trainer.snapshot_state)
            t_write = time.perf_counter()
            while mgr.in_flight:
                during.append(step())
            write_wall = time.perf_counter() - t_write
            mgr.wait()
            out["deltas"].append({"k": k, **record.to_dict(), "write_wall_s": write_wall})
        # an asynchronous full snapshot (the next base): same staging, bigger write
        mgr.full_every = 1
        full_async = mgr.save(trainer.step, trainer.snapshot_state)
        while mgr.in_flight:
            during.append(step())
        mgr.wait()
        out["full_async"] = full_async.to_dict()
        out["log"] = log_snapshots(trainer, step, work, args.logs)
        out["step_s_quiet_median"] = statistics.median(quiet)
        out["step_s_during_write_median"] = statistics.median(during) if during else None
        out["steps_during_writes"] = len(during)
    finally:
        trainer.close()
    return out


def recovery(args) -> dict:
    """Part 4: restart recovery under torchrun, with and without one rank killed every ``kill_every`` s."""
    from workers.reliability.cli import run_elastic
    from workers.training.config import JobConfig

    strategy = {"dp": args.ranks, "micro_batch_size": max(1, args.batch // args.ranks)}

    def config(steps: int, **snap) -> JobConfig:
        return JobConfig.from_dict(
            {
                "model": model_spec(args.layers, args.hidden, args.ffn, args.seq),
                "strategy": strategy,
                "training": {"global_batch_size": args.batch, "optimizer": "adamw", "dtype": "fp32"},
                "steps": steps,
                "lr": args.lr,
                "warmup_steps": 10,
                "device": "cpu",
                "profile_every": 0,
                **snap,
            }
        )

    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    out: dict = {"ranks": args.ranks, "minutes": args.minutes, "kill_every_s": args.kill_every}
    with scratch_dir("cann-recovery-bench-", args.dir) as work:
        ref = run_elastic(
            config(args.reference_steps), args.ranks, run_dir=work / "ref", max_restarts=0, hang_timeout_s=600
        )
        if ref["exit_code"] != 0:
            raise RuntimeError(f"the run without faults failed:\n{ref['log_tail']}")
        steps = [e for e in ref["timeline"] if e.get("event") == "step"]
        step_s = statistics.median(e["step_time_s"] for e in steps[2:])
        out["reference"] = {"steps": len(steps), "step_s": step_s, "goodput": ref["report"]["goodput"]}
        every = max(1, round(args.snapshot_interval / step_s))
        memory_every = args.memory_every
        total = max(every * 2, round(args.minutes * 60 / step_s))
        kill_steps = range(
            max(2, round(args.kill_every / step_s)), total, max(1, round(args.kill_every / step_s))
        )
        inject = ",".join(f"kill-rank@step={k}:rank={i % args.ranks}" for i, k in enumerate(kill_steps))
        out.update(steps=total, snapshot_every=every, memory_every=memory_every, kills=len(kill_steps))
        run = run_elastic(
            config(
                total,
                snapshot_every=every,
                snapshot_dir=str(work / "snapshots"),
                snapshot_full_every=1,
                snapshot_keep=2,
                snapshot_memory_every=memory_every,
            ),
            args.ranks,
            run_dir=work / "faulty",
            max_restarts=len(kill_steps) + 2,
            hang_timeout_s=max(60.0, 20 * step_s),
            inject=inject,
            timeout=args.minutes * 60 * 3 + 600,
        )
        out["exit_code"] = run["exit_code"]
        events = run["timeline"]
        faults = []
        for f in run["report"]["faults"]:
            if "rto_s" not in f:
                continue
            after = [e for e in events if e.get("restart") == f["restart"] + 1]
            start = next((e["t"] for e in after if e["event"] == "start"), None)
            ready = next((e["t"] for e in after if e["event"] == "ready"), None)
            resumed = next((e for e in after if e["event"] == "resumed"), None)
            faults.append(
                {
                    **{k: f[k] for k in ("step", "rto_s", "steps_lost", "resumed_from_step")},
                    "detect_s": max(0.0, f["detected_unix"] - f["fault_unix"]),
                    "restart_s": (start - f["detected_unix"]) if start else None,
                    "build_s": (ready - start) if start and ready else None,
                    "restore_s": resumed["seconds"] if resumed else None,
                    "first_step_s": (f["recovered_unix"] - resumed["t"]) if resumed else None,
                }
            )
        out["faults"] = faults
        out["goodput"] = run["report"]["goodput"]
        # goodput counts a step as productive however long it took: say how long they took beside the
        # snapshot copies and writes, against the run without them
        run_steps = [e["step_time_s"] for e in events if e.get("event") == "step" and e.get("step_time_s")]
        out["step_s_with_faults"] = statistics.median(run_steps) if run_steps else None
    return out


def report_recovery(r: dict) -> str:
    g, ref = r["goodput"], r["reference"]
    rtos = sorted(f["rto_s"] for f in r["faults"])
    med = statistics.median
    lines = [
        f"recovery: {r['ranks']} rank(s) under torchrun (restart from snapshots), step {ref['step_s']:.2f} s,"
        f" a full snapshot every {r['snapshot_every']} steps"
        + (f", the state in RAM every {r['memory_every']}" if r.get("memory_every") else ""),
        f"  {r['kills']} rank kills in {r['steps']} steps ({r['minutes']:g} min at the reference pace), one every"
        f" {r['kill_every_s']:g} s; {len(rtos)} recovered, exit code {r['exit_code']}",
    ]
    if rtos:
        part = {
            k: med([f[k] for f in r["faults"] if f[k] is not None] or [0.0])
            for k in ("detect_s", "restart_s", "build_s", "restore_s", "first_step_s")
        }
        lines += [
            f"  kill -> next committed step: median {med(rtos):.2f} s (min {rtos[0]:.2f}, max {rtos[-1]:.2f};"
            " goal <= 5 s)",
            "    where it goes (medians): "
            + ", ".join(f"{k[:-2].replace('_', ' ')} {v:.2f} s" for k, v in part.items()),
            f"  steps lost per kill: median {med([f['steps_lost'] for f in r['faults']]):.0f}",
        ]
    lines += [
        f"  goodput with the kills {g['goodput']:.1%} of {g['wall_s']:.0f} s (goal >= 90%); without faults"
        f" {ref['goodput']['goodput']:.1%} ({ref['steps']} steps: start-up weighs more in a short run)",
        "    badput: " + ", ".join(f"{k[:-2].replace('_', ' ')} {v:.1f} s" for k, v in g["badput"].items()),
    ]
    if r.get("step_s_with_faults"):
        lines.append(
            f"  a step took {r['step_s_with_faults']:.2f} s (median) in this run against {ref['step_s']:.2f} s without"
            " snapshots: the RAM copies and disk writes share these cores with training (goodput counts a slower"
            " step as productive)"
        )
    return "\n".join(lines)


def log_snapshots(trainer, step, work: Path, logs: int) -> dict:
    """Log snapshots through the real engine (``snapshot_delta: log``, a snapshot after every step): a full
    base, then ``logs`` logs of one step each. Then the restore of the base alone and of the base + j logs
    (``Trainer.restore_snapshot``: DCP load, then each log's gradients replayed through ``optimizer.step()``),
    the last one compared bit for bit with the live state it rebuilds."""
    from workers.training.checkpoint import SnapshotManager
    from workers.training.checkpoint.storage import verify

    xor = trainer.snapshots
    mgr = SnapshotManager(
        work / "log-snapshots",
        process_group=xor.group,
        full_every=logs + 1,
        keep=1000,
        layout=trainer.layout(),
        delta="log",
    )
    trainer.snapshots = mgr  # train_step records each step's gradients while the next snapshot is a log
    out: dict = {}
    try:
        out["prepare_s"] = mgr.prepare(trainer.snapshot_state(), trainer.logged_parameters())
        base = mgr.save(trainer.step, trainer.snapshot_state)
        mgr.wait()
        records = [base]
        for _ in range(logs):
            step()
            records.append(mgr.save(trainer.step, trainer.snapshot_state, log_state=trainer.log_state))
            mgr.wait()
        live = state_digest(trainer)
        out["snapshots"] = [r.to_dict() for r in records]
        out["restores"] = []
        for j, record in enumerate(records):
            t0 = time.perf_counter()
            info = verify(mgr.root, record.name)  # the whole chain's files, hashed
            verify_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            trainer.restore_snapshot(info, rank_entries=True)
            out["restores"].append({"logs": j, "verify_s": verify_s, "restore_s": time.perf_counter() - t0})
        out["replay_bitwise"] = state_digest(trainer) == live
    finally:
        trainer.snapshots = xor
        mgr.close()
    return out


def state_digest(trainer) -> str:
    """sha256 of every weight and optimizer-state tensor (the bit-for-bit check of a replay)."""
    import torch

    from workers.training.checkpoint.storage import tensor_bytes

    sha = hashlib.sha256()
    state = trainer.snapshot_state(rank_entries=False)
    for part in ("model", "optimizer"):
        for key in sorted(state[part]):
            value = state[part][key]
            if isinstance(value, torch.Tensor):
                sha.update(key.encode())
                sha.update(tensor_bytes(value.detach().cpu().contiguous()))
    return sha.hexdigest()


def _tensors(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    else:
        yield obj


def report(r: dict) -> str:
    MB = 1e6
    stalls = [d["stall_s"] for d in r["deltas"]] + [r["full_async"]["stall_s"]]
    stall = statistics.median(stalls)
    full_bytes = r["full"]["bytes_written"]
    lines = [
        f"model {r['model']}: {r['params'] / 1e6:.1f}M parameters, AdamW (fp32 weights + 2 moments), "
        f"{r['cpu_cores']} CPU cores, training on {r['threads']} thread(s), lr {r['lr']:g}",
        f"training state {r['raw_state_bytes'] / MB:,.0f} MB raw; step time {r['step_s_quiet_median']:.2f} s",
        "",
        "training-thread stall per snapshot",
        f"  synchronous, dcp.save + FileSystemWriter       {r['dcp_sync_save_s'] * 1000:9.0f} ms"
        f"   ({r['dcp_sync_bytes'] / MB:,.0f} MB, uncompressed)",
        f"  synchronous, this engine (full, waited on)     {r['engine_sync_full_s'] * 1000:9.0f} ms",
        f"  asynchronous, this engine (staging only)       {stall * 1000:9.0f} ms   median of {len(stalls)}"
        f" (full {r['full_async']['stall_s'] * 1000:.0f} ms, deltas "
        + ", ".join(f"{d['stall_s'] * 1000:.0f}" for d in r["deltas"])
        + " ms)",
        f"  -> async stall is {r['dcp_sync_save_s'] / stall:.0f}x smaller than dcp.save, "
        f"{r['engine_sync_full_s'] / stall:.0f}x smaller than our own synchronous save (goal >= 10x)",
        f"  one-off start-up: both staging buffer sets allocated and touched in {r['prepare_s']:.2f} s",
        "",
        "the background write",
        f"  full snapshot written in {r['full_async']['write_s']:.1f} s; "
        + ", ".join(f"delta k={d['k']} in {d['write_s']:.1f} s" for d in r["deltas"]),
    ]
    if r["step_s_during_write_median"]:
        slow = r["step_s_during_write_median"] / r["step_s_quiet_median"] - 1
        lines.append(
            f"  step time beside a write {r['step_s_during_write_median']:.2f} s vs {r['step_s_quiet_median']:.2f} s "
            f"without ({slow:+.0%}, {r['steps_during_writes']} steps measured)"
        )
    lines += [
        "",
        "bytes on disk per snapshot (lossless)",
        f"  raw state                                      {r['raw_state_bytes'] / MB:9,.1f} MB",
        f"  full, byte-shuffled zstd                       {full_bytes / MB:9,.1f} MB   "
        f"({r['raw_state_bytes'] / full_bytes:.2f}x smaller than raw)",
    ]
    for d in r["deltas"]:
        lines.append(
            f"  delta {d['k']:>2} step(s) after its base (XOR+zstd)    {d['bytes_written'] / MB:9,.1f} MB   "
            f"({full_bytes / d['bytes_written']:.2f}x smaller than the full one; goal >= 2x)"
        )
    log = r["log"]
    log_full = log["snapshots"][0]["bytes_written"]
    for j, d in enumerate(log["snapshots"][1:], 1):
        label = f"log {j} of a chain (1 step's gradients, zstd)"
        lines.append(
            f"  {label:<47}{d['bytes_written'] / MB:9,.1f} MB   "
            f"({log_full / d['bytes_written']:.2f}x smaller than the full one; goal >= 2x)"
        )
    logs = log["snapshots"][1:]
    stall, copy = (statistics.median(x[k] for x in logs) * 1000 for k in ("stall_s", "record_s"))
    write = statistics.median(x["write_s"] for x in logs)
    restores = []
    for x in log["restores"]:
        what = "full alone" if x["logs"] == 0 else f"+ {x['logs']} log(s)"
        restores.append(f"{what} {x['verify_s'] + x['restore_s']:.1f} s (verify {x['verify_s']:.1f})")
    lines += [
        "",
        "log snapshots (snapshot_delta: log, a snapshot after every step)",
        f"  training-thread stall of a log {stall:.0f} ms (the gradient copy {copy:.0f} ms of it), median of"
        f" {len(logs)}; written in {write:.1f} s in the background; buffers touched in {log['prepare_s']:.2f} s",
        "  restore (verify the chain, load the full one, replay each log's step): " + "; ".join(restores),
        f"  the state rebuilt from the full snapshot + {len(restores) - 1} logs equals the live one bit for bit: "
        + ("yes" if log["replay_bitwise"] else "NO"),
    ]
    return "\n".join(lines)


def main() -> int:
    parser = bench_parser(__doc__, json_flag=True)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--ffn", type=int, default=2560)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--k", type=int, nargs="+", default=[1, 4], help="delta taken k steps after its base")
    parser.add_argument(
        "--logs", type=int, default=3, help="log snapshots (one step each) after their full one"
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dir", default=None, help="scratch directory (default: the system temp dir)")
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=["snapshots", "recovery", "hotswap"],
        default=["snapshots", "recovery", "hotswap"],
    )
    parser.add_argument("--hotswap-steps", type=int, default=30, help="hotswap: steps of the run")
    parser.add_argument("--hotswap-kill-at", type=int, default=12, help="hotswap: the step a replica dies at")
    parser.add_argument(
        "--heartbeat-timeout-ms",
        type=int,
        default=500,
        help="hotswap: the Lighthouse drops a replica whose heartbeat (every 100 ms) is this old",
    )
    parser.add_argument("--ranks", type=int, default=2, help="data-parallel ranks of the recovery runs")
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the run with kills")
    parser.add_argument("--kill-every", type=float, default=60.0, help="seconds between two rank kills")
    parser.add_argument(
        "--snapshot-interval", type=float, default=12.0, help="seconds between disk snapshots (recovery)"
    )
    parser.add_argument(
        "--memory-every",
        type=int,
        default=0,
        help="recovery: also keep each rank's state in RAM every N steps (snapshot_memory_every; 0: off)",
    )
    parser.add_argument("--reference-steps", type=int, default=40, help="steps of the run without faults")
    args = parser.parse_args()
    result = {}
    if "snapshots" in args.parts:
        result["snapshots"] = run(args)
        print(json.dumps(result["snapshots"]) if args.json else report(result["snapshots"]), flush=True)
    if "recovery" in args.parts:
        result["recovery"] = recovery(args)
        print(json.dumps(result["recovery"]) if args.json else "\n" + report_recovery(result["recovery"]))
    if "hotswap" in args.parts:
        result["hotswap"] = hot_swap_part(args)
        print(json.dumps(result["hotswap"]) if args.json else "\n" + report_hot_swap(result["hotswap"]))
    return 0


def hot_swap_part(args) -> dict:
    """Part 5: the same model as torchft replica groups (``bench/hotswap.py``'s run, a warm spare): one
    replica SIGKILLed; kill -> the survivors' next committed step, and the spare back in the group."""
    import types

    import hotswap  # bench/hotswap.py (bench/ is on sys.path: this script's folder)

    with scratch_dir("cann-hotswap-part-", args.dir) as work:
        model = work / "model.json"
        model.write_text(json.dumps(model_spec(args.layers, args.hidden, args.ffn, args.seq)))
        options = types.SimpleNamespace(
            model=str(model), replicas=args.ranks, steps=args.hotswap_steps, kill_at=args.hotswap_kill_at,
            heartbeat_timeout_ms=args.heartbeat_timeout_ms, timeout=1200, kill_delay=0.0,
            global_batch=args.batch,  # the recovery part's batch: one sample per replica by default
        )  # fmt: skip
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        # the kill right after a committed step (the survivors must then compute a whole step alone), and
        # half a step later (inside a step, where a real crash lands on average)
        boundary = hotswap.hot_swap(options, 1, work / "boundary")
        options.kill_delay = boundary["step_s_before"] / 2
        inside = hotswap.hot_swap(options, 1, work / "inside")
        for run in (boundary, inside):
            run.pop("losses")
        return {
            "boundary": boundary,
            "inside": inside,
            "kill_delay_s": options.kill_delay,
            "replicas": args.ranks,
            "heartbeat_timeout_ms": args.heartbeat_timeout_ms,
            "goal_s": hotswap.GOAL_RTO_S,
        }


def report_hot_swap(r: dict) -> str:
    b, i = r["boundary"], r["inside"]
    goal = r["goal_s"]
    return "\n".join(
        [
            f"hot swap (torchft replica groups, a warm spare): {r['replicas']} data-parallel replicas, heartbeat"
            f" timeout {r['heartbeat_timeout_ms']} ms, a survivor's step {b['step_s_before']:.2f} s",
            f"  kill -> the survivors' next committed step (goal <= {goal:g} s):",
            f"    kill right after step {b['killed_at_step']} was committed: {b['rto_s']:.2f} s"
            f" ({'met' if b['rto_s'] <= goal else 'NOT met'}; one whole step computed alone after it), steps"
            f" lost {b['steps_lost']}",
            f"    kill {r['kill_delay_s']:.2f} s into a step: {i['rto_s']:.2f} s"
            f" ({'met' if i['rto_s'] <= goal else 'NOT met'}; the survivors' gradients of that step all-reduced"
            f" again, not recomputed), steps lost {i['steps_lost']}",
            f"  kill -> the spare training in the group: {b['rejoin_s']:.2f} s / {i['rejoin_s']:.2f} s (first"
            f" quorum + weights from a healthy peer {b['heal_s']:.2f} s), checksums equal after the rejoin:"
            f" {b['checksums_equal_after_rejoin'] and i['checksums_equal_after_rejoin']}",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
