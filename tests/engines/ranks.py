"""One harness for the engine tests that run scenarios in a real multi-rank process group on this host.

:func:`spawn_ranks` starts ``world`` processes (``torch.multiprocessing.spawn``) on 127.0.0.1, each with
one OpenMP/torch thread and, unless told otherwise, a gloo group of its own; in each it calls the test
module's ``scenarios(rank, world, *args)`` and hands what that returned (a dict of tensors and figures)
back to the test process, rank by rank. The tests then pin the behaviour down from those results.

``group=False`` leaves the group to the code under test (the runtime's ``Trainer`` makes its own from
MASTER_ADDR / MASTER_PORT). Whichever made it, a group still initialised after the scenarios is torn down
here: a barrier (no rank leaves while another is inside a collective), then destroyed.

Used by the comm-hook, adaptive, layout, priority and comm-opt tests and by the device-path tests of the
compression kernels.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch

from workers.training.launch import free_port


def _rank(
    rank: int,
    scenarios: Callable,
    world: int,
    args: tuple,
    port: int,
    out_dir: str,
    group: bool,
    timeout_s: float,
) -> None:
    """One spawned rank: its environment and group, the scenarios, their result saved, the teardown."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    if group:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout_s),
        )
    result = scenarios(rank, world, *args)
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def spawn_ranks(scenarios: Callable, world: int, *args, group: bool = True, timeout_s: float = 90) -> list:
    """``scenarios(rank, world, *args)`` run in ``world`` processes on 127.0.0.1; what each returned, in rank
    order. ``scenarios`` must be a module-level function (it is pickled into the spawned processes), and
    its return value something ``torch.save`` can write. ``group``: a gloo group (tcp init, collectives
    time out after ``timeout_s``) made before the call; False: only MASTER_ADDR / MASTER_PORT set, for code
    that makes its own group."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="ranks-") as out_dir:
        mp.spawn(
            _rank,
            args=(scenarios, world, args, free_port(), out_dir, group, timeout_s),
            nprocs=world,
            join=True,
        )
        return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False) for r in range(world)]
