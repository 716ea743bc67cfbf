"""A node's supervisor refuses a job whose ranks would not fit in its memory, by the planner's memory
model (activations included), before it starts any rank."""

from __future__ import annotations

from workers.training.examples import example
from workers.training.fits import memory_per_rank_GiB, memory_problem

TINY = {
    "model": example("tiny-dense.json"),
    "strategy": {"dp": 2, "micro_batch_size": 2},
    "training": {"global_batch_size": 4},
    "steps": 5,
    "device": "cpu",
}


def test_a_tiny_job_fits_and_a_million_token_sequence_does_not():
    assert memory_problem(TINY, 2, device_kind="cpu", device_memory_GiB=None) == ""
    huge = {**TINY, "model": {**TINY["model"], "seq_length": 1_000_000}}
    # activations grow with s (linearly: the fused attention every framework now defaults to keeps no s x s
    # scores, issue 37), over a fixed framework overhead that is most of the tiny job's
    assert memory_per_rank_GiB(huge) > 20 * memory_per_rank_GiB(TINY)
    problem = memory_problem(huge, 2, device_kind="cpu", device_memory_GiB=None)
    assert "per rank by the planner's memory model" in problem and "this node's" in problem


def test_device_memory_is_checked_per_device():
    per_rank = memory_per_rank_GiB(TINY)
    assert memory_problem(TINY, 2, device_kind="cuda", device_memory_GiB=per_rank * 2) == ""
    assert "GiB per device" in memory_problem(TINY, 2, device_kind="cuda", device_memory_GiB=per_rank / 2)


def test_a_config_the_planner_cannot_cost_is_left_to_the_runtime():
    assert memory_problem({"model": {"name": "broken"}}, 1, device_kind="cpu", device_memory_GiB=None) == ""
