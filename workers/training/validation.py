"""A validation loss on held-out tokens, every ``val_every`` steps and at the end of the run.

The same batches every time (the first ``VAL_BATCHES`` global batches of the validation shards, in the data
loader's order of epoch 0), forward only, in every layout the training runs (a pipeline through its
schedule's ``eval``); the mean over every token of them, the same number on every rank. The MoE layers'
expert-load counters are put back afterwards: a validation forward is not training load.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from workers.training.data import ShardedTokenLoader, TokenCorpus

VAL_BATCHES = 4  # global batches per evaluation (fewer when the split holds fewer)


class Validation:
    def __init__(self, trainer, files: list):
        cfg = trainer.cfg
        self.trainer = trainer
        self.corpus = TokenCorpus(files)
        samples = self.corpus.num_tokens // (cfg.model.seq_length + 1)
        self.batches = min(VAL_BATCHES, samples // cfg.training.global_batch_size)
        if self.batches < 1:
            raise ValueError(
                f"val_fraction: the validation split holds {self.corpus.num_tokens:,} tokens, fewer than one "
                f"global batch of {cfg.training.global_batch_size} x {cfg.model.seq_length + 1}: hold out more"
            )
        self.last: float | None = None

    @classmethod
    def for_run(cls, trainer, files: list | None) -> Validation | None:
        return cls(trainer, files) if files else None

    def due(self, step: int, end: int) -> bool:
        every = self.trainer.cfg.val_every
        return step == end or bool(every and step % every == 0)

    def after(self, step: int, end: int) -> dict:
        """``{"val_loss": ...}`` on the steps it is due (every rank calls it: collectives), else ``{}``."""
        if not self.due(step, end):
            return {}
        self.last = self.loss()
        return {"val_loss": self.last}

    def loss(self) -> float:
        t = self.trainer
        cfg, pm = t.cfg, t.pm
        loader = ShardedTokenLoader(
            self.corpus,
            cfg.model.seq_length,
            cfg.training.global_batch_size,
            dp_rank=pm.coords["dp"],
            dp_size=pm.dims.dp,
            seed=cfg.seed,
            consumed_samples=0,
        )
        counters = [(moe, moe.tokens_per_expert.clone()) for _, moe in pm.moe_layers()]
        total = torch.zeros(2, dtype=torch.float64, device=t.device)  # summed loss, batches
        for part in pm.parts:
            part.eval()
        try:
            with torch.no_grad(), _autocast(t):
                for _ in range(self.batches):
                    inputs, labels = loader.next_batch()
                    inputs, labels = inputs.to(t.device), labels.to(t.device)
                    inputs, labels = pm.shard_sequence(inputs), pm.shard_sequence(labels)
                    loss = self._forward(inputs, labels)
                    if loss is not None:
                        total += torch.stack(
                            [loss.double(), torch.ones((), dtype=torch.float64, device=t.device)]
                        )
        finally:
            for part in pm.parts:
                part.train()
            for moe, saved in counters:
                moe.tokens_per_expert.copy_(saved)
        if dist.is_initialized():
            dist.all_reduce(total)
        return float(total[0] / total[1])

    def _forward(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        from workers.training.parallelize import cross_entropy

        pm, mbs = self.trainer.pm, self.trainer.cfg.strategy.micro_batch_size
        if pm.schedule is not None:
            losses: list[torch.Tensor] = []
            args = (inputs,) if pm.has_first_stage else ()
            kwargs = {"target": labels, "losses": losses} if pm.has_last_stage else {}
            pm.schedule.eval(*args, **kwargs)
            return torch.stack(losses).mean() if pm.has_last_stage else None
        part = pm.parts[0]
        parts = [cross_entropy(part(x), y) for x, y in zip(inputs.split(mbs), labels.split(mbs), strict=True)]
        return torch.stack(parts).mean()


def _autocast(trainer):
    if trainer.autocast:
        return torch.autocast(trainer.device.type, dtype=trainer.autocast)
    return contextlib.nullcontext()
