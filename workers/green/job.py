"""A training job's live energy and carbon: what the trainer calls (pure engine, no Django).

Every rank builds a :class:`JobEnergy` and calls :meth:`JobEnergy.start` before its first step,
:meth:`JobEnergy.sample` after every step and :meth:`JobEnergy.finish` after its last: on every
``every``-th step (the step counter decides, never a clock, so all ranks meet) they all-reduce their
cumulative joules. Only local rank 0 of each node reads a meter (one per node: NVML or npu-smi for the
node's devices, RAPL for its packages, else the labelled estimate over the agent's whole process tree, so
every local rank is counted once); the other ranks add zeros. Rank 0 feeds the sums to an
:class:`~workers.green.energy.EnergyAccount` and returns the values of an ``energy`` event.

The job's settings (``JobConfig.energy``) say where it runs::

    {"zone": "GB", "pue": 1.1, "pue_source": "...", "tdp_watts": 400, "device_name": "A100-SXM4-80GB",
     "market_factor_g_per_kwh": 0, "market_factor_source": "...", "price_per_kwh": 0.25,
     "currency": "GBP", "price_source": "...", "every": 5}

All optional. No zone: energy only, and every event says carbon is absent because no grid zone is set. The
intensity comes from :func:`workers.green.providers.resolve_series` (a configured live provider, else the
shipped history as a labelled stand-in, else CodeCarbon's annual country average).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any

from workers.green.energy import EnergyAccount, Tariff, embodied_for
from workers.green.power import COMPONENTS, PowerReading, select_meter

DEFAULT_EVERY = 5
"""Steps between two energy samples: ``system_metrics.RANK_METRICS_EVERY``'s rhythm (one all-reduce of
three floats)."""
INTENSITY_HORIZON = timedelta(days=7)
"""How far ahead of the start the intensity series is resolved; energy drawn later is counted without
carbon and the event says how much (``kwh_without_intensity``)."""
SETTINGS = (
    "zone",
    "pue",
    "pue_source",
    "tdp_watts",
    "device_name",
    "market_factor_g_per_kwh",
    "market_factor_source",
    "price_per_kwh",
    "currency",
    "price_source",
    "every",
    "enabled",
)


ZONE_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
"""A grid zone's code (Electricity Maps' ``US-CAL-CISO``, WattTime's ``CAISO_NORTH``, a country's ``GB``): the
green schedules' rule (``controlplane.green.apis.ZONE``) for a job's ``energy.zone`` too."""


def check_energy_settings(settings: Mapping[str, Any] | None) -> list[str]:
    """What is wrong with a job's ``energy`` settings, one message per problem a person can fix."""
    if settings is None:
        return []
    if not isinstance(settings, Mapping):
        return [
            f"energy must be an object of settings ({', '.join(SETTINGS)}), got {type(settings).__name__}"
        ]
    errors = [
        f"energy.{k} is not a setting (known: {', '.join(SETTINGS)})" for k in settings if k not in SETTINGS
    ]

    def number(key: str, low: float, *, strict: bool = False) -> None:
        v = settings.get(key)
        if v is None:
            return
        if (
            isinstance(v, bool)
            or not isinstance(v, int | float)
            or not math.isfinite(v)
            or v < low
            or (strict and v == low)
        ):
            errors.append(f"energy.{key} must be a number {'>' if strict else '>='} {low:g}, got {v!r}")

    number("pue", 1.0)
    number("tdp_watts", 0.0, strict=True)
    number("market_factor_g_per_kwh", 0.0)
    number("price_per_kwh", 0.0)
    every = settings.get("every")
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        errors.append(f"energy.every must be an integer >= 1 (steps between two samples), got {every!r}")
    for key in ("zone", "pue_source", "device_name", "market_factor_source", "currency", "price_source"):
        v = settings.get(key)
        if v is not None and (not isinstance(v, str) or not v.strip() or len(v) > 300):
            errors.append(f"energy.{key} must be a non-empty text of at most 300 characters, got {v!r:.60}")
    zone = settings.get("zone")
    if isinstance(zone, str) and zone.strip() and len(zone) <= 300 and not ZONE_PATTERN.match(zone.strip()):
        errors.append(
            "energy.zone must be a grid zone code such as GB, DE, FR or US-CAL-CISO (letters, digits, '-' and '_', "
            f"starting with a letter), got {zone!r:.60}"
        )
    if settings.get("market_factor_g_per_kwh") is not None and not settings.get("market_factor_source"):
        errors.append(
            "energy.market_factor_source is required with a market-based factor (the contract or certificates)"
        )
    if settings.get("pue") is not None and not settings.get("pue_source"):
        errors.append("energy.pue_source is required with a PUE (a measurement, the operator's report)")
    if settings.get("price_per_kwh") is not None and not settings.get("currency"):
        errors.append("energy.currency is required with a price per kWh (e.g. EUR)")
    enabled = settings.get("enabled")
    if enabled is not None and not isinstance(enabled, bool):
        errors.append(f"energy.enabled must be true or false, got {enabled!r}")
    return errors


