"""The SDK in a ``transformers.Trainer``: one callback does what the loop of ``examples/sdk/ddp_loop.py`` does by
hand. The Trainer keeps checkpointing itself (``checkpoint-N`` directories: model, optimizer, scheduler, RNG
and data position), in the job's snapshot directory, and resumes from the newest one::

    import cann_train
    from cann_train.integrations.transformers import CannTrainCallback, training_arguments, last_checkpoint

    run = cann_train.init()
    args = training_arguments(run, per_device_train_batch_size=8, max_steps=1000, learning_rate=3e-4)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[CannTrainCallback(run)])
    trainer.train(resume_from_checkpoint=last_checkpoint(run))

Each step the callback reports (the loss and learning rate of every logging step; use ``logging_steps=1`` for
a loss point per step), asks the Trainer to save when ``run.snapshot_due(step)`` (the job's ``snapshot_every``
and the risk loop's "snapshot now") and to save and stop when ``run.should_stop()`` (a cancel or a carbon-aware
pause); the supervisor sees the resume, each step and the end as it sees our runtime's.
"""

from __future__ import annotations

import time
from pathlib import Path

from transformers import TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

import cann_train


def training_arguments(run, **kwargs) -> TrainingArguments:
    """``TrainingArguments`` for the job: checkpoints in its snapshot directory (or ``./cann-train-run/hf``), saved
    when the callback asks (not on a schedule of the Trainer's own), a loss point every step, no reporting
    integrations, the job's seed, the CPU when the job's device is the CPU (gloo between the ranks)."""
    out = Path(run.snapshot_dir) if run.snapshot_dir else run.directory / "hf"
    defaults = {
        "output_dir": str(out),
        "save_strategy": "no",
        "logging_steps": 1,
        "report_to": [],
        "seed": run.seed,
        "data_seed": run.seed,
        "include_num_input_tokens_seen": True,
        "save_total_limit": int(run.config.get("snapshot_keep") or 3),
    }
    if run.device.type == "cpu":
        defaults.update(use_cpu=True, ddp_backend="gloo")
    if run.steps:
        defaults["max_steps"] = int(run.steps)
    return TrainingArguments(**{**defaults, **kwargs})


def last_checkpoint(run) -> str | None:
    """The newest ``checkpoint-N`` of the job (the Trainer's ``resume_from_checkpoint``), or None."""
    out = Path(run.snapshot_dir) if run.snapshot_dir else run.directory / "hf"
    return get_last_checkpoint(str(out)) if out.is_dir() else None


class CannTrainCallback(TrainerCallback):
    """Reports each step, saves when the run says so, stops when asked (module docstring)."""

    def __init__(self, run=None):
        self.run = run if run is not None else cann_train.init()
        self._tokens_seen = 0
        self._save_started: float | None = None
        self._stopping = False

    def _tokens(self, state) -> int | None:
        seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        delta, self._tokens_seen = seen - self._tokens_seen, seen
        return delta if delta > 0 else None

    def on_train_begin(self, args, state, control, **kwargs):
        self._tokens_seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        step = int(state.global_step)
        self.run.restored_by_framework(step, f"checkpoint-{step}" if step else None)

    def on_step_end(self, args, state, control, **kwargs):
        step = int(state.global_step)
        if not control.should_log:  # a logging step reports in on_log, with its loss
            self.run.report(step, tokens=self._tokens(state))
        if self.run.snapshot_due(step):
            control.should_save = True
        if self.run.should_stop():
            self._stopping = True
            control.should_save = True
            control.should_training_stop = True
        if control.should_save:
            self._save_started = time.perf_counter()
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "loss" not in logs:  # the summary line at the end of training, an evaluation
            return
        extra = {
            k: logs[k]
            for k in ("learning_rate", "grad_norm", "epoch")
            if isinstance(logs.get(k), int | float)
        }
        self.run.report(int(state.global_step), loss=float(logs["loss"]), tokens=self._tokens(state), **extra)

    def on_save(self, args, state, control, **kwargs):
        stall = time.perf_counter() - self._save_started if self._save_started is not None else 0.0
        self._save_started = None
        self.run.snapshot_taken_by_framework(int(state.global_step), f"checkpoint-{state.global_step}", stall)

    def on_train_end(self, args, state, control, **kwargs):
        self.run.finish()
