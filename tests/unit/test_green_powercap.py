"""Power-cap advice (workers/green/powercap/): Zeus's energy-time cost and the limit it picks from measured
profiles (against brute force written here), the plan-based model (its DVFS relation, monotone, labelled a
model everywhere), `cann-train green powercap` on a plan the planner costs, its refusal to profile where
this machine has no CUDA / NVML, and NVML itself where an NVIDIA GPU is present."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.cli import main
from workers.green.power import SourceUnavailable
from workers.green.powercap import (
    ANCHOR_CAP_SHARE,
    FALLBACK_MIN_LIMIT_FRACTION,
    STATIC_SHARE,
    NvmlPowerLimit,
    PowerPoint,
    PowerProfile,
    advise,
    anchor,
    clock_ratio,
    model_limits,
    plan_powercap_block,
    power_control_status,
    predict_powercap,
    step_breakdown,
    zeus_cost,
)
from workers.planner.examples import CONTRACTS

ROOT = Path(__file__).resolve().parents[2]
REL = 1e-9


def nvml_gpu_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


def cuda_present() -> bool:
    import torch

    return torch.cuda.is_available()


# ------------------------------------------------------------------------------------ Zeus cost metric


def test_zeus_cost_weighs_energy_against_time_at_max_power():
    # You et al. NSDI '23: eta x E + (1 - eta) x MAXPOWER x T
    assert zeus_cost(1000.0, 2.0, 1.0, 300.0) == 1000.0
    assert zeus_cost(1000.0, 2.0, 0.0, 300.0) == 600.0
    assert zeus_cost(1000.0, 2.0, 0.25, 300.0) == pytest.approx(0.25 * 1000 + 0.75 * 300 * 2)


# ----------------------------------------------------------------------------- measured profiles, brute force


def brute_best(points, eta, max_power, baseline_time, max_slowdown):
    """The least cost over the allowed points, computed apart from the engine."""
    allowed = [
        p
        for p in points
        if max_slowdown is None or p.step_time_s / baseline_time - 1.0 <= max_slowdown + 1e-12
    ]
    costs = [eta * p.avg_power_w * p.step_time_s + (1 - eta) * max_power * p.step_time_s for p in allowed]
    return min(costs), allowed


def dominated(p, by):
    return any(
        q.step_time_s <= p.step_time_s
        and q.energy_per_step_j <= p.energy_per_step_j
        and (q.step_time_s < p.step_time_s or q.energy_per_step_j < p.energy_per_step_j)
        for q in by
        if q is not p
    )


A100_LIKE = PowerProfile.from_tuples(
    # (limit W, s/step, average W): a compute-bound loop that slows and draws less as the cap tightens
    [
        (400, 1.00, 390),
        (350, 1.04, 345),
        (300, 1.12, 298),
        (250, 1.27, 249),
        (200, 1.55, 199),
        (150, 2.10, 149),
    ],
    device="A100-SXM4-80GB",
    source="hand-built",
    default_limit_w=400,
    max_limit_w=400,
)


def test_eta_0_picks_the_fastest_and_eta_1_the_least_energy():
    fastest = advise(A100_LIKE, eta=0.0)
    assert fastest.recommended.limit_w == 400
    least = advise(A100_LIKE, eta=1.0)
    energies = {p.limit_w: p.avg_power_w * p.step_time_s for p in A100_LIKE.points}
    assert least.recommended.limit_w == min(energies, key=energies.get)
    assert least.energy_saving_pct == pytest.approx(100 * (1 - energies[least.recommended.limit_w] / 390.0))


def test_max_slowdown_caps_the_time_cost_of_the_choice():
    free = advise(A100_LIKE, eta=1.0)
    assert free.slowdown_pct > 10
    capped = advise(A100_LIKE, eta=1.0, max_slowdown=0.10)
    assert capped.slowdown_pct <= 10 + 1e-9
    # least energy among the limits at most 10% slower: 1.04 and 1.00 s qualify, 1.12 does not
    assert capped.recommended.limit_w == 350


def test_per_job_figures_scale_the_step_by_the_steps():
    a = advise(A100_LIKE, eta=0.5, steps=10_000)
    job = a.to_dict()["job"]
    assert job["extra_time_s"] == pytest.approx(10_000 * (a.recommended.step_time_s - 1.0))
    assert job["energy_saved_kwh"] == pytest.approx(
        10_000 * (390.0 - a.recommended.energy_per_step_j) / 3.6e6
    )
    assert job["slowdown_pct"] == pytest.approx(a.slowdown_pct)


def test_the_baseline_is_the_default_limit_when_it_was_profiled():
    p = PowerProfile.from_tuples([(450, 0.98, 430), (400, 1.0, 390), (300, 1.1, 295)], default_limit_w=400)
    a = advise(p, eta=0.0)
    assert a.baseline.limit_w == 400 and a.max_power_w == 450  # MAXPOWER: the highest limit, as Zeus
    assert a.recommended.limit_w == 450 and a.slowdown_pct < 0


profile_rows = st.lists(
    st.tuples(
        st.integers(min_value=50, max_value=700),
        st.floats(min_value=0.01, max_value=10.0, allow_nan=False),
        st.floats(min_value=1.0, max_value=700.0, allow_nan=False),
    ),
    min_size=1,
    max_size=12,
    unique_by=lambda r: r[0],
)


@settings(max_examples=150, deadline=None)
@given(
    rows=profile_rows,
    eta=st.floats(min_value=0.0, max_value=1.0),
    max_slowdown=st.none() | st.floats(min_value=0.0, max_value=1.0),
)
def test_the_choice_is_the_brute_force_least_cost_on_the_pareto_frontier(rows, eta, max_slowdown):
    profile = PowerProfile.from_tuples(rows)
    a = advise(profile, eta=eta, max_slowdown=max_slowdown)
    baseline = max(profile.points, key=lambda p: p.limit_w)
    max_power = max(r[0] for r in rows)
    best, allowed = brute_best(profile.points, eta, max_power, baseline.step_time_s, max_slowdown)
    assert a.baseline is baseline and a.max_power_w == max_power
    assert a.recommended in allowed
    assert a.cost(a.recommended) == pytest.approx(best, rel=REL, abs=1e-9)
    if max_slowdown is not None:
        assert a.recommended.step_time_s <= baseline.step_time_s * (1 + max_slowdown) * (1 + 1e-12)
    # the frontier is Pareto: nothing on it is dominated, everything off it is dominated by it
    front = a.frontier
    assert front and not any(dominated(p, profile.points) for p in front)
    assert all(dominated(p, front) for p in profile.points if p not in front)
    assert [p.step_time_s for p in front] == sorted(p.step_time_s for p in front)
    # the least-cost choice is not dominated within the allowed set (ties go to the faster, cheaper point)
    assert not dominated(a.recommended, allowed)
    d = a.to_dict()
    assert d["method"] == "measured" and d["applied"] is False
    assert {p["method"] for p in d["points"] + d["frontier"]} == {"measured"}


@pytest.mark.parametrize(
    "rows, message",
    [
        ([], "at least one"),
        ([(300, 1.0, 200), (300, 1.1, 190)], "repeated limits"),
        ([(300, 0.0, 200)], "step_time_s"),
        ([(300, 1.0, float("nan"))], "avg_power_w"),
        ([(300, 1.0)], "expected (power_limit_w"),
    ],
)
def test_a_bad_profile_is_refused_with_the_reason(rows, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        PowerProfile.from_tuples(rows)


@pytest.mark.parametrize("eta", [-0.1, 1.5, float("nan"), True])
def test_eta_outside_0_1_is_refused(eta):
    with pytest.raises(ValueError, match="eta"):
        advise(A100_LIKE, eta=eta)


# ------------------------------------------------------------------------------------------- the model


def compute_only(step=1.0):
    """A step that is all compute (no optimizer, no waiting): the most clock-bound plan there is."""
    return {
        "step_time_s": step,
        "compute_s": step,
        "optimizer_s": 0.0,
        "exposed_comm_s": 0.0,
        "bubble_s": 0.0,
    }


def with_comm(compute, exposed, bubble=0.0, inline=0.0, optimizer=0.0):
    step = compute + optimizer + exposed + bubble
    return {
        "step_time_s": step,
        "compute_s": compute,
        "optimizer_s": optimizer,
        "exposed_comm_s": exposed,
        "inline_comm_s": inline,
        "bubble_s": bubble,
    }


def expected_point(pred, limit, tdp, idle=0.0, s=STATIC_SHARE, c=1.0):
    """The model written out from the module docstring, apart from the engine."""
    share = limit / tdp
    f = 1.0 if share >= 1 else ((share - s) / (1 - s)) ** (1 / 3)
    compute = pred["compute_s"] * (c / f + 1 - c)
    inline = pred.get("inline_comm_s", 0.0)
    bubble = pred["bubble_s"] * (compute + inline) / (pred["compute_s"] + inline)
    busy = compute + pred["optimizer_s"]
    wait = bubble + (pred["step_time_s"] - pred["compute_s"] - pred["optimizer_s"] - pred["bubble_s"])
    return f, busy + wait, min(limit, tdp) * busy + min(limit, idle) * wait


@pytest.mark.parametrize("idle", [0.0, 60.0])
def test_the_model_follows_its_dvfs_relation_and_never_gets_faster_under_a_lower_cap(idle):
    pred = with_comm(compute=5.9, exposed=0.85, bubble=0.18, inline=0.3, optimizer=0.01)
    a = predict_powercap(
        pred,
        devices=8,
        tdp_watts=400,
        idle_watts=idle or None,
        idle_source="a test figure" if idle else None,
        min_limit_w=100,
    )
    pts = a.points  # highest limit first
    assert [p.limit_w for p in pts] == sorted((p.limit_w for p in pts), reverse=True)
    for p in pts:
        f, step, energy = expected_point(pred, p.limit_w, 400, idle)
        assert p.clock_ratio == pytest.approx(f, rel=REL)
        assert p.step_time_s == pytest.approx(step, rel=REL)
        assert p.energy_per_step_j == pytest.approx(energy, rel=REL)
        assert p.method == "model"
    times = [p.step_time_s for p in pts]
    assert all(b >= a_ for a_, b in zip(times, times[1:], strict=False))
    # power at the cap is the limit itself: P(f) = tdp (s + (1 - s) f^3)
    for p in pts:
        assert 400 * (STATIC_SHARE + (1 - STATIC_SHARE) * p.clock_ratio**3) == pytest.approx(p.limit_w)


def test_energy_per_step_falls_to_the_models_optimum_then_rises():
    # E(f) ~ P(f) / f = tdp (s / f + (1 - s) f^2) on an all-compute step with no idle power: least at
    # f^3 = s / (2 (1 - s)), i.e. at a cap of tdp (s + s / 2) = 1.5 s tdp
    tdp, s = 1000.0, STATIC_SHARE
    optimum = 1.5 * s * tdp
    limits = range(220, 1001, 20)
    a = predict_powercap(compute_only(), devices=1, tdp_watts=tdp, limits=limits, eta=1.0)
    above = [p.energy_per_step_j for p in a.points if p.limit_w >= optimum]
    below = [p.energy_per_step_j for p in a.points if p.limit_w <= optimum]
    assert above == sorted(above, reverse=True) and below == sorted(below)
    assert a.recommended.limit_w == pytest.approx(optimum)  # eta = 1: the least energy
    assert a.recommended.clock_ratio**3 == pytest.approx(s / (2 * (1 - s)), rel=1e-9)


def test_communication_bound_plans_lose_less_time_under_the_same_cap():
    compute_bound = with_comm(compute=9.0, exposed=1.0)
    comm_bound = with_comm(compute=4.0, exposed=6.0)
    kwargs = dict(devices=8, tdp_watts=700, min_limit_w=200)
    cb = {p.limit_w: p for p in predict_powercap(compute_bound, **kwargs).points}
    mb = {p.limit_w: p for p in predict_powercap(comm_bound, **kwargs).points}
    for limit in cb:
        if limit < 700:
            slow_cb = cb[limit].step_time_s / compute_bound["step_time_s"] - 1
            slow_mb = mb[limit].step_time_s / comm_bound["step_time_s"] - 1
            assert 0 < slow_mb < slow_cb


def test_a_cap_slows_the_pipeline_bubble_with_compute_but_not_exposed_communication():
    pred = with_comm(compute=4.0, exposed=1.0, bubble=1.0)
    p = predict_powercap(pred, devices=4, tdp_watts=400, limits=[300]).points[-1]
    stretch = 1 / p.clock_ratio
    assert p.step_time_s == pytest.approx(4.0 * stretch + 1.0 * stretch + 1.0, rel=REL)


def test_compute_bound_share_below_1_slows_less():
    pred = compute_only()
    full = predict_powercap(pred, devices=1, tdp_watts=400, limits=[250]).points[-1]
    half = predict_powercap(pred, devices=1, tdp_watts=400, limits=[250], compute_bound_share=0.5).points[-1]
    assert half.step_time_s == pytest.approx(0.5 / full.clock_ratio + 0.5, rel=REL)
    assert 1.0 < half.step_time_s < full.step_time_s


def test_a_limit_at_or_below_the_static_power_is_left_out_and_said_so():
    a = predict_powercap(compute_only(), devices=1, tdp_watts=400, limits=[300, 80, 60])
    assert [p.limit_w for p in a.points] == [400, 300]
    assert any("80, 60 W" in n for n in a.notes)
    assert clock_ratio(80, 400) is None and clock_ratio(500, 400) == 1.0


def test_the_limit_grid_steps_25_w_from_the_tdp_to_the_minimum():
    assert model_limits(400, 100) == [400 - 25 * k for k in range(13)]
    assert model_limits(400, 110)[-2:] == [125, 110]
    small = model_limits(65, 16.25)  # under 250 W: TDP / 10 steps
    assert small[1] == pytest.approx(58.5) and small[-1] == 16.25


def test_the_anchor_puts_the_model_beside_published_measurements_at_a_60_percent_cap():
    a = anchor()
    f = ((ANCHOR_CAP_SHARE - STATIC_SHARE) / (1 - STATIC_SHARE)) ** (1 / 3)
    assert a["model_slowdown_pct"] == pytest.approx(100 * (1 / f - 1))
    assert a["model_energy_saving_pct"] == pytest.approx(100 * (1 - ANCHOR_CAP_SHARE / f))
    assert "arXiv:2205.09646" in a["published"] and "arXiv:2402.18593" in a["published"]


def test_a_bare_contract_plan_is_modelled_from_bubble_fraction_and_exposed_comm():
    plan = json.loads((CONTRACTS / "plan.json").read_text())
    bd = step_breakdown(plan["predicted"])
    p = plan["predicted"]
    assert bd.compute_s == pytest.approx(p["step_time_s"] * (1 - p["bubble_fraction"]) - p["exposed_comm_s"])
    assert "no breakdown" in bd.basis
    with pytest.raises(ValueError, match="re-cost the plan"):
        step_breakdown({"step_time_s": 1.0})


@pytest.fixture(scope="module")
def searched_plan(tmp_path_factory):
    """`cann-train strategy --json` on the shipped contract documents: the planner's own best plan."""
    out = io.StringIO()
    argv = ["strategy", "--json", "--top", "1"]
    for flag, name in (
        ("--model", "model.json"),
        ("--cluster", "cluster.json"),
        ("--training", "training.json"),
    ):
        argv += [flag, str(CONTRACTS / name)]
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    path = tmp_path_factory.mktemp("plan") / "search.json"
    path.write_text(out.getvalue())
    return path, json.loads(out.getvalue())


