"""Runtime entry point, started by ``torchrun`` on every rank::

    torchrun ... -m workers.training.run --config job.json [--summary out.json]

Reads the job config (``JobConfig`` JSON), trains, and on rank 0 writes the summary JSON where asked.
Never imports Django; talks to Redis only (when the config names a job and a Redis URL). The control plane
adds ``attempt`` (which launch of the job this run is) beside the config: it labels every event the run
publishes, and is not a training setting.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import traceback

from workers.devices import backend as device_mod

device_mod.prepare_environment()  # before torch is imported (torch-npu without CANN would break it)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.training.run")
    parser.add_argument("--config", required=True, help="JobConfig JSON")
    parser.add_argument("--summary", help="rank 0 writes the run summary JSON here")
    args = parser.parse_args(argv)

    from workers.training.config import ConfigError, JobConfig, read_json
    from workers.training.trainer import Trainer, env_rank

    doc = read_json(args.config, "config")
    attempt = doc.pop("attempt", 1) if isinstance(doc, dict) else 1
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise ConfigError("attempt", f"must be a whole number >= 1, got {attempt!r}")
    cfg = JobConfig.from_dict(doc)
    rank, world_size, local_rank = env_rank()
    trainer = Trainer(cfg, rank=rank, world_size=world_size, local_rank=local_rank, attempt=attempt)
    try:
        summary = trainer.train()
    except BaseException:
        trainer.close(succeeded=False)
        if trainer.snapshots is not None and trainer.snapshots.in_flight:
            # the snapshot writer thread may wait on peers that wait on us: exit now instead of joining it
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        raise
    if rank == 0 and args.summary:  # before the teardown: the results are out whatever happens there
        with open(args.summary, "w") as f:
            json.dump(summary, f)
    group = trainer.default_group
    trainer.close()
    # The DDP module's Reducer holds the default group after destroy_process_group; freed last by it, the gloo
    # backend's destructor joins its worker threads with the GIL held (or, at the interpreter's finalization,
    # a worker releasing a tensor there is made to exit: "terminate called without an active exception", a
    # rank of a finished Slurm job, CI 2026-12-06; pytorch#56297). So the trainer goes first, while this
    # frame holds the group, and the group's last reference is dropped here, through ProcessGroup's binding,
    # which releases the GIL (pytorch#154976; the SDK's Run does the same, cann_train.run)
    del trainer
    gc.collect()
    del group
    return 0


if __name__ == "__main__":
    sys.exit(main())
