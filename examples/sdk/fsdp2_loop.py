"""An FSDP2 training loop that takes its layout from the plan: ``run.strategy`` says how many ranks shard the
parameters (``dp``, with ``zero_stage`` 3 resharding after forward) and ``run.strategy.mesh()`` is the
``DeviceMesh`` to shard them on. Its snapshots hold the sharded parameters and optimizer state as DTensors:
a snapshot of 2 ranks continues on 1 or 4 (DCP reshards).

    cann-train launch --nproc 2 --snapshot-every 5 -- examples/sdk/fsdp2_loop.py --steps 30
    # through the control plane: {"entrypoint": {"script": ".../fsdp2_loop.py", "nproc_per_node": 2},
    #                             "strategy": {"dp": 2, "zero_stage": 3}, ...}
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from ddp_loop import TinyLM, batch  # the same model and data as the DDP example (its directory is the cwd)
from torch import nn
from torch.distributed.fsdp import fully_shard

import cann_train


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=None, help="default: the job's steps, else 30")
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument(
        "--snapshot-every", type=int, default=5, help="a local run's (a job's own overrides it)"
    )
    args = parser.parse_args()

    run = cann_train.init(snapshot_every=args.snapshot_every, strategy={"dp": 1, "zero_stage": 3})
    steps = args.steps or run.steps or 30
    s = run.strategy
    if s.tp * s.pp * s.cp != 1:
        raise SystemExit(f"this example shards over data-parallel ranks only; the plan says {s.short_name()}")
    torch.manual_seed(run.seed)
    model = TinyLM()
    if run.world_size > 1:
        mesh = s.mesh(run.device.type)["dp"]
        reshard = s.zero_stage == 3  # ZeRO-3: parameters gathered for each use and freed after it
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(run.hyperparameters.get("lr", 3e-3)))
    state = {"model": model, "optimizer": optimizer}

    start = run.restore(state)
    tokens = args.batch * args.seq * run.world_size
    for step in range(start + 1, steps + 1):
        inputs, labels = batch(
            step, run.rank, run.world_size, size=args.batch, seq=args.seq, vocab=256, seed=run.seed
        )
        loss = nn.functional.cross_entropy(model(inputs).flatten(0, 1), labels.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        reported = loss.detach().clone()
        if run.world_size > 1:
            dist.all_reduce(reported, op=dist.ReduceOp.AVG)
        run.report(step, loss=reported, tokens=tokens, zero_stage=s.zero_stage)
        due = run.snapshot_due(step)
        if due:
            run.snapshot(step, state)
        if run.should_stop():
            if not due:
                run.snapshot(step, state)
            break
    run.finish()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