def test_the_models_baseline_is_the_planners_predicted_energy(searched_plan):
    _, result = searched_plan
    best = result["best"]
    energy = best["predicted"]["energy"]
    a = predict_powercap(best, tdp_watts=energy["inputs"]["tdp_watts"], min_limit_w=100)
    assert a.devices == energy["devices"]
    assert a.baseline.limit_w == energy["inputs"]["tdp_watts"]
    assert a.baseline.step_time_s == pytest.approx(best["predicted"]["step_time_s"])
    assert a.devices * a.baseline.energy_per_step_j / 3.6e6 == pytest.approx(energy["kwh_per_step"], rel=1e-6)


def test_every_model_figure_is_labelled_a_model_and_nothing_is_applied(searched_plan):
    _, result = searched_plan
    d = predict_powercap(result["best"], tdp_watts=400, device_name="A100-SXM4-80GB", steps=100).to_dict()
    assert d["method"] == "model" and d["label"].startswith("model:") and d["applied"] is False
    assert {p["method"] for p in d["points"] + d["frontier"] + [d["baseline"], d["recommended"]]} == {"model"}
    assert d["how_to_apply"].startswith("not applied") and "nvidia-smi" in d["how_to_apply"]
    assert any("assumption" in x for x in d["assumptions"])


@pytest.mark.skipif(nvml_gpu_present(), reason="an NVIDIA GPU is here: NVML may give the minimum limit")
def test_without_nvml_the_minimum_limit_is_the_labelled_fallback_fraction_of_tdp():
    a = predict_powercap(compute_only(), devices=1, tdp_watts=700, device_name="H100-SXM5-80GB")
    assert min(p.limit_w for p in a.points) == FALLBACK_MIN_LIMIT_FRACTION * 700
    assert any("minimum power limit" in x and "assumption" in x for x in a.assumptions)
    assert any("NVML" in s for s in a.sources)


