"""Confidence intervals for the figures of a sweep point and for the realized AL.

Across rounds a figure's interval is Student's t on the rounds' values (each round one draw of
the whole run). With one round there is nothing to spread over, so the interval is a bootstrap
over the run's requests, and says so (``method``). The realized AL is a ratio of sums over
requests (1 + accepted / verify steps), so its standard error is the ratio estimator's (the
delta method with requests as the sampling unit), not the spread of per-request ALs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from scipy import stats as _stats

from speclens.acceptance import acceptance_length

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
Method = Literal["t", "bootstrap", "none"]


@dataclass(frozen=True)
class Interval:
    """A figure's point estimate and its two-sided interval at ``confidence``.

    ``n`` is what the interval spreads over: rounds for ``t``, requests for ``bootstrap``;
    ``none`` means it could not be computed (one value, or no values), and low/high are NaN.
    """

    mean: float
    low: float
    high: float
    n: int
    method: Method
    confidence: float = CONFIDENCE

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def to_json(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v)
                for k, v in asdict(self).items()}  # fmt: skip


def _none(values: Sequence[float]) -> Interval:
    mean = float(np.mean(values)) if len(values) else math.nan
    return Interval(mean, math.nan, math.nan, len(values), "none")


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Student's t interval for the mean of ``values`` (one per round)."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if len(finite) < 2:
        return _none(finite)
    array = np.asarray(finite)
    mean = float(array.mean())
    se = float(array.std(ddof=1)) / math.sqrt(len(array))
    q = float(_stats.t.ppf((1 + confidence) / 2, df=len(array) - 1))
    return Interval(mean, mean - q * se, mean + q * se, len(array), "t", confidence)


def bootstrap_interval(
    samples: np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray],
    confidence: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> Interval:
    """Percentile bootstrap over a run's requests, seeded.

    ``samples`` holds one row per request (shape ``(n,)`` or ``(n, k)``); ``statistic`` reduces
    the request axis of a stack of resamples, ``(r, n[, k]) -> (r,)``, so a resample costs one
    vectorised pass, not a Python loop.
    """
    samples = np.asarray(samples, dtype=float)
    n = len(samples)
    point = float(statistic(samples[None])[0]) if n else math.nan
    if n < 2:
        return Interval(point, math.nan, math.nan, n, "none", confidence)
    rng = np.random.default_rng(seed)
    values = statistic(samples[rng.integers(0, n, size=(resamples, n))])
    values = values[np.isfinite(values)]
    if not len(values):
        return Interval(point, math.nan, math.nan, n, "none", confidence)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return Interval(point, float(low), float(high), n, "bootstrap", confidence)


@dataclass(frozen=True)
class RealizedAL:
    """AL = 1 + sum(accepted) / sum(steps) over requests, with the ratio estimator's SE."""

    al: float
    se: float
    requests: int
    verify_steps: int

    def interval(self, confidence: float = CONFIDENCE) -> Interval:
        q = float(_stats.norm.ppf((1 + confidence) / 2))
        if not math.isfinite(self.se):
            return Interval(self.al, math.nan, math.nan, self.requests, "none", confidence)
        return Interval(self.al, self.al - q * self.se, self.al + q * self.se, self.requests,
                        "t", confidence)  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {"al": self.al, "se": None if math.isnan(self.se) else self.se,
                "requests": self.requests, "verify_steps": self.verify_steps}  # fmt: skip


def realized_al(accepted: Sequence[int], steps: Sequence[int]) -> RealizedAL:
    """The pooled AL of requests with (accepted drafts, verify steps), and its standard error.

    Delta method for a ratio of means r = mean(a) / mean(s) with requests as the unit:
    var(r) = sum((a_i - r s_i)^2) / (n (n - 1) mean(s)^2). NaN SE under two requests.
    """
    pairs = [(a, s) for a, s in zip(accepted, steps, strict=True) if s > 0]
    total_a, total_s = sum(a for a, _ in pairs), sum(s for _, s in pairs)
    al = acceptance_length(total_a, total_s)
    n = len(pairs)
    if n < 2:
        return RealizedAL(al, math.nan, n, total_s)
    ratio = total_a / total_s
    mean_s = total_s / n
    residual = sum((a - ratio * s) ** 2 for a, s in pairs)
    se = math.sqrt(residual / (n * (n - 1))) / mean_s
    return RealizedAL(al, se, n, total_s)
