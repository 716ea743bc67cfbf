"""What "Compare communication methods" recommends and how it estimates the time left
(``workers.training.comm.compare.recommend`` / ``Eta``): the fastest step time among the methods whose loss
stays within the tolerance of dense's, with the rule and the exclusions said; the ETA from measured step
times and the measured start-up overhead."""

from __future__ import annotations

import pytest

from workers.training.comm.compare import LOSS_TOLERANCE, Eta, recommend


def row(step_s: float, loss: float, nbytes: int = 1_000_000) -> dict:
    return {"step_time_s": step_s, "loss_avg_last10": loss, "bytes_per_rank_per_step": nbytes}


def test_the_fastest_method_within_two_percent_of_dense_loss_is_recommended():
    rows = {
        "dense": row(1.40, 3.900, 80_000_000),
        "fp16": row(0.87, 3.901, 40_000_000),
        "topk_ef": row(0.57, 4.058, 1_200_000),  # fastest, but +4.0 % loss
        "powersgd": row(0.84, 3.838, 280_000),  # lower loss than dense counts as within tolerance
    }
    rec = recommend(rows)
    assert LOSS_TOLERANCE == 0.02 and rec["loss_tolerance"] == 0.02
    assert rec["method"] == "powersgd"
    assert "topk_ef" in rec["excluded"] and "+4.1%" in rec["excluded"]["topk_ef"]
    assert rec["speedup_vs_dense"] == pytest.approx(1.40 / 0.84, abs=1e-3)
    assert "within 2% of dense's loss" in rec["reason"] and "1.67× dense" in rec["reason"]
    # a looser tolerance lets top-k in, and it is the fastest
    assert recommend(rows, loss_tolerance=0.05)["method"] == "topk_ef"


def test_dense_is_recommended_when_no_method_within_tolerance_is_faster():
    rows = {"dense": row(0.50, 3.0), "sign_ef": row(0.55, 3.01), "topk_ef": row(0.30, 3.3)}
    rec = recommend(rows)
    assert rec["method"] == "dense" and "does not pay" in rec["reason"]
    assert set(rec["excluded"]) == {"topk_ef"}


def test_without_dense_nothing_is_recommended():
    rec = recommend({"fp16": row(0.5, 3.0)})
    assert rec["method"] is None and "include dense" in rec["reason"]


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_eta_comes_from_measured_step_times_and_startup_overhead():
    clock = Clock()
    eta = Eta(["dense", "fp16", "topk_ef"], steps=10, clock=clock)
    eta.start("dense")
    assert eta.state()["eta_s"] is None and eta.state()["step"] == 0  # nothing measured yet
    clock.t = 9.0  # 8 s to start torchrun, rendezvous, build; the first step took 1 s
    eta.step({"step": 1, "step_time_s": 1.0})
    for k in range(2, 5):
        clock.t += 0.5
        eta.step({"step": k, "step_time_s": 0.5})
    s = eta.state()
    assert (s["method"], s["index"], s["step"], s["steps"]) == ("dense", 0, 4, 10)
    assert s["fraction"] == pytest.approx(4 / 30, abs=1e-4)
    # 6 steps left here at 0.5 s, then 2 methods x (8 s start-up + 10 steps x 0.5 s)
    assert s["eta_s"] == pytest.approx(6 * 0.5 + 2 * (8.0 + 10 * 0.5))
    for k in range(5, 11):
        clock.t += 0.5
        eta.step({"step": k, "step_time_s": 0.5})
    clock.t += 2.0  # teardown
    eta.finish()
    eta.start("fp16")
    # measured overhead of a method run: wall time minus its steps (start-up and teardown)
    assert eta.overheads == [pytest.approx(8.0 + 2.0)]
    assert eta.state()["eta_s"] == pytest.approx(10.0 + 10 * 0.5 + 1 * (10.0 + 10 * 0.5))
