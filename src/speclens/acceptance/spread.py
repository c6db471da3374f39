"""Acceptance's spread between requests: per-request AL quantiles, and a request's own AL drawn
from them.

An AL is a mean over verify steps; requests differ around it. A spread states the distribution of
per-request ALs *weighted by their verify steps* (the measure under which its mean is the run's
pooled AL) as quantiles at the fixed ``LEVELS``, read as piecewise uniform between neighbours.

A request's decode steps are its tokens over the tokens a decode step gains, 1 + c(a − 1) at
AL a and draft coverage c (the share of decode steps that draft; 1 for a forced or model
drafter), and its verify steps c times those: a request with AL a carries verify steps in
proportion to 1/(1 + c(a − 1)). Drawing requests from the step-weighted distribution itself
would pull the pooled AL below its mean (to the harmonic mean at c = 1). ``RequestDraw``
therefore draws a request's AL from the *request* measure, density proportional to
1 + c(a − 1) times the step-weighted one, so the pooled AL of the requests drawn (tokens over
verify steps) is the spread's step-weighted mean. Before that, the
quantiles are moved by one linear map (toward 1 or toward K + 1, so no quantile leaves
[1, K + 1]) until their mean is exactly the target AL: the pooled AL still hits the target.

Every draw is a pure function of a seed and the request's key (``request_uniform``), so every
tensor-parallel rank, and the simulator's two loops, draw the same AL for the same request.
Pure Python: no numpy, no torch.
"""

from __future__ import annotations

import hashlib
import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from speclens.acceptance.quantity import minimum_variance_rates

