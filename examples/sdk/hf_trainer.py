"""A ``transformers.Trainer`` under cann-train: a tiny random Llama trained on a deterministic toy corpus, with
the SDK's callback (live loss, recovery from the Trainer's own checkpoints, clean stops).

    cann-train launch --nproc 2 --snapshot-every 5 -- examples/sdk/hf_trainer.py --steps 20
"""

from __future__ import annotations

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer

import cann_train
from cann_train.integrations.transformers import CannTrainCallback, last_checkpoint, training_arguments


class ToyCorpus(torch.utils.data.Dataset):
    """Sequences of a fixed "language" (each token the one before plus a stride): the same for every run."""

    def __init__(self, n: int = 512, seq: int = 32, vocab: int = 256):
        g = torch.Generator().manual_seed(0)
        start = torch.randint(0, vocab, (n, 1), generator=g)
        stride = torch.randint(1, 8, (n, 1), generator=g)
        self.ids = (start + stride * torch.arange(seq)) % vocab

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=None, help="default: the job's steps, else 20")
    parser.add_argument(
        "--snapshot-every", type=int, default=5, help="a local run's (a job's own overrides it)"
    )
    args = parser.parse_args()

    run = cann_train.init(snapshot_every=args.snapshot_every, hyperparameters={"lr": 1e-3})
    torch.manual_seed(run.seed)
    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    training = training_arguments(
        run,
        max_steps=args.steps or run.steps or 20,
        per_device_train_batch_size=4,
        learning_rate=float(run.hyperparameters.get("lr", 1e-3)),
        lr_scheduler_type="constant",
        dataloader_num_workers=0,
    )
    trainer = Trainer(
        model=model, args=training, train_dataset=ToyCorpus(), callbacks=[CannTrainCallback(run)]
    )
    trainer.train(resume_from_checkpoint=last_checkpoint(run))


if __name__ == "__main__":
    main()
