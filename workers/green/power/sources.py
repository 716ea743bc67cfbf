"""What every power source is: cumulative joules for the components it feeds, a description of how it
measures (or estimates) them, and the two tools the samplers share, a trapezoidal integrator and a
background sampling thread."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any


class SourceUnavailable(RuntimeError):
    """A power source is absent here; the message says why (shown in ``describe()["tried"]``)."""


class PowerSource:
    """One power source feeding one or more components; cumulative joules since it started."""

    name = "estimate"
    measured = False

    def __init__(self, components: Sequence[str]):
        self.components = tuple(components)

    def joules(self, now: float) -> dict[str, float]:
        raise NotImplementedError

    def describe(self, component: str) -> dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class NoSource(PowerSource):
    """A component nothing meters: zero joules, and the description says why."""

    name = "none"

    def __init__(self, component: str, why: str, *, missing: bool):
        super().__init__([component])
        self.why, self.missing = why, missing

    def joules(self, now: float) -> dict[str, float]:
        return dict.fromkeys(self.components, 0.0)

    def describe(self, component: str) -> dict[str, Any]:
        return {"source": "none", "measured": False, "missing": self.missing, "why": self.why}


class PowerIntegrator:
    """Trapezoidal integral of power samples (W) over monotonic time (s), safe across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.joules = 0.0
        self.last: tuple[float, float] | None = None  # (monotonic s, W)
        self.samples = 0

    def add(self, t: float, watts: float) -> None:
        with self._lock:
            if self.last is not None and t > self.last[0]:
                self.joules += 0.5 * (self.last[1] + watts) * (t - self.last[0])
            if self.last is None or t >= self.last[0]:
                self.last = (t, watts)
            self.samples += 1

    def total_at(self, now: float) -> float:
        """The integral up to the last sample, plus the last power held until ``now``."""
        with self._lock:
            if self.last is None:
                return 0.0
            return self.joules + self.last[1] * max(0.0, now - self.last[0])


class BackgroundSampler:
    """A daemon thread calling ``sample()`` every ``interval_s`` until closed."""

    def __init__(self, name: str, interval_s: float, sample: Callable[[], None]):
        self._stop = threading.Event()
        self.errors = 0
        self.last_error = ""

        def run() -> None:
            while not self._stop.wait(interval_s):
                try:
                    sample()
                except Exception as exc:  # a failed sample is counted and shown, the meter goes on
                    self.errors += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
