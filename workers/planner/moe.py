"""Expected expert-parallel load imbalance of a mixture-of-experts layer (busiest EP rank / mean).

Each of the ``ep`` ranks of an expert-parallel group holds ``num_experts / ep`` experts, contiguously
(rank r keeps experts ``[r * E/ep, (r+1) * E/ep)``, as ``workers/training/parallel/expert.py`` does), and
receives every assignment of the group's ``ep * tokens`` tokens (``top_k`` distinct experts each) that
lands on one of them. The busiest rank sets the pace of the all-to-all and of the expert GEMMs, so the
cost model charges ``imbalance = E[max_r load_r] / mean load``:

- **uniform routing**: every expert equally likely. The rank counts are multinomial; their Gaussian
  approximation (de Moivre-Laplace) with the finite-population factor of choosing ``top_k`` *distinct*
  experts gives the imbalance floor from sampling alone, which shrinks as ``1/sqrt(tokens)``.
- **measured routing**: a per-expert load distribution of past runs (the runtime's ``expert_load``)
  replaces the uniform shares; its skew raises the rank means, sampling noise is added on top.

A ``capacity_factor`` caps the result (tokens above capacity are dropped). Only numpy is imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

# grid of the numeric integrals, in standard deviations either side of the rank means
_SPAN_SD = 10.0
_GRID_POINTS = 4001


@dataclass(frozen=True)
class MeasuredExpertLoad:
    """Per-expert load measured by past runs of a model: the planner's input for measured routing."""

    load: tuple[float, ...]
    """Share of the routed tokens per expert (sums to 1), averaged over MoE layers and runs."""
    runs: int
    """How many runs the mean is taken over."""
    source: str = ""
    """Where the figures come from (the jobs), for the plan's ``moe_imbalance.source``."""


def normal_cdf(x) -> np.ndarray:
    """Standard normal CDF, vectorised, from erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7)."""
    z = np.abs(np.asarray(x, dtype=np.float64)) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = 1.0 - poly * np.exp(-z * z)
    return 0.5 * (1.0 + np.sign(x) * erf)


def _expected_max_of_normals(means: np.ndarray, sds: np.ndarray) -> float:
    """E[max] of independent normals N(means[i], sds[i]^2), by E[X] = lo + integral_lo^inf (1 - F(x)) dx
    with F the product of the CDFs (F(lo) ~ 0 at ``_SPAN_SD`` deviations below every mean)."""
    sds = np.maximum(sds, 1e-12)
    lo = float(np.min(means - _SPAN_SD * sds))
    hi = float(np.max(means + _SPAN_SD * sds))
    x = np.linspace(lo, hi, _GRID_POINTS)
    cdf = np.prod(normal_cdf((x[:, None] - means[None, :]) / sds[None, :]), axis=1)
    tail = 1.0 - cdf
    return lo + float(np.sum((tail[1:] + tail[:-1]) * 0.5 * np.diff(x)))


@lru_cache(maxsize=256)
def expected_max_std_normal(n: int) -> float:
    """E[max of n iid standard normals] = integral of x n phi(x) Phi(x)^(n-1) dx (David & Nagaraja 2003,
    Order Statistics, §3.1), computed numerically: 0 for n = 1, 1/sqrt(pi) for n = 2, and about
    sqrt(2 ln n) for large n (Cramér 1946)."""
    if n <= 1:
        return 0.0
    return _expected_max_of_normals(np.zeros(n), np.ones(n))


def _distinct_choice_factor(num_experts: int, top_k: int) -> float:
    """Variance factor of choosing ``top_k`` distinct experts instead of ``top_k`` independent ones
    (hypergeometric finite-population correction (E - k) / (E - 1))."""
    return (num_experts - top_k) / (num_experts - 1) if num_experts > 1 else 0.0


