"""The live log of a node: the supervisor follows the log file while the process runs and hands new lines
on in batches, leaving out what tells a reader nothing (torchrun's banner, profiler markers, deprecation
warnings, and the traceback torchrun prints when it is stopped); real errors stay whole."""

from __future__ import annotations

import sys
import time

from workers.training.supervision.supervisor import OUTPUT_MAX_LINES, LogFilter, filtered_tail, supervise

# what a two-rank job's node log looked like before (trimmed from a real run)
NOISY_LOG = """
*****************************************
Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed.
*****************************************
/work/workers/training/parallel/data_parallel.py:106: FutureWarning: `broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead.
  ddp = DistributedDataParallel(
attempt 1: 2 rank(s) · tp1-pp1-dp2-ep1 · cpu/gloo · tiny-dense (180,800 parameters) · steps 1-100000
step 1/100000 · loss 5.5125 · 34.5 ms · 7,414 tokens/s · grad norm 7.032
USDT:2026-11-30 19:12:35 30412:30412 SyncActivityProfilerHandler.cpp:52] profiler_start
USDT:2026-11-30 19:12:35 30411:30411 SyncActivityProfilerHandler.cpp:59] profiler_stop
step 142/100000 · loss 2.8184 · 18.1 ms · 14,149 tokens/s · grad norm 0.748
W1130 19:11:36.386000 29756 torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal, shutting down workers
W1130 19:11:36.387000 29756 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 29761 closing signal SIGTERM
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py", line 923, in _invoke_run
    time.sleep(monitor_interval)
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 29756 got signal: 15
"""

REAL_ERROR = """step 3/10 · loss 5.1 · 30.0 ms · 8,000 tokens/s · grad norm 2.000
Traceback (most recent call last):
  File "/work/workers/training/run.py", line 40, in main
    summary = trainer.train()
RuntimeError: CUDA out of memory
"""


def test_the_filter_keeps_the_runs_own_lines_and_drops_the_noise():
    kept = LogFilter().feed(NOISY_LOG.splitlines())
    assert kept == [
        "attempt 1: 2 rank(s) · tp1-pp1-dp2-ep1 · cpu/gloo · tiny-dense (180,800 parameters) · steps 1-100000",
        "step 1/100000 · loss 5.5125 · 34.5 ms · 7,414 tokens/s · grad norm 7.032",
        "step 142/100000 · loss 2.8184 · 18.1 ms · 14,149 tokens/s · grad norm 0.748",
    ]


def test_a_real_traceback_is_kept_whole_even_when_it_arrives_in_pieces():
    noise = LogFilter()
    lines = REAL_ERROR.splitlines()
    kept = noise.feed(lines[:3]) + noise.feed(lines[3:])  # the file grew between two reads
    assert kept == lines


def test_the_stored_tail_leaves_the_noise_out(tmp_path):
    log = tmp_path / "node0.log"
    log.write_text(NOISY_LOG)
    tail = filtered_tail(log)
    assert "step 142/100000" in tail
    for noise in (
        "profiler_start",
        "FutureWarning",
        "OMP_NUM_THREADS",
        "Traceback",
        "SignalException",
        "death signal",
    ):
        assert noise not in tail


# prints its lines one by one with pauses, noise in between, so the follower sees them while it runs
TALKER = (
    "import sys, time\n"
    "for i in range(1, 5):\n"
    "    print(f'step {i}/4', flush=True)\n"
    "    print('USDT:2026-11-30 19:12:35 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start', flush=True)\n"
    "    time.sleep(0.4)\n"
    "print('done', end='', flush=True)\n"  # the last line has no line end
)


def test_new_lines_are_handed_on_while_the_process_runs(tmp_path):
    batches: list[tuple[float, list[str]]] = []
    started = time.monotonic()
    outcome = supervise(
        [sys.executable, "-c", TALKER],
        log_path=tmp_path / "run.log",
        on_output=lambda lines: batches.append((time.monotonic() - started, lines)),
        output_every_s=0.1,
        poll_every_s=0.02,
    )
    ended = time.monotonic() - started
    assert outcome.exit_code == 0
    lines = [line for _, lines in batches for line in lines]
    assert lines == ["step 1/4", "step 2/4", "step 3/4", "step 4/4", "done"]
    assert len(batches) >= 3  # several batches, not one at the end
    assert batches[0][0] < ended - 0.8  # the first lines came while the process still ran
    assert "profiler_start" not in outcome.log_tail and outcome.log_tail.endswith("done")


def test_a_flood_is_cut_to_the_newest_lines_with_a_line_saying_so(tmp_path):
    batches: list[list[str]] = []
    flood = f"for i in range({OUTPUT_MAX_LINES * 3}): print(f'line {{i}}')"
    supervise(
        [sys.executable, "-c", flood],
        log_path=tmp_path / "run.log",
        on_output=batches.append,
        output_every_s=5,
    )
    last = batches[-1]  # the lines came all at once, after the process ended
    assert len(last) == OUTPUT_MAX_LINES
    assert last[0].startswith("… ") and last[0].endswith(
        " lines left out here (the node's log file has them)"
    )
    assert last[1:] == [f"line {i}" for i in range(OUTPUT_MAX_LINES * 2 + 1, OUTPUT_MAX_LINES * 3)]


def test_a_failing_output_callback_does_not_stop_the_run(tmp_path):
    def broken(lines):
        raise ConnectionError("redis is down")

    outcome = supervise(
        [sys.executable, "-c", "print('fine'); raise SystemExit(0)"],
        log_path=tmp_path / "run.log",
        on_output=broken,
        output_every_s=0.05,
    )
    assert outcome.exit_code == 0 and "fine" in outcome.log_tail