def test_the_plan_block_for_the_pages_is_the_model_without_dominated_points(searched_plan):
    from workers.planner.energy import device_power_profile
    from workers.planner.specs import ClusterSpec

    _, result = searched_plan
    best = result["best"]
    cluster = ClusterSpec.from_dict(json.loads((CONTRACTS / "cluster.json").read_text()))
    block = plan_powercap_block(best["predicted"], 3072, device_power_profile(cluster), cluster.device.name)
    assert block["method"] == "model" and "points" not in block and block["frontier"]
    assert "NVML" not in json.dumps(block["sources"]) or "not read" in json.dumps(block["sources"])
    assert plan_powercap_block(best["predicted"], 8, None, "mystery")["unavailable"].startswith(
        "no tdp_watts"
    )
    assert "unavailable" in plan_powercap_block({"step_time_s": 1.0}, 8, {"tdp_watts": 400})


# -------------------------------------------------------------------------------------------------- CLI


def run_cli(argv, capsys):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_advises_on_the_best_plan_of_a_search_as_json(searched_plan, capsys):
    path, result = searched_plan
    rc, out, err = run_cli(["green", "powercap", "--plan", str(path), "--json", "--steps", "1000"], capsys)
    assert rc == 0, err
    d = json.loads(out)
    assert d["method"] == "model" and d["applied"] is False and d["eta"] == 0.5
    assert d["baseline"]["step_time_s"] == pytest.approx(result["best"]["predicted"]["step_time_s"])
    assert d["job"]["steps"] == 1000 and d["job"]["extra_time_s"] >= 0
    assert d["recommended"]["limit_w"] <= d["baseline"]["limit_w"]
    assert "measured" in d and d["measured"]["available"] == power_control_status()["available"]


