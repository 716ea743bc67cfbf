"""torchrun with warm restarts: the node's agent imports the runtime once and *forks* every rank from it.

``python -m workers.training.supervision.agent <torchrun's flags> -m workers.training.run --config job.json`` takes
exactly torchrun's command line (its own parser, ``torch.distributed.run.config_from_args``) and runs
torchrun's elastic agent (``elastic_launch``: c10d rendezvous, ``--max-restarts``, monitoring, the same
exit codes), but with the runtime as a Python function and ``start_method="fork"`` (the runtime, or
another rank module of :data:`RUNTIMES`). torchrun itself starts
each rank as a new interpreter, which imports torch and the runtime again: 4-9 s per restart on these
2-core machines (``import workers.training.trainer`` measured 9.2 s under load), the largest part of the
recovery time after a rank dies. Here the agent pays for the import once, before any rank exists; a
restart forks the ranks from it in milliseconds.

Safe because the agent never computes: no OpenMP pool, no CUDA/NPU context exists when it forks (importing
torch creates neither), and each rank builds its own process groups after the fork. Only the rank
modules of :data:`RUNTIMES` (``-m workers.training.run``, a comparison's ``workers.training.comm.compare``)
run this way; anything else is started as torchrun starts it.
"""

from __future__ import annotations

import sys

from workers.devices import backend as device_mod

device_mod.prepare_environment()  # before torch is imported (torch-npu without CANN would break it)

RUNTIME = "workers.training.run"
RUNTIMES = {
    # module a rank runs -> (module holding its main, that function's name)
    RUNTIME: ("workers.training.run", "main"),
    # a communication comparison's ranks: the runtime plus rank 0's step file
    "workers.training.comm.compare": ("workers.training.comm.compare", "rank_main"),
}
"""The rank modules the agent forks from its import; anything else is started as torchrun starts it."""


def run_rank(module: str, *argv: str) -> int:
    """A forked rank: ``module``'s main (:data:`RUNTIMES`) with its own arguments (exceptions are torchrun's
    to record)."""
    import signal

    # A forked child inherits the agent's Python signal handlers (torchrun turns SIGTERM into an exception
    # for its own shutdown). A rank must die on SIGTERM as a spawned one does: an exception raised in one
    # rank in the middle of a collective would leave its peers waiting for the collective timeout.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    # torchrun sets OMP_NUM_THREADS (1 per rank when a node runs several) in the agent after torch was
    # imported, and OpenMP read it at that import: a forked rank kept the agent's pool (one thread per core),
    # so N ranks ran N x cores threads (measured: 2-3 s steps instead of ~0.1 s for the tiny 4-rank job of
    # tests/integration/test_fault_risk_jobs.py on 2 cores). The rank sets its own pool from the variable.
    import os

    import torch

    if (threads := os.environ.get("OMP_NUM_THREADS", "")).isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    import importlib

    where, name = RUNTIMES[module]
    return getattr(importlib.import_module(where), name)(list(argv))


def fork_safe() -> bool:
    """No accelerator runtime is initialised in this process (a forked child could not use it) and
    ``torch_npu`` is not loaded (its import brings the CANN runtime up)."""
    import torch

    return not torch.cuda.is_initialized() and "torch_npu" not in sys.modules


def count_group_starts() -> None:
    """Before each start of the ranks, the agent counts it into ``GROUP_START_ENV`` (its own environment,
    which every rank it forks or spawns inherits): a rank of a group re-formed after a membership change can
    then tell it is not the run's first start although torchrun's restart count says 0, and resume instead
    of taking the run's own snapshots for another run's (seen when a job of ``--nnodes 1:2`` began on one
    node and grew). torch has no hook for this and ``elastic_launch`` builds its agent itself, hence the
    wrapper around ``LocalElasticAgent._start_workers`` (every start goes through it: first, after a
    failure, after a membership change)."""
    import os

    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    from workers.training.supervision.progress import GROUP_START_ENV

    start = LocalElasticAgent._start_workers
    if getattr(start, "counts_group_starts", False):
        return

    def counted(self, worker_group):
        os.environ[GROUP_START_ENV] = str(int(os.environ.get(GROUP_START_ENV, "0")) + 1)
        return start(self, worker_group)

    counted.counts_group_starts = True
    LocalElasticAgent._start_workers = counted


def main(argv: list[str] | None = None) -> int:
    import torch.distributed.run as torchrun
    from torch.distributed.launcher.api import elastic_launch

    args = torchrun.get_args_parser().parse_args(argv)
    config, cmd, cmd_args = torchrun.config_from_args(args)
    if args.module and args.training_script in RUNTIMES and not args.no_python:
        import importlib

        import workers.training.trainer  # noqa: F401  (the import every forked rank then inherits)

        importlib.import_module(RUNTIMES[args.training_script][0])
        if not fork_safe():  # pragma: no cover - an accelerator runtime came up during the import
            entrypoint, entry_args = cmd, cmd_args
        else:
            config.start_method = "fork"
            entrypoint = run_rank
            entry_args = [args.training_script, *args.training_script_args]
    else:
        entrypoint, entry_args = cmd, cmd_args
    count_group_starts()
    elastic_launch(config=config, entrypoint=entrypoint)(*entry_args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
