"""The SDK in a Lightning ``Trainer``: one callback reports each step, checkpoints when the run says so and
stops when asked; Lightning keeps checkpointing and resuming itself (model, optimizers, schedulers, loops)::

    import cann_train
    from cann_train.integrations.lightning import CannTrainCallback, last_checkpoint

    run = cann_train.init()
    trainer = L.Trainer(max_steps=1000, callbacks=[CannTrainCallback(run)], enable_checkpointing=False, ...)
    trainer.fit(module, data, ckpt_path=last_checkpoint(run))

The module's ``training_step`` returns its loss (a tensor, or a dict with ``loss``), as Lightning wants; the
callback reports it with the step's tokens when the module sets ``self.tokens_per_step``.
"""

from __future__ import annotations

import time
from pathlib import Path

import lightning as L  # noqa: N812 - Lightning's own spelling

import cann_train

PREFIX = "lightning-step="


def _dir(run) -> Path:
    return Path(run.snapshot_dir) if run.snapshot_dir else run.directory / "lightning"


def last_checkpoint(run) -> str | None:
    """The newest checkpoint the callback wrote for the job (``fit``'s ``ckpt_path``), or None."""
    found = sorted(_dir(run).glob(f"{PREFIX}*.ckpt"), key=lambda p: int(p.stem[len(PREFIX) :]))
    return str(found[-1]) if found else None


class CannTrainCallback(L.Callback):
    """Reports each step, checkpoints when the run says so, stops when asked (module docstring)."""

    def __init__(self, run=None, keep: int | None = None):
        self.run = run if run is not None else cann_train.init()
        self.keep = keep or int(self.run.config.get("snapshot_keep") or 3)

    def on_train_start(self, trainer, pl_module):
        step = int(trainer.global_step)
        self.run.restored_by_framework(step, f"{PREFIX}{step}" if step else None)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = int(trainer.global_step)
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self.run.report(step, loss=loss, tokens=getattr(pl_module, "tokens_per_step", None))
        due = self.run.snapshot_due(step)
        stop = self.run.should_stop()
        if due or stop:
            t0 = time.perf_counter()
            path = _dir(self.run) / f"{PREFIX}{step}.ckpt"
            trainer.save_checkpoint(str(path))
            self.run.snapshot_taken_by_framework(step, path.name, time.perf_counter() - t0)
            if trainer.is_global_zero:
                for old in sorted(
                    _dir(self.run).glob(f"{PREFIX}*.ckpt"), key=lambda p: int(p.stem[len(PREFIX) :])
                )[: -self.keep]:
                    old.unlink(missing_ok=True)
        if stop:
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module):
        self.run.finish()