def test_cli_text_names_the_model_the_time_cost_and_how_to_apply_it(searched_plan, capsys):
    path, _ = searched_plan
    rc, out, err = run_cli(
        ["green", "powercap", "--plan", str(path), "--eta", "1", "--max-slowdown-pct", "5"], capsys
    )
    assert rc == 0, err
    assert "model: predicted from the plan, not measured" in out
    assert "at most 5% slower" in out and "per step" in out and "Pareto frontier" in out
    assert "not applied" in out and "assumptions:" in out
    slower = float(out.split("recommended")[1].split("(")[1].split("%")[0])
    assert 0 <= slower <= 5


def test_cli_reads_a_bare_plan_json_with_its_cluster(capsys):
    plan, cluster = str(CONTRACTS / "plan.json"), str(CONTRACTS / "cluster.json")
    rc, out, err = run_cli(["green", "powercap", "--plan", plan, "--cluster", cluster, "--json"], capsys)
    assert rc == 0, err
    d = json.loads(out)
    assert d["device"] == "A100-SXM4-80GB" and d["baseline"]["limit_w"] == 400 and d["devices"] == 1024
    rc, _, err = run_cli(["green", "powercap", "--plan", plan], capsys)
    assert rc == 2 and "--cluster C.json" in err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--eta", "1.5"], "--eta must be in [0, 1]"),
        (["--eta", "nan"], "--eta must be in [0, 1]"),
        (["--max-slowdown-pct", "-1"], "--max-slowdown-pct"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--tdp-watts", "0"], "--tdp-watts"),
        (["--limits", "300,200"], "go with --profile"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(searched_plan, capsys, extra, message):
    path, _ = searched_plan
    rc, out, err = run_cli(["green", "powercap", "--plan", str(path), *extra], capsys)
    assert rc == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "cannot read"),
        ("{not json", "is not JSON"),
        ('{"strategy": {}}', "is not a plan"),
        ('{"best": null, "top": [], "pareto": []}', "no feasible plan"),
        ('{"feasible": false, "reason": "out of memory", "predicted": {}}', "infeasible (out of memory)"),
    ],
)
def test_cli_bad_plan_files_exit_2_with_the_reason(tmp_path, capsys, content, message):
    path = tmp_path / "p.json"
    if content is not None:
        path.write_text(content)
    rc, _, err = run_cli(["green", "powercap", "--plan", str(path)], capsys)
    assert rc == 2 and message in err and "Traceback" not in err


