"""A Lightning ``Trainer`` under cann-train: the DDP example's model and data as a ``LightningModule``, with the
SDK's callback (live loss, recovery from Lightning's own checkpoints, clean stops).

    cann-train launch --nproc 2 --snapshot-every 5 -- examples/sdk/lightning_module.py --steps 20
"""

from __future__ import annotations

import argparse

import lightning as L  # noqa: N812
import torch
from ddp_loop import TinyLM, batch
from torch import nn

import cann_train
from cann_train.integrations.lightning import CannTrainCallback, last_checkpoint


class Module(L.LightningModule):
    """The DDP example's model; each step's batch is a function of the global step (as in that example), so
    a run resumed from a checkpoint mid-epoch trains on exactly the batches it would have (Lightning restarts
    a plain DataLoader from the epoch's start: the loader here only counts the steps)."""

    def __init__(self, run, lr: float, size: int, seq: int):
        super().__init__()
        self.run, self.model, self.lr, self.size, self.seq = run, TinyLM(), lr, size, seq
        self.tokens_per_step = size * seq * run.world_size

    def training_step(self, _item, _index):
        inputs, labels = batch(
            self.global_step + 1, self.run.rank, self.run.world_size, size=self.size, seq=self.seq, vocab=256,
            seed=self.run.seed,
        )  # fmt: skip
        return nn.functional.cross_entropy(self.model(inputs).flatten(0, 1), labels.flatten())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=None, help="default: the job's steps, else 20")
    parser.add_argument(
        "--snapshot-every", type=int, default=5, help="a local run's (a job's own overrides it)"
    )
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    parser.add_argument("--seq", type=int, default=32)
    args = parser.parse_args()

    run = cann_train.init(snapshot_every=args.snapshot_every, hyperparameters={"lr": 3e-3})
    steps = args.steps or run.steps or 20
    torch.manual_seed(run.seed)
    module = Module(run, float(run.hyperparameters.get("lr", 3e-3)), args.batch, args.seq)
    data = torch.utils.data.DataLoader(range(steps), batch_size=1, shuffle=False)
    trainer = L.Trainer(
        max_steps=steps, accelerator="cpu", devices=run.local_world_size if run.world_size > 1 else 1,
        num_nodes=max(1, run.world_size // max(1, run.local_world_size)),
        strategy="ddp" if run.world_size > 1 else "auto", use_distributed_sampler=False,
        enable_checkpointing=False, logger=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[CannTrainCallback(run)],
    )  # fmt: skip
    trainer.fit(module, data, ckpt_path=last_checkpoint(run))


if __name__ == "__main__":
    main()
