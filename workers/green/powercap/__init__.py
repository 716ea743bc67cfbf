"""Power-cap advice: what a lower device power limit saves in energy and costs in time (Zeus-style), measured
where the device lets us, predicted from a plan otherwise, and **never applied silently**: nothing here
changes a power limit except :meth:`NvmlPowerLimit.profile`, on explicit request, which always restores it.

**Cost metric.** You, Chung and Chowdhury, "Zeus: Understanding and Optimizing GPU Energy Consumption of DNN
Training", NSDI '23: ``cost = eta x E + (1 - eta) x MAXPOWER x T``, ``eta`` in [0, 1] the user's preference
for energy over time, MAXPOWER the device's maximum power limit, so both terms are joules (reference code:
``ml-energy/zeus`` ``zeus/utils/metric.py`` ``zeus_cost``; its ``ZeusCost`` selector takes MAXPOWER as the
highest profiled limit x the GPUs of the job and picks the limit of least cost, ``MaxSlowdownConstraint``
the lowest limit no slower than a factor of the time at the highest limit). Here E and T are per step and
per device (the job's cost is devices x this: the same ranking).

**Measured advice** (``method = "measured"``): a :class:`PowerProfile` of ``(power_limit_w, step_time_s,
avg_power_w)`` points, from :meth:`NvmlPowerLimit.profile` (NVML sets each limit, runs a workload, reads the
board's energy counter) or recorded elsewhere; :func:`advise` returns the limit of least cost (optionally
no more than ``max_slowdown`` slower per step than the baseline, the profile's default limit or else its
highest), its time cost and energy saving, and the Pareto frontier of (step time, energy per step).

**Model-based advice** (``method = "model"``, never passed off as measured): :func:`predict_powercap` turns a
plan's predicted breakdown (``workers/planner``: ``compute_s optimizer_s exposed_comm_s bubble_s
inline_comm_s step_time_s``) into the same frontier:

- the planner's energy model (``workers/planner/energy.py``): a busy device draws ``tdp_watts``, a waiting
  one ``idle_watts`` (0 unless a measured idle figure is given), busy = compute + optimizer;
- DVFS: board power at core-clock ratio ``f`` (1 = the clock at the default limit) is
  ``P(f) = tdp x (s + (1 - s) x f^3)``: the dynamic part follows the CMOS switching power ``a C V^2 f``
  (Weste & Harris, "CMOS VLSI Design", 4th ed., ch. 5) with the supply voltage scaled in proportion to the
  clock across the DVFS range, hence ``f^3``; ``V ~ f`` is an **assumption** (real V/f curves flatten at a
  voltage floor, where power falls more slowly than ``f^3``). ``s`` (:data:`STATIC_SHARE`) is the share of
  busy board power that does not follow the core clock (leakage, HBM, board): **an assumption**, 0.2, not
  verified from a primary source (one public ``nvidia-smi -q`` log of an idle A100-SXM4-80GB at P0 reads
  68 W of a 400 W limit, 17%: the part that stays when nothing runs, so a lower bound on ``s``);
- a limit ``L`` below ``tdp`` lowers the clock until ``P(f) = L``: ``f = ((L/tdp - s) / (1 - s))^(1/3)``;
  a limit at or below ``s x tdp`` cannot be met by clocks in this model and is left out (said in ``notes``);
- the clock slows the clock-bound share of compute only: ``compute_s x (c / f + 1 - c)``, ``c`` =
  ``compute_bound_share`` (default 1: every compute kernel clock-bound, the largest slowdown; memory-bound
  kernels, the optimizer step and communication run at the memory / network clock, which a power limit does
  not lower). The pipeline bubble is other stages' compute seen from the busiest stage, so it stretches
  with the bubble-free time ``compute_s + inline_comm_s`` (the cost model's ``(p-1)/(v m)`` of it);
  exposed communication does not change;
- busy power under the cap is ``min(L, tdp)``, waiting power ``min(L, idle)``.

Because the planner's busy device draws its full ``tdp_watts``, a cap binds harder in the model than on
real jobs, most of which draw less: the model overstates both the slowdown and the saving of a cap. Each
advice carries an ``anchor``: the model's figure for a fully busy device at 60% of TDP beside published
measurements at that cap (McDonald et al., "Great Power, Great Responsibility: Recommendations for
Reducing Energy for Training Language Models", Findings of NAACL 2022, arXiv:2205.09646, abstract:
power-capping "can enable a 15% decrease in energy usage with marginal increase in overall computation time
when training a transformer-based language model", V100s at 150 W of their 250 W default; coverage of the
paper reports 13.7% less energy on average over the larger runs; Zhao et al., "Sustainable Supercomputing
for AI: GPU Power Capping at HPC Scale", SoCC '23, arXiv:2402.18593: MIT Supercloud's system-wide 60% cap).
With s = 0.2 the model says about +26% time and -24% energy there: it is a bound on what a cap can do to a job that
really keeps its device at TDP, not a forecast for a typical job; measure (``--profile``) before applying.

**Limits.** The model tries limits from ``tdp_watts`` down to the device's minimum in 25 W steps (Zeus's
``GlobalPowerLimitOptimizer`` default ``pl_step``; TDP / 10 for devices under 250 W). The minimum comes
from NVML when the plan's device is here (``nvmlDeviceGetPowerManagementLimitConstraints``), else
:data:`FALLBACK_MIN_LIMIT_FRACTION` x TDP: **an assumption** (the A100-SXM4-80GB log above reads Min Power
Limit 100 W of 400 W; other boards differ).

Where there is no power control (no NVML, no cpufreq: this CPU-only machine), no measured advice exists and
:func:`power_control_status` says why.

The rooms: :mod:`~.points` (Zeus's cost, power points and profiles), :mod:`~.advice` (choosing the limit,
how to apply it), :mod:`~.control` (power control here: NVML limits, profiling, the GEMM workload),
:mod:`~.model` (the model-based advice for a plan).

Pure Python (torch imported only inside :func:`gemm_workload`, pynvml only where NVML is read, through
:mod:`workers.devices.nvml`); nothing here imports Django or Celery.
"""