#: The fixed quantile levels a spread states, and their names in a file (``p0`` .. ``p100``).
LEVELS: tuple[float, ...] = (0.0, 0.05, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 1.0)
LEVEL_NAMES: tuple[str, ...] = ("p0", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p100")
#: A spread resting on fewer requests says too little about its tails to be stated.
MIN_REQUESTS = 20
#: How far the quantiles' implied mean may sit from the profile's AL when no tolerance is stated.
DEFAULT_TOLERANCE = 0.05
#: The widest tolerance a spread may state (an AL unit and beyond would describe another value).
MAX_TOLERANCE = 0.5
#: What a resolution without a spread says wherever tails are printed.
SPREAD_UNKNOWN = "spread unknown: tails are minimum-variance, optimistic"


def implied_mean(quantiles: Sequence[float]) -> float:
    """The step-weighted mean of the piecewise-uniform distribution through ``quantiles`` (one
    value a level of ``LEVELS``)."""
    return math.fsum(
        (LEVELS[j + 1] - LEVELS[j]) * (quantiles[j] + quantiles[j + 1]) / 2
        for j in range(len(LEVELS) - 1)
    )


def quantile_problems(
    quantiles: Sequence[float], k: int | None, length: float | None, tolerance: float | None
) -> list[str]:
    """What is wrong with ``quantiles`` as a spread at K (and around AL ``length``), each a
    sentence; checked in the order a reader would fix them."""
    if len(quantiles) != len(LEVELS):
        return [f"needs {len(LEVELS)} quantiles ({', '.join(LEVEL_NAMES)}), got {len(quantiles)}"]
    if not all(math.isfinite(q) for q in quantiles):
        return ["must be finite numbers"]
    out: list[str] = []
    for j in range(1, len(quantiles)):
        if quantiles[j] < quantiles[j - 1]:
            out.append(
                f"fall from {LEVEL_NAMES[j - 1]} {quantiles[j - 1]:g} to {LEVEL_NAMES[j]} "
                f"{quantiles[j]:g}: quantiles never decrease"
            )
            break
    if k is not None:
        outside = [
            f"{name} {q:g}" for name, q in zip(LEVEL_NAMES, quantiles, strict=True)
            if not 1.0 <= q <= k + 1
        ]  # fmt: skip
        if outside:
            out.append(
                f"{', '.join(outside)} outside [1, K + 1] = [1, {k + 1}]: a request's AL counts "
                "the target's own token and at most K drafts"
            )
    if length is not None and not out:
        limit = DEFAULT_TOLERANCE if tolerance is None else tolerance
        mean = implied_mean(quantiles)
        if abs(mean - length) > limit + 1e-12:
            out.append(
                f"imply a mean AL of {mean:.4f}, {abs(mean - length):.4f} from the stated "
                f"acceptance_length {length:g}, beyond the tolerance {limit:g}"
            )
    return out


def weighted_quantiles(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """``values``' quantiles at ``LEVELS`` with each value counted ``weights`` times (a request's
    AL by its verify steps): p0 the least value, p100 the greatest, between them the weighted
    empirical distribution interpolated at each value's mid-weight (Hazen's rule)."""
    pairs = sorted((v, w) for v, w in zip(values, weights, strict=True) if w > 0)
    if not pairs:
        raise ValueError("no value with a positive weight")
    total = math.fsum(w for _, w in pairs)
    mids, acc = [], 0.0
    for _, w in pairs:
        mids.append((acc + w / 2) / total)
        acc += w
    xs = [v for v, _ in pairs]
    out = []
    for level in LEVELS:
        if level <= mids[0] or len(xs) == 1:
            out.append(xs[0] if level < 1.0 or len(xs) == 1 else xs[-1])
        elif level >= mids[-1]:
            out.append(xs[-1])
        else:
            i = bisect_right(mids, level) - 1
            t = (level - mids[i]) / (mids[i + 1] - mids[i])
            out.append(xs[i] + t * (xs[i + 1] - xs[i]))
    out[0], out[-1] = xs[0], xs[-1]
    return out


def fitted(quantiles: Sequence[float], target: float, k: int) -> list[float]:
    """``quantiles`` moved by one linear map so their implied mean is ``target`` exactly: toward
    1 when the target is below their mean, toward K + 1 when above (each order-preserving, and
    neither takes a quantile out of [1, K + 1])."""
    mean, top = implied_mean(quantiles), k + 1.0
    if not 1.0 <= target <= top:
        raise ValueError(f"target AL {target:g} is outside [1, {top:g}]")
    if math.isclose(mean, target, rel_tol=0.0, abs_tol=1e-12):
        return list(quantiles)
    if target < mean:
        scale = (target - 1.0) / (mean - 1.0)
        return [1.0 + (q - 1.0) * scale for q in quantiles]
    scale = (top - target) / (top - mean)
    return [top - (top - q) * scale for q in quantiles]


@dataclass(frozen=True)
class Segment:
    """Between two neighbouring quantiles: its bounds, its share of verify steps and its share
    of requests (``step_mass`` x the tokens a decode step gains at its mid AL, normalised)."""

    low: float
    high: float
    step_mass: float
    request_mass: float


class RequestDraw:
    """Draws requests' ALs so that their pooled AL is ``target`` at draft coverage ``coverage``
    (see the module docstring)."""

    def __init__(
        self, quantiles: Sequence[float], target: float, k: int, coverage: float = 1.0
    ) -> None:
        if not 0.0 < coverage <= 1.0:
            raise ValueError(f"draft coverage {coverage!r} is outside (0, 1]")
        self.target, self.k, self.coverage = float(target), int(k), float(coverage)
        self.knots = fitted(quantiles, target, k)
        weights = [
            (LEVELS[j + 1] - LEVELS[j]) * self._gain((self.knots[j] + self.knots[j + 1]) / 2)
            for j in range(len(LEVELS) - 1)
        ]
        total = math.fsum(weights)
        self.segments = tuple(
            Segment(self.knots[j], self.knots[j + 1], LEVELS[j + 1] - LEVELS[j], w / total)
            for j, w in enumerate(weights)
        )
        self._cumulative: list[float] = []
        acc = 0.0
        for segment in self.segments:
            acc += segment.request_mass
            self._cumulative.append(acc)

    def _gain(self, al: float) -> float:
        """Tokens a decode step gains at AL ``al``: what a request's weight grows with."""
        return 1.0 + self.coverage * (al - 1.0)

    def al(self, u: float) -> float:
        """The AL of the request whose uniform draw is ``u`` in [0, 1): a segment by its request
        mass, then within it by density proportional to b + c·a (b = 1 − c): the root of
        b(a − low) + c(a² − low²)/2 = v·(its value at high)."""
        j = min(bisect_right(self._cumulative, u), len(self.segments) - 1)
        segment = self.segments[j]
        start = self._cumulative[j] - segment.request_mass
        v = 0.0 if segment.request_mass <= 0 else (u - start) / segment.request_mass
        v = min(max(v, 0.0), 1.0)
        low, high, c = segment.low, segment.high, self.coverage
        b = 1.0 - c
        area = v * (b * (high - low) + c * (high * high - low * low) / 2)
        # c a²/2 + b a − (b low + c low²/2 + area) = 0, its root at or above low
        constant = b * low + c * low * low / 2 + area
        value = (-b + math.sqrt(b * b + 2 * c * constant)) / c
        return min(max(value, low), high)

    def request_probabilities(self) -> list[float]:
        """Each segment's share of requests: what a test over requests expects per segment."""
        return [s.request_mass for s in self.segments]


def request_uniform(seed: int, key: str | int) -> float:
    """A uniform in [0, 1) fixed by the seed and the request's key (its id, or its index in a
    simulated workload): the same on every rank and every run, never from Python's salted
    ``hash``."""
    digest = hashlib.blake2b(f"{int(seed)}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def request_rates(al: float, rates: Sequence[float], derived: bool) -> list[float]:
    """A request's per-position rates at its own AL. Derived rates (no shape stated) are the
    minimum-variance schedule at that AL; stated rates keep their shape: scaled toward 0 for a
    lower AL, mixed toward all-accepted for a higher one (either keeps them non-increasing and
    summing to AL − 1)."""
    k = len(rates)
    if derived:
        return minimum_variance_rates(al, k)
    base = 1.0 + math.fsum(rates)
    if al <= base:
        scale = 0.0 if base <= 1.0 else (al - 1.0) / (base - 1.0)
        return [r * scale for r in rates]
    t = (al - base) / (k + 1.0 - base)
    return [min(1.0, r + (1.0 - r) * t) for r in rates]
