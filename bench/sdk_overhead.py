"""What the SDK costs a user's training loop: the same loop (the DDP example's model and data, one process,
fp32 on this machine's CPUs) with and without ``cann_train`` calls, side by side in one run.

The SDK variant runs as a launched job does: a supervisor's progress directory (progress file and rank 0's
timeline, step times, the snapshot-now and stop-now requests looked at every step) and, with
``--redis-url``, events published onto a stream of a job; without it, a local run's events file. Each step it
calls ``report``, ``snapshot_due`` and ``should_stop``; every ``--snapshot-every`` steps ``snapshot`` (its stall,
the copy to CPU memory, is measured and left out of the overhead, as the goal says). Variants alternate
(plain, sdk, plain, sdk, ...) in fresh processes so that drift of a shared machine hits both.

    python bench/sdk_overhead.py [--steps 200] [--repeats 3] [--width 256] [--redis-url redis://...]

Goal (issue 33): SDK overhead <= 2% of the step time, besides the snapshot stall itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def one(variant: str, steps: int, width: int, every: int) -> dict:
    """One run of the loop in this process: per-step times (the snapshot's own stall left out)."""
    import torch
    from torch import nn

    sys.path.insert(0, str(ROOT / "examples" / "sdk"))
    from ddp_loop import TinyLM, batch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyLM(width=width, layers=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run = None
    if variant == "sdk":
        import cann_train

        run = cann_train.init(snapshot_every=every)
        state = {"model": model, "optimizer": optimizer}
        run.restore(state)
    times, stalls, sdk_s = [], [], []
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        inputs, labels = batch(step, 0, 1, size=8, seq=64, vocab=256, seed=0)
        loss = nn.functional.cross_entropy(model(inputs).flatten(0, 1), labels.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        stall = 0.0
        if run is not None:
            t_sdk = time.perf_counter()
            run.report(step, loss=loss, tokens=8 * 64)
            if run.snapshot_due(step):
                t_snap = time.perf_counter()
                run.snapshot(step, state)
                stall = time.perf_counter() - t_snap
            run.should_stop()
            sdk_s.append(time.perf_counter() - t_sdk - stall)
        else:
            float(loss)  # the plain loop reads its loss too (a log line would)
        times.append(time.perf_counter() - t0 - stall)
        stalls.append(stall)
    if run is not None:
        run.finish()
    return {"times": times[5:], "stalls": [s for s in stalls if s], "sdk_s": sdk_s[5:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--snapshot-every", type=int, default=50)
    parser.add_argument(
        "--redis-url", default=None, help="publish the SDK's events to this Redis (a job's stream)"
    )
    parser.add_argument("--variant", choices=("plain", "sdk"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(one(args.variant, args.steps, args.width, args.snapshot_every)))
        return
    results: dict[str, list[dict]] = {"plain": [], "sdk": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for variant in ("plain", "sdk"):
                run_dir = Path(tmp) / f"{variant}{r}"
                (run_dir / "progress").mkdir(parents=True)
                env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
                env["CANN_TRAIN_PROGRESS_DIR"] = str(run_dir / "progress")
                config = {"snapshot_every": args.snapshot_every, "snapshot_dir": str(run_dir / "snapshots"),
                          "energy": {"enabled": False}}  # fmt: skip
                if args.redis_url:
                    config.update(job_id=str(900_000 + r), redis_url=args.redis_url)
                    (run_dir / "run.json").write_text(json.dumps(config))
                    env["CANN_TRAIN_RUN_CONFIG"] = str(run_dir / "run.json")
                else:
                    env["CANN_TRAIN_LOCAL_DIR"] = str(run_dir)
                done = subprocess.run(
                    [sys.executable, __file__, "--variant", variant, "--steps", str(args.steps),
                     "--width", str(args.width), "--snapshot-every", str(args.snapshot_every)],
                    env=env, capture_output=True, text=True, check=True, cwd=ROOT,
                )  # fmt: skip
                results[variant].append(json.loads(done.stdout.strip().splitlines()[-1]))
    plain = [statistics.median(r["times"]) for r in results["plain"]]
    sdk = [statistics.median(r["times"]) for r in results["sdk"]]
    in_sdk = [statistics.median(r["sdk_s"]) for r in results["sdk"]]
    stalls = [s for r in results["sdk"] for s in r["stalls"]]
    p, s = statistics.median(plain), statistics.median(sdk)
    print(f"loop: TinyLM width {args.width}, 4 layers, batch 8 x 64 tokens, {args.steps} steps, 1 process, "
          f"{'events to Redis' if args.redis_url else 'events to a local file'}, progress files watched")  # fmt: skip
    print(
        f"median step, plain loop:            {p * 1000:8.3f} ms  (runs: {', '.join(f'{x * 1000:.3f}' for x in plain)})"
    )
    print(
        f"median step, with the SDK:          {s * 1000:8.3f} ms  (runs: {', '.join(f'{x * 1000:.3f}' for x in sdk)})"
    )
    print(f"time inside the SDK calls per step: {statistics.median(in_sdk) * 1000:8.3f} ms "
          f"= {statistics.median(in_sdk) / p * 100:.2f}% of the plain step")  # fmt: skip
    print(
        f"step time ratio sdk / plain:        {s / p:8.4f}  (overhead {(s / p - 1) * 100:+.2f}%, goal <= 2%)"
    )
    if stalls:
        print(f"snapshot stall (left out above):    median {statistics.median(stalls) * 1000:.1f} ms over "
              f"{len(stalls)} snapshot(s), every {args.snapshot_every} steps")  # fmt: skip


if __name__ == "__main__":
    main()
