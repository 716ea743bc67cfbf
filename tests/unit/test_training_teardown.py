"""The end of a run: rank 0, which hosts the TCPStore, leaves last; a hung teardown cannot hold a job."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from workers.training.launch import free_port
from workers.training.trainer import exit_barrier

ROOT = Path(__file__).resolve().parents[2]


def test_rank_0_waits_for_every_rank_to_count_itself_out():
    port = free_port("127.0.0.1")
    host = dist.TCPStore(
        "127.0.0.1", port, 3, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False
    )
    clients = [
        dist.TCPStore("127.0.0.1", port, 3, is_master=False, timeout=timedelta(seconds=10)) for _ in (1, 2)
    ]
    done = threading.Event()
    rank0 = threading.Thread(target=lambda: (exit_barrier(host, 0, 3, timeout_s=10), done.set()))
    rank0.start()
    exit_barrier(clients[0], 1, 3)  # a non-zero rank never waits
    time.sleep(0.3)
    assert not done.is_set()  # rank 2 is still tearing down
    exit_barrier(clients[1], 2, 3)
    rank0.join(5)
    assert done.is_set()


def test_rank_0_gives_up_waiting_after_the_timeout():
    port = free_port("127.0.0.1")
    host = dist.TCPStore(
        "127.0.0.1", port, 2, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False
    )
    t0 = time.monotonic()
    exit_barrier(host, 0, 2, timeout_s=0.5)  # rank 1 died without counting itself out
    assert 0.4 < time.monotonic() - t0 < 5


def test_a_hung_teardown_is_abandoned_with_the_tracebacks_and_exit_0():
    code = (
        "import threading, time\n"
        "from workers.training import trainer\n"
        "print(time.time(), flush=True)  # imported: the clock starts here, not at the interpreter's start\n"
        "threading.Timer(0.3, trainer.abandon_teardown, args=(3,)).start()\n"
        "time.sleep(60)  # stands for a destroy_process_group that never returns\n"
    )
    # the import of torch and the runtime took 40 s once on a loaded 2-core machine (2026-12-06): the bound is
    # on the abandon, 0.3 s after the import, with 20 s of slack for the loaded machine's scheduling
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    imported = float(r.stdout.split()[0])
    assert r.returncode == 0 and time.time() - imported < 20
    assert "rank 3: process-group teardown did not finish" in r.stderr
    assert "time.sleep(60)" in r.stderr or "<string>" in r.stderr  # where the main thread hung
