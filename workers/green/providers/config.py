"""Which live providers a deployment switches on, from its environment (none by default: nothing reaches the
internet unless asked)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from workers.green.providers.electricitymaps import (
    ELECTRICITYMAPS_URL,
    ENV_ELECTRICITYMAPS_TOKEN,
    ENV_ELECTRICITYMAPS_URL,
    ElectricityMaps,
)
from workers.green.providers.http import DEFAULT_TIMEOUT_S, IntensityProvider
from workers.green.providers.uk_carbon_intensity import (
    ENV_UK_CARBON_INTENSITY,
    ENV_UK_CARBON_INTENSITY_URL,
    UK_CARBON_INTENSITY_URL,
    UKCarbonIntensity,
)
from workers.green.providers.watttime import (
    ENV_WATTTIME_PASSWORD,
    ENV_WATTTIME_URL,
    ENV_WATTTIME_USERNAME,
    WATTTIME_URL,
    WattTime,
)


@dataclasses.dataclass(frozen=True)
class ProviderSlot:
    """One live provider: its client when the environment configures it, else why not."""

    name: str
    provider: IntensityProvider | None
    reason: str = ""
    misconfigured: bool = False


def _env(env: Mapping[str, str], key: str) -> str:
    return (env.get(key) or "").strip()


def live_slots(env: Mapping[str, str], timeout: float) -> list[ProviderSlot]:
    """Each live provider, best first: the client when configured, else why not."""
    slots = []

    def url(key: str, default: str) -> str:
        value = _env(env, key) or default
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"{key} must be an http:// or https:// URL, got {value!r}")
        return value

    token = _env(env, ENV_ELECTRICITYMAPS_TOKEN)
    if not token:
        slots.append(
            ProviderSlot("electricitymaps", None, f"not configured (set {ENV_ELECTRICITYMAPS_TOKEN})")
        )
    else:
        try:
            client = ElectricityMaps(
                token, base_url=url(ENV_ELECTRICITYMAPS_URL, ELECTRICITYMAPS_URL), timeout=timeout
            )
            slots.append(ProviderSlot("electricitymaps", client))
        except ValueError as e:
            slots.append(ProviderSlot("electricitymaps", None, str(e), misconfigured=True))

    user, password = _env(env, ENV_WATTTIME_USERNAME), _env(env, ENV_WATTTIME_PASSWORD)
    if not user and not password:
        slots.append(
            ProviderSlot(
                "watttime", None, f"not configured (set {ENV_WATTTIME_USERNAME} and {ENV_WATTTIME_PASSWORD})"
            )
        )
    elif not user or not password:
        have, lack = (
            (ENV_WATTTIME_USERNAME, ENV_WATTTIME_PASSWORD)
            if user
            else (ENV_WATTTIME_PASSWORD, ENV_WATTTIME_USERNAME)
        )
        slots.append(
            ProviderSlot("watttime", None, f"{have} is set but {lack} is not: set both or neither", True)
        )
    else:
        try:
            client = WattTime(user, password, base_url=url(ENV_WATTTIME_URL, WATTTIME_URL), timeout=timeout)
            slots.append(ProviderSlot("watttime", client))
        except ValueError as e:
            slots.append(ProviderSlot("watttime", None, str(e), misconfigured=True))

    switch = _env(env, ENV_UK_CARBON_INTENSITY).lower()
    if switch in ("", "0", "false", "no", "off"):
        slots.append(
            ProviderSlot(
                "uk-carbon-intensity",
                None,
                f"not switched on (set {ENV_UK_CARBON_INTENSITY}=1; it needs no key)",
            )
        )
    elif switch not in ("1", "true", "yes", "on"):
        slots.append(
            ProviderSlot(
                "uk-carbon-intensity",
                None,
                f"{ENV_UK_CARBON_INTENSITY} must be 1 or 0, got {env.get(ENV_UK_CARBON_INTENSITY)!r}",
                True,
            )
        )
    else:
        try:
            client = UKCarbonIntensity(
                base_url=url(ENV_UK_CARBON_INTENSITY_URL, UK_CARBON_INTENSITY_URL), timeout=timeout
            )
            slots.append(ProviderSlot("uk-carbon-intensity", client))
        except ValueError as e:
            slots.append(ProviderSlot("uk-carbon-intensity", None, str(e), misconfigured=True))
    return slots


def configured_providers(
    env: Mapping[str, str], *, timeout: float = DEFAULT_TIMEOUT_S
) -> list[IntensityProvider]:
    """The live providers ``env`` switches on, best first (none by default): Electricity Maps with
    ``ELECTRICITYMAPS_TOKEN``, WattTime with ``WATTTIME_USERNAME`` and ``WATTTIME_PASSWORD``, the UK Carbon
    Intensity API with ``CANN_TRAIN_UK_CARBON_INTENSITY=1``. ``ELECTRICITYMAPS_API_URL``, ``WATTTIME_API_URL``
    and ``CANN_TRAIN_UK_CARBON_INTENSITY_URL`` replace the base URLs (a proxy, a mirror, a test server).
    A half-done configuration (a username without a password, an unreadable switch) is a ``ValueError``."""
    slots = live_slots(env, timeout)
    wrong = [s.reason for s in slots if s.misconfigured]
    if wrong:
        raise ValueError("; ".join(wrong))
    return [s.provider for s in slots if s.provider is not None]