@pytest.mark.skipif(cuda_present() and nvml_gpu_present(), reason="CUDA and NVML are here: it would profile")
def test_cli_profile_refuses_here_with_every_reason_and_exit_2(capsys):
    rc, out, err = run_cli(
        ["green", "powercap", "--profile", "--limits", "300,250", "--seconds", "1"], capsys
    )
    assert rc == 2 and out == ""
    assert "cannot profile here" in err and "No power limit was changed" in err
    if not cuda_present():
        assert "no CUDA device" in err
    if not nvml_gpu_present():
        assert "NVML" in err and "cpufreq" in err


def test_cli_profile_flags_do_not_mix_with_plan_flags(capsys):
    rc, _, err = run_cli(["green", "powercap", "--profile", "--tdp-watts", "400"], capsys)
    assert rc == 2 and "go with --plan" in err


def test_the_installed_cann_train_entry_point_prints_the_advice(searched_plan):
    path, _ = searched_plan
    exe = Path(sys.executable).parent / "cann-train"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "workers.cli"]
    done = subprocess.run(
        [*cmd, "green", "powercap", "--plan", str(path), "--steps", "500"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "power-cap advice for A100-SXM4-80GB" in done.stdout and "over 500 steps" in done.stdout


# ------------------------------------------------------------------------------------------------- NVML


@pytest.mark.skipif(nvml_gpu_present(), reason="an NVIDIA GPU is here")
def test_without_an_nvidia_gpu_there_is_no_power_control_and_it_says_why():
    status = power_control_status()
    assert status["available"] is False and "NVML" in status["why"] and "cpufreq" in status["why"]
    with pytest.raises(SourceUnavailable, match="NVML|nvidia-ml-py"):
        NvmlPowerLimit(0)


def test_cpufreq_is_reported_as_present_but_not_a_source_of_measured_advice(tmp_path):
    status = power_control_status(cpufreq_dir=tmp_path)
    assert status["cpufreq"]["available"] is True and "no CPU profiler" in status["cpufreq"]["why"]
    assert status["available"] == bool(status["nvml"].get("available"))


@pytest.mark.skipif(not nvml_gpu_present(), reason="no NVIDIA GPU with a driver here: NVML cannot be read")
def test_nvml_reads_the_limits_and_profile_restores_the_limit_it_found():
    with NvmlPowerLimit(0) as gpu:
        lim = gpu.limits()
        assert 0 < lim.min_w <= lim.default_w <= lim.max_w and lim.min_w <= lim.current_w <= lim.max_w
        with pytest.raises(ValueError, match="outside"):
            gpu.profile(lambda: 1, [lim.max_w + 1000])
        assert gpu.limits().current_w == lim.current_w
        if os.geteuid() != 0:
            with pytest.raises(SourceUnavailable, match="root"):
                gpu.profile(lambda: 1, [lim.current_w])
            assert gpu.limits().current_w == lim.current_w
            return
        if not cuda_present():
            pytest.skip("NVML is here but torch sees no CUDA device")
        from workers.green.powercap import gemm_workload

        run = gemm_workload(0.5, size=2048)
        low = max(lim.min_w, math.floor(lim.current_w * 0.8))
        profile = gpu.profile(run, [lim.current_w, low], warmup=lambda: run(0.2))
        assert gpu.limits().current_w == lim.current_w
        assert [p.limit_w for p in profile.points] == [lim.current_w, low]
        assert all(p.avg_power_w > 0 and p.step_time_s > 0 for p in profile.points)
        assert all(isinstance(p, PowerPoint) and p.method == "measured" for p in profile.points)
        assert advise(profile, eta=0.5).method == "measured"