class JobEnergy:
    """One rank's part of a job's energy accounting (module docstring). ``sample``/``finish`` are collectives."""

    def __init__(
        self,
        settings: Mapping[str, Any] | None,
        *,
        device_kind: str,
        device_indices: list[int],
        rank: int,
        world_size: int,
        local_rank: int,
        under_torchrun: bool,
        env: Mapping[str, str] | None = None,
        collective_wait: Callable[[], AbstractContextManager] = nullcontext,
    ):
        """``collective_wait``: a context manager around this account's all-reduce that times it as a
        collective wait (the trainer passes the straggler watch's ``blocking_wait.timed``; the green engine
        sits below the runtime and does not import it)."""
        errors = check_energy_settings(settings)
        if errors:
            raise ValueError("; ".join(errors))
        s = dict(settings or {})
        self.settings = s
        self.every = int(s.get("every") or DEFAULT_EVERY)
        self.rank, self.world_size = rank, world_size
        self._collective_wait = collective_wait
        self.meter = None
        if local_rank == 0:
            self.meter = select_meter(
                device_kind,
                device_indices if device_kind != "cpu" else [],
                tdp_watts=s.get("tdp_watts"),
                # under torchrun the agent's process tree holds every local rank: count them all, once
                root_pid=os.getppid() if under_torchrun else None,
            )
        self.account: EnergyAccount | None = None
        self.carbon_note: str | None = None
        self.started = False
        # which segment of the job this account meters: the torchrun restart within the attempt (each one
        # meters from its own start) and the step before its first (a resumed one began at its snapshot's):
        # a report adds the segments up and finds the steps trained twice (``workers.green.certificate``)
        self.restart = 0
        self.from_step: int | None = None
        self._tokens = 0
        self._env = dict(os.environ if env is None else env)
        self._device_name = s.get("device_name") or ("cpu" if device_kind == "cpu" else None)
        self._device_count = world_size if device_kind != "cpu" else 1

    # ------------------------------------------------------------------------------------------ collectives

    def _reduced(self, device) -> PowerReading:
        import torch
        import torch.distributed as dist

        mine = [0.0] * len(COMPONENTS)
        if self.meter is not None:
            joules = self.meter.read().joules
            mine = [joules[c] for c in COMPONENTS]
        if self.world_size > 1 and dist.is_initialized():
            t = torch.tensor(mine, dtype=torch.float64, device=device)
            with self._collective_wait():
                dist.all_reduce(t)
            mine = t.tolist()
        return PowerReading(datetime.now(UTC), dict(zip(COMPONENTS, mine, strict=True)))

    def start(self, device, *, restart: int = 0) -> None:
        """Every rank, before the first step (``restart``: the torchrun restart this process belongs to)."""
        self.restart = int(restart)
        reading = self._reduced(device)
        if self.rank == 0:
            self.account = self._account(reading.time)
            self.account.start(reading)
        self.started = True

    def sample(self, step: int, tokens: int, device, *, force: bool = False) -> dict | None:
        """Every rank after every step (``tokens``: trained since this attempt started): on rank 0, an
        ``energy`` event's values on sampling steps."""
        if self.started and self.from_step is None:
            self.from_step = step - 1  # called after every step: this is the segment's first
        if not self.started or (not force and step % self.every):
            return None
        reading = self._reduced(device)
        if self.account is None:
            return None
        self.account.add(reading, step=step, tokens=tokens - self._tokens)  # the account takes increments
        self._tokens = tokens
        values = self.account.event_values() | {"restart": self.restart, "from_step": self.from_step}
        if self.carbon_note:
            values["carbon_note"] = self.carbon_note
        return values

    def finish(self, step: int, tokens: int, device) -> dict | None:
        """Every rank after the last step: the closing sample (rank 0 gets its event values)."""
        if step % self.every == 0:
            return None  # the last step was a sampling step on every rank: nothing since
        return self.sample(step, tokens, device, force=True)

    def summary(self) -> dict | None:
        return self.account.summary() if self.account is not None else None

    def close(self) -> None:
        if self.meter is not None:
            self.meter.close()

    # ------------------------------------------------------------------------------------------ rank 0

    def _account(self, start: datetime) -> EnergyAccount:
        s = self.settings
        intensity = None
        zone = s.get("zone")
        if zone:
            from workers.green.providers import resolve_series

            try:
                resolved = resolve_series(zone, start, start + INTENSITY_HORIZON, env=self._env)
                intensity = resolved["series"]
            except (LookupError, ValueError) as exc:
                self.carbon_note = f"no carbon intensity for zone {zone}: {exc}"
        else:
            self.carbon_note = "no grid zone is set for this job: energy only (set energy.zone, e.g. GB)"
        tariff = None
        if s.get("price_per_kwh") is not None:
            tariff = Tariff.flat(
                float(s["price_per_kwh"]), str(s["currency"]), str(s.get("price_source") or "set on the job")
            )
        embodied = embodied_for(self._device_name, self._device_count) if self._device_name else None
        return EnergyAccount(
            meter=self.meter.describe(),
            pue=s.get("pue"),
            pue_source=s.get("pue_source"),
            intensity=intensity,
            market_factor_g_per_kwh=s.get("market_factor_g_per_kwh"),
            market_factor_source=s.get("market_factor_source"),
            tariff=tariff,
            embodied=embodied,
        )
