"""cann-train's SDK: a few calls in your own training loop give it every platform feature.

::

    import cann_train

    run = cann_train.init()                      # the job's identity, device, strategy, hyper-parameters
    state = {"model": model, "optimizer": optimizer}
    start = run.restore(state)                   # the newest good snapshot, or 0 on a fresh start
    for step in range(start + 1, steps + 1):
        loss = train_step(...)
        run.report(step, loss=loss, tokens=tokens_this_step)   # live charts, step times, energy per token
        if run.snapshot_due(step):
            run.snapshot(step, state)            # asynchronous, verified, incremental, reshardable
        if run.should_stop():                    # cancelled, drained or paused: snapshot and exit cleanly
            run.snapshot(step, state)
            break
    run.finish()

Launched by cann-train (a job with an ``entrypoint``, or ``cann-train launch -- script.py``), the run
publishes onto the job's live stream, its supervisor watches its progress (a killed or hung rank restarts the
ranks, which ``restore`` from the newest good snapshot), meters its energy and scores its fault risk. Run as
plain ``python script.py`` (or under a torchrun of your own), the same script runs locally: events go to
``<dir>/events.jsonl`` and snapshots to ``<dir>/snapshots`` (``init(dir=...)``, default ``./cann-train-run``).

Integrations: :mod:`cann_train.integrations.transformers` (a ``TrainerCallback``) and
:mod:`cann_train.integrations.lightning` (a Lightning ``Callback``).
"""

from __future__ import annotations

from cann_train.run import Run, Strategy, init

__all__ = ["Run", "Strategy", "init"]
