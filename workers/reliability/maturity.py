"""The Elastic Training Index (ETI) and the maturity levels, computed from what a job really used and measured.

**ETI = scaling efficiency x goodput x device utilisation**, each factor with its inputs, so a team sees
which one holds it back:

- *scaling efficiency*: measured tokens/s over ``world_size`` x the tokens/s of one device on the same model
  (a measured one-device run when one exists, else the planner's cost model for one device, said so);
- *goodput*: :mod:`workers.reliability.goodput` (productive step time over wall time);
- *device utilisation*: MFU, model FLOP/s per device over the device's peak (the peak's source named).

A factor that cannot be computed is ``None`` with the reason, and so is the index: never a made-up 1.0.

**Maturity levels** (the seed's L1-L5), each with its criteria checked against the job's own config and run:

- L1 data-parallel training runs;
- L2 + a planned strategy (launched from a planner plan);
- L3 + communication optimisation (a compression hook, hierarchical all-reduce or tuned buckets);
- L4 + elastic recovery (snapshots, automatic restarts; the in-memory tier or hot swap count as more);
- L5 + green scheduling and fault-risk prevention.

A job's level is the highest whose criteria (and all lower ones) hold; the unmet criteria say how to switch
them on. (``available: False`` marks a criterion of a capability this version lacks: none today.)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Factor:
    name: str
    value: float | None
    inputs: dict
    source: str
    missing: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def scaling_efficiency(
    tokens_per_s: float | None,
    world_size: int,
    single_device_tokens_per_s: float | None,
    single_source: str,
) -> Factor:
    inputs = {
        "tokens_per_s": tokens_per_s,
        "world_size": world_size,
        "one_device_tokens_per_s": single_device_tokens_per_s,
    }
    if not tokens_per_s or not single_device_tokens_per_s or world_size < 1:
        return Factor(
            "scaling_efficiency", None, inputs, single_source, "no measured throughput or one-device baseline"
        )
    return Factor(
        "scaling_efficiency",
        round(tokens_per_s / (world_size * single_device_tokens_per_s), 4),
        inputs,
        single_source,
    )


def utilisation(tflops_per_device: float | None, peak_tflops: float | None, peak_source: str) -> Factor:
    inputs = {"tflops_per_device": tflops_per_device, "peak_tflops": peak_tflops}
    if not tflops_per_device or not peak_tflops:
        return Factor(
            "device_utilisation", None, inputs, peak_source, "no measured TFLOP/s or no device peak"
        )
    return Factor("device_utilisation", round(tflops_per_device / peak_tflops, 5), inputs, peak_source)


def goodput_factor(goodput: dict | None) -> Factor:
    if not goodput or goodput.get("goodput") is None:
        return Factor("goodput", None, {}, "workers.reliability.goodput", "no timeline recorded for this run")
    inputs = {
        "wall_s": goodput["wall_s"],
        "productive_s": goodput["productive_s"],
        **goodput.get("badput", {}),
    }
    return Factor("goodput", goodput["goodput"], inputs, "workers.reliability.goodput (rank 0's timeline)")


def eti(factors: list[Factor]) -> dict:
    missing = [f"{f.name}: {f.missing}" for f in factors if f.value is None]
    value = None
    if not missing:
        value = 1.0
        for f in factors:
            value *= f.value
        value = round(value, 5)
    return {"eti": value, "missing": missing, "factors": [f.to_dict() for f in factors]}


@dataclass
class Criterion:
    level: int
    name: str
    met: bool
    how: str
    available: bool = True


def maturity(
    config: dict,
    *,
    from_plan: bool,
    ran: bool,
    max_restarts: int,
    recovered: int = 0,
    green_scheduled: bool = False,
) -> dict:
    """The level of a job from its runtime config (``JobConfig`` as a dict), whether it was launched from a
    planner plan, whether it ran at all (any attempt started), its restart budget, how many faults it
    recovered from and whether it ran under a carbon-aware schedule."""
    hook = config.get("comm_hook")
    snap = int(config.get("snapshot_every") or 0)
    # the risk watch's prevention acts (snapshot now, drain) under risk_policy "act", the default; it needs
    # snapshots to protect the job with (controlplane.jobs.services.watches)
    prevents = (config.get("risk_policy") or "act") == "act" and snap > 0
    crit = [
        Criterion(1, "trains data-parallel on the cluster", ran, "launch the job"),
        Criterion(
            2, "strategy chosen by the planner", from_plan, "launch from a search's plan (Plans -> Launch)"
        ),
        Criterion(
            3,
            "communication optimised (compression, hierarchical all-reduce or tuned buckets)",
            bool(hook) or config.get("bucket_cap_mb") is not None,
            "set comm_hook (e.g. topk_ef, hierarchical) or bucket_cap_mb; 'Compare communication methods' on the job page",
        ),
        Criterion(
            4, "asynchronous snapshots", snap > 0, "set snapshot_every (and snapshot_memory_every for RAM)"
        ),
        Criterion(
            4,
            "automatic recovery from a dead or hung rank",
            snap > 0 and max_restarts > 0,
            "keep max_restarts > 0 with snapshots on",
        ),
        Criterion(
            5,
            "carbon-aware (green) scheduling",
            green_scheduled,
            "submit it with carbon_aware (a deadline) or a stored green_schedule (the Green page)",
        ),
        Criterion(
            5,
            "fault-risk prediction and prevention",
            prevents,
            "keep risk_policy act (the default) with snapshots on: the risk watch snapshots and drains ahead of a fault",
        ),
    ]
    level = 0
    for lv in range(1, 6):
        if all(c.met for c in crit if c.level <= lv):
            level = lv
    extras = []
    if int(config.get("snapshot_memory_every") or 0) > 0:
        extras.append("in-memory snapshot tier")
    if recovered:
        extras.append(f"recovered from {recovered} fault(s) in this run")
    return {"level": level, "criteria": [asdict(c) for c in crit], "extras": extras}