def rank_shares(measured_load, num_experts: int, ep: int) -> np.ndarray:
    """Share of the routed tokens each EP rank receives when it holds ``num_experts / ep`` contiguous
    experts of a per-expert ``measured_load`` (normalised to sum 1)."""
    load = np.asarray(measured_load, dtype=np.float64)
    if load.shape != (num_experts,) or np.any(load < 0) or load.sum() <= 0:
        raise ValueError(f"measured_load must be {num_experts} non-negative shares, got {load.shape[0]}")
    if num_experts % ep:
        raise ValueError(f"ep={ep} must divide num_experts ({num_experts})")
    return (load / load.sum()).reshape(ep, num_experts // ep).sum(axis=1)


@lru_cache(maxsize=4096)
def _measured_imbalance(
    load: tuple[float, ...], num_experts: int, top_k: int, ep: int, tokens: float
) -> float:
    """E[busiest rank] / mean when the ranks' contiguous experts carry the per-expert ``load``, with the
    sampling noise of ``tokens`` per rank (cached: the search asks for the same few (ep, tokens) often)."""
    if ep <= 1:
        return 1.0
    shares = rank_shares(load, num_experts, ep)
    n = ep * tokens * top_k  # assignments in the group
    mean = tokens * top_k  # per rank
    # multinomial variance n q (1 - q), distinct top-k correction, and the n/(n-1) that turns independent
    # normals into the counts' equicorrelated ones (rho = -1/(ep-1) when the shares are equal: max =
    # sqrt(1 - rho) x max of iid, Owen & Steck 1962, Ann. Math. Statist. 33)
    var = n * shares * (1.0 - shares) * _distinct_choice_factor(num_experts, top_k) * ep / (ep - 1)
    return _expected_max_of_normals(n * shares / mean, np.sqrt(var) / mean)


def expected_imbalance(
    ep,
    num_experts: int,
    top_k: int,
    tokens,
    measured_load=None,
    capacity_factor: float | None = None,
) -> np.ndarray:
    """Expected busiest-EP-rank load / mean load of one MoE layer and one micro-batch, per layout.

    ``ep`` and ``tokens`` (tokens of one micro-batch on one rank) are arrays that broadcast together (the
    cost model's layouts) or scalars. ``measured_load`` (one share per expert) replaces uniform routing.
    ``capacity_factor`` caps the result. 1.0 where ``ep == 1``.

    Uniform routing in closed form: rank r's count over ``ep * tokens`` tokens has mean ``tokens * top_k``
    and, with the equicorrelation correction above, standard deviation
    ``sqrt(tokens * top_k * (E - k) / (E - 1))``, so imbalance = 1 + e(ep) sqrt((E - k) / ((E - 1) tokens k))
    with e(n) = :func:`expected_max_std_normal`.
    """
    ep_a, tok_a = np.broadcast_arrays(np.asarray(ep, dtype=np.int64), np.asarray(tokens, dtype=np.float64))
    if measured_load is None:
        eps, inverse = np.unique(ep_a, return_inverse=True)
        e_n = np.array([expected_max_std_normal(int(n)) for n in eps])[inverse].reshape(ep_a.shape)
        spread = math.sqrt(_distinct_choice_factor(num_experts, top_k) / top_k)
        out = 1.0 + e_n * spread / np.sqrt(np.maximum(tok_a, 1.0))
    else:
        load = tuple(float(v) for v in measured_load)
        pairs = np.stack([ep_a.reshape(-1).astype(np.float64), tok_a.reshape(-1)], axis=1)
        uniq, inverse = np.unique(pairs, axis=0, return_inverse=True)
        values = np.array([_measured_imbalance(load, num_experts, top_k, int(e), float(t)) for e, t in uniq])
        out = values[inverse.reshape(-1)].reshape(ep_a.shape)
    out = np.where(ep_a <= 1, 1.0, out)
    if capacity_factor:
        # tokens above capacity are dropped: the busiest rank never gets more than cf x its share
        out = np.minimum(out, capacity_factor)
    return out


def mean_measured_load(loads: list[list[float]], num_experts: int) -> tuple[float, ...] | None:
    """The mean per-expert share of several runs' ``expert_load`` lists (those of ``num_experts`` entries
    that sum to a positive number, each normalised); None when none qualifies."""
    rows = [np.asarray(v, dtype=np.float64) for v in loads if v is not None and len(v) == num_experts]
    rows = [r / r.sum() for r in rows if np.all(r >= 0) and r.sum() > 0]
    if not rows:
        return None
    return tuple(float(round(v, 6)) for v in np.mean(rows, axis=0))


__all__ = [
    "MeasuredExpertLoad",
    "expected_imbalance",
    "expected_max_std_normal",
    "mean_measured_load",
    "normal_cdf",
    "rank_shares",
]
