"""A plain DDP training loop with the cann-train SDK: five calls give it live charts, recovery from its own
snapshots, energy, fault risk and clean stops.

    python examples/sdk/ddp_loop.py --steps 30                  # locally: ./cann-train-run
    torchrun --nproc-per-node 2 examples/sdk/ddp_loop.py        # your own torchrun
    cann-train launch --nproc 2 --snapshot-every 5 -- examples/sdk/ddp_loop.py --steps 30

The data is a deterministic function of the step (a next-token task on a fixed random "language"), so a
run that resumes from a snapshot sees exactly the batches it would have seen: its losses equal an
uninterrupted run's, bit for bit, on CPU.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import cann_train


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 256, width: int = 64, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.Sequential(
            *[nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU()) for _ in range(layers)]
        )
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(ids)))


def batch(step: int, rank: int, world: int, *, size: int, seq: int, vocab: int, seed: int):
    """This rank's share of step ``step``'s global batch: the same whatever happened before."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    a = 2 * (seed % 64) + 3  # the "language": each token is the one before plus a, modulo the vocabulary
    start = torch.randint(0, vocab, (size * world, 1), generator=g)
    ids = (start + a * torch.arange(seq + 1)) % vocab
    mine = ids[rank * size : (rank + 1) * size]
    return mine[:, :-1], mine[:, 1:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=None, help="default: the job's steps, else 30")
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument(
        "--snapshot-every", type=int, default=5, help="a local run's (a job's own overrides it)"
    )
    args = parser.parse_args()

    run = cann_train.init(hyperparameters={"lr": 3e-3}, snapshot_every=args.snapshot_every)
    steps = args.steps or run.steps or 30
    lr = float(run.hyperparameters.get("lr", 3e-3))
    torch.manual_seed(run.seed)
    model = TinyLM()
    ddp = DDP(model) if run.world_size > 1 else model
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=lr)
    state = {"model": ddp, "optimizer": optimizer}

    start = run.restore(state)
    tokens = args.batch * args.seq * run.world_size
    for step in range(start + 1, steps + 1):
        inputs, labels = batch(
            step, run.rank, run.world_size, size=args.batch, seq=args.seq, vocab=256, seed=run.seed
        )
        loss = nn.functional.cross_entropy(ddp(inputs).flatten(0, 1), labels.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        # the loss every rank agrees on (the mean over ranks): what the job page draws
        reported = loss.detach().clone()
        if run.world_size > 1:
            dist.all_reduce(reported, op=dist.ReduceOp.AVG)
        run.report(step, loss=reported, tokens=tokens, lr=lr)
        due = run.snapshot_due(step)
        if due:
            run.snapshot(step, state)
        if run.should_stop():  # cancelled, drained or paused: keep this step, and exit cleanly
            if not due:
                run.snapshot(step, state)
            break
    run.finish()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