from workers.green.powercap.advice import (
    NOT_APPLIED,
    PowerCapAdvice,
    advice_from_points,
    advise,
    apply_hint,
    device_kind,
    pareto_frontier,
)
from workers.green.powercap.control import (
    CPUFREQ_DIR,
    NvmlPowerLimit,
    PowerLimits,
    gemm_workload,
    nvml_min_limit,
    power_control_status,
)
from workers.green.powercap.model import (
    ANCHOR_CAP_SHARE,
    ANCHOR_PUBLISHED,
    ASSUMPTION_BUSY_TDP,
    ASSUMPTION_DVFS,
    DVFS_EXPONENT,
    FALLBACK_MIN_LIMIT_FRACTION,
    LIMIT_STEP_W,
    STATIC_SHARE,
    StepBreakdown,
    anchor,
    clock_ratio,
    model_limits,
    model_point,
    plan_powercap_block,
    predict_powercap,
    predicted_and_devices,
    step_breakdown,
)
from workers.green.powercap.points import (
    METHODS,
    ZEUS_SOURCE,
    PowerPoint,
    PowerProfile,
    check_eta,
    check_steps,
    finite_number,
    zeus_cost,
)

__all__ = [
    "ANCHOR_CAP_SHARE",
    "ANCHOR_PUBLISHED",
    "ASSUMPTION_BUSY_TDP",
    "ASSUMPTION_DVFS",
    "CPUFREQ_DIR",
    "DVFS_EXPONENT",
    "FALLBACK_MIN_LIMIT_FRACTION",
    "LIMIT_STEP_W",
    "METHODS",
    "NOT_APPLIED",
    "STATIC_SHARE",
    "ZEUS_SOURCE",
    "NvmlPowerLimit",
    "PowerCapAdvice",
    "PowerLimits",
    "PowerPoint",
    "PowerProfile",
    "StepBreakdown",
    "advice_from_points",
    "advise",
    "anchor",
    "apply_hint",
    "check_eta",
    "check_steps",
    "clock_ratio",
    "device_kind",
    "finite_number",
    "gemm_workload",
    "model_limits",
    "model_point",
    "nvml_min_limit",
    "pareto_frontier",
    "plan_powercap_block",
    "power_control_status",
    "predict_powercap",
    "predicted_and_devices",
    "step_breakdown",
    "zeus_cost",
]
