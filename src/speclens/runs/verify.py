"""Judge a run against the acceptance it was supposed to hit.

Under forced acceptance at AL X, every verify step accepts floor(X - 1) or ceil(X - 1) drafts
(the minimum-variance schedule), the latter with probability frac(X - 1). The verdict checks the
realized token-weighted AL against X within ``z`` standard errors of that schedule, that no step
fell outside those two counts, and that the split lies within ``z`` standard errors of frac.

A PASS needs evidence: fewer than ``MIN_VERIFY_STEPS`` steps is "inconclusive" (never PASS), as
the z band is a normal approximation to a binomial count, and a handful of steps that happen to
match say little. Every reason names the verify steps it rests on, and a run's categories whose
AL rests on fewer steps are warned about (``thin_categories``).

With a stated spread (``AcceptanceSpread``) each request drew its own AL (``RequestDraw``, the
request measure) and ran the minimum-variance schedule at it, so the verdict checks three things:
the pooled AL within ``z`` standard errors of the ratio estimator with requests as the units (the
per-step binomial SE ignores the spread between requests and would fail a correct run); that no
step accepted a count the spread's schedules never draw (outside floor(p0 - 1)..ceil(p100 - 1));
and the realized per-request ALs against the stated quantiles (``spread_check``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import optimize as _optimize
from scipy import stats as _stats

from speclens.acceptance import (
    AcceptanceSpread,
    ValidationError,
    acceptance_length,
    accepted_count_distribution,
    minimum_variance_rates,
)
from speclens.acceptance.spread import (
    LEVEL_NAMES,
    MIN_REQUESTS,
    RequestDraw,
    weighted_quantiles,
)
from speclens.runs.stats import realized_al

DEFAULT_Z = 4.0
MIN_VERIFY_STEPS = 30  # the usual floor for a normal approximation to a binomial proportion

#: The spread test's level: a correct forced run fails it once in a thousand (at 0.01 a demo run
#: failed on its own request draws about once in a hundred).
SPREAD_ALPHA = 0.001
#: The power at which the spread test's detectable effect is stated.
SPREAD_POWER = 0.8
#: The total variation between the realized and the stated per-request distribution (over the
#: test's bins) a spread PASS must detect at ``SPREAD_POWER``: a run too short to see it is
#: inconclusive. 0.3 is three requests in ten in other bins than stated, about what forcing a
#: spread as wide as Spec-Bench's without it does; at 4 to 7 bins a PASS takes 60 to 71 requests.
MIN_SPREAD_EFFECT = 0.3
#: Cochran's rule: neighbouring bins are merged until each expects at least this many requests.
MIN_EXPECTED = 5.0
#: Points of the request measure a request's expected bin shares are averaged over.
GRID = 512
#: Slack for a realized AL that sits on a bin edge up to rounding.
_EPS = 1e-9

SPREAD_TEST = "chi-square goodness of fit of the per-request ALs over requests"

Request = tuple[int, int]  # (verify steps, accepted drafts)


def verify(
    histogram: dict[str, int],
    expected_length: float,
    k: int,
    z: float = DEFAULT_Z,
    spread: AcceptanceSpread | None = None,
    requests: Sequence[Request] | None = None,
    min_effect: float = MIN_SPREAD_EFFECT,
    alpha: float = SPREAD_ALPHA,
) -> dict[str, Any]:
    """The verdict and the numbers behind it (``passed`` is the bottom line). With ``spread``,
    ``requests`` gives each request's (verify steps, accepted drafts) and the verdict judges
    the run against the spread (``spread_verify``); without it, today's schedule check."""
    if spread is not None:
        return spread_verify(
            histogram, expected_length, k, spread, requests or [], z, min_effect, alpha
        )
    counts = {int(j): n for j, n in histogram.items() if n}
    steps = sum(counts.values())
    expected = accepted_count_distribution(minimum_variance_rates(expected_length, k))
    out: dict[str, Any] = {
        "expected_acceptance_length": expected_length,
        "num_spec_tokens": k,
        "z": z,
        "verify_steps": steps,
        "expected_distribution": {str(j): p for j, p in expected.items()},
    }
    if steps < MIN_VERIFY_STEPS:
        return {**out, **_too_few_steps(steps)}
    realized = acceptance_length(sum(j * n for j, n in counts.items()), steps)
    high = max(expected)
    p_high = expected[high] if len(expected) == 2 else 0.0
    se = math.sqrt(p_high * (1.0 - p_high) / steps)
    tolerance = z * se + 1e-9
    unexpected = {str(j): n for j, n in sorted(counts.items()) if j not in expected}
    observed_high = counts.get(high, 0) / steps if len(expected) == 2 else None
    al_ok = abs(realized - expected_length) <= tolerance
    split_ok = observed_high is None or abs(observed_high - p_high) <= tolerance
    histogram_ok = not unexpected and split_ok
    reasons = []
    if not al_ok:
        reasons.append(
            f"realized AL {realized:.4f} is outside {expected_length:g} ± {tolerance:.4f} "
            f"({z:g} standard errors of {se:.4f} over {steps} verify steps)"
        )
    if unexpected:
        reasons.append(
            f"steps accepted counts the schedule never draws: {unexpected} "
            f"(expected only {sorted(expected)})"
        )
    if not split_ok:
        reasons.append(
            f"{observed_high:.4f} of steps accepted {high}, expected {p_high:.4f} ± {tolerance:.4f}"
        )
    return {
        **out,
        **_judged(realized, se, expected_length, tolerance, al_ok, histogram_ok, unexpected),
        "observed_split": observed_high,
        "expected_split": p_high if len(expected) == 2 else None,
        "passed": al_ok and histogram_ok,
        "inconclusive": False,
        "reason": "; ".join(reasons)
        or f"realized AL {realized:.4f} and histogram match the forced schedule over {steps} "
        "verify steps",
    }


def _judged(
    realized: float, se: float, expected_length: float, tolerance: float, al_ok: bool,
    histogram_ok: bool, unexpected: dict[str, int],
) -> dict[str, Any]:  # fmt: skip
    """The figures every verdict reports, with or without a spread."""
    return {
        "realized_acceptance_length": realized,
        "standard_error": se,
        "interval": [expected_length - tolerance, expected_length + tolerance],
        "al_ok": al_ok,
        "histogram_ok": histogram_ok,
        "unexpected_buckets": unexpected,
    }


def _too_few_steps(steps: int) -> dict[str, Any]:
    return {
        "passed": False,
        "inconclusive": True,
        "reason": f"inconclusive: {steps} verify steps were reported, at least "
        f"{MIN_VERIFY_STEPS} are needed to judge (send more requests or more tokens)",
    }


# ------------------------------------------------------------------------------ with a spread


def spread_verify(
    histogram: dict[str, int],
    expected_length: float,
    k: int,
    spread: AcceptanceSpread,
    requests: Sequence[Request],
    z: float = DEFAULT_Z,
    min_effect: float = MIN_SPREAD_EFFECT,
    alpha: float = SPREAD_ALPHA,
) -> dict[str, Any]:
    """The verdict of a run forced with a spread: the mean (cluster-robust SE over requests),
    the counts (within the spread's schedules) and the spread (``spread_check``). Passed only
    when all three pass; inconclusive when nothing failed but the spread test could not tell.
    A spread at another K than the run's is refused (``ValidationError``)."""
    if spread.num_spec_tokens != k:
        raise ValidationError.single(
            "spread.num_spec_tokens",
            f"is {spread.num_spec_tokens}, but the run speculated K {k}: a spread is refused at "
            "another K, never rescaled",
        )
    minimum_variance_rates(expected_length, k)  # an AL outside [1, K + 1]: ValidationError
    draw = RequestDraw(spread.values, expected_length, k)
    counts = {int(j): n for j, n in histogram.items() if n}
    steps = sum(counts.values())
    low = max(0, math.floor(draw.knots[0] - 1.0 + _EPS))
    high = min(k, math.ceil(draw.knots[-1] - 1.0 - _EPS))
    stepped = [(int(s), int(a)) for s, a in requests if s >= 1]
    out: dict[str, Any] = {
        "expected_acceptance_length": expected_length,
        "num_spec_tokens": k,
        "z": z,
        "verify_steps": steps,
        "expected_distribution": {str(j): p for j, p in step_mixture(draw).items()},
        "standard_error_over": "requests",
    }
    block = spread_check(draw, spread, stepped, min_effect, alpha)
    if steps < MIN_VERIFY_STEPS:
        return {**out, **_too_few_steps(steps), "spread": block}
    if len(stepped) < 2:
        return {
            **out,
            "passed": False,
            "inconclusive": True,
            "reason": f"inconclusive: {len(stepped)} requests with verify steps; the AL's "
            "standard error over requests needs at least 2 (send more requests)",
            "spread": block,
        }
    realized = acceptance_length(sum(j * n for j, n in counts.items()), steps)
    se = realized_al([a for _, a in stepped], [s for s, _ in stepped]).se
    tolerance = z * se + 1e-9
    unexpected = {str(j): n for j, n in sorted(counts.items()) if not low <= j <= high}
    al_ok = abs(realized - expected_length) <= tolerance
    histogram_ok = not unexpected
    reasons = []
    if not al_ok:
        reasons.append(
            f"realized AL {realized:.4f} is outside {expected_length:g} ± {tolerance:.4f} "
            f"({z:g} standard errors of {se:.4f} over {len(stepped)} requests)"
        )
    if unexpected:
        reasons.append(
            f"steps accepted counts the spread's schedules never draw: {unexpected} "
            f"(expected only {low}..{high})"
        )
    if block["passed"] is False and not block["inconclusive"]:
        reasons.append(block["reason"])
    mean_ok = al_ok and histogram_ok
    evidence = f"over {steps} verify steps in {len(stepped)} requests"
    if reasons:
        reason = "; ".join(reasons)
    elif block["inconclusive"]:
        reason = (
            f"inconclusive: spread: {block['reason']}; realized AL {realized:.4f} and the counts "
            f"match the stated spread's schedules {evidence}"
        )
    else:
        reason = (
            f"realized AL {realized:.4f} and the counts match the stated spread's schedules "
            f"{evidence}; {block['reason']}"
        )
    return {
        **out,
        **_judged(realized, se, expected_length, tolerance, al_ok, histogram_ok, unexpected),
        "observed_split": None,
        "expected_split": None,
        "passed": mean_ok and bool(block["passed"]),
        "inconclusive": mean_ok and bool(block["inconclusive"]),
        "reason": reason,
        "spread": block,
    }


def spread_check(
    draw: RequestDraw,
    spread: AcceptanceSpread,
    requests: Sequence[Request],
    min_effect: float = MIN_SPREAD_EFFECT,
    alpha: float = SPREAD_ALPHA,
) -> dict[str, Any]:
    """The realized per-request ALs against the stated spread: a chi-square goodness of fit over
    requests, bins at the spread's (fitted) quantiles, neighbours merged until each expects
    ``MIN_EXPECTED`` requests.

    A request's realized AL is not its drawn AL: its steps' counts are floor or ceil of AL - 1
    at random, and a request of t tokens (steps + accepted drafts, which a forced AL does not
    move) realizes t / s for a whole number of steps s, a lattice coarse enough in short
    requests to pile requests on one side of a quantile. So each request is spread evenly over
    its lattice cell (t / (s + 1/2) to t / (s - 1/2)) and counts in the bins by its shares; its
    expected shares average, over the request measure (``GRID`` points), a normal around each
    AL a (variance a f (1 - f) / t, f = frac(a - 1): the schedule's noise over t / a steps)
    widened by that cell (a² / t). Shared out like this the counts vary less than a
    multinomial's, so the Pearson statistic is at most as spread as the chi-square: the test
    keeps its level (simulated correct forced runs failed 1% of the time or less, from 32 tokens
    a request and up to 1,000 requests).

    Power as ``speclens lossless`` states it: a one-sample test at total variation δ has
    noncentrality at least 4 n δ², so δ = sqrt(λ / (4 n)), λ the noncentrality at which the test
    rejects with ``SPREAD_POWER``. A PASS needs δ <= ``min_effect``; else inconclusive."""
    n = len(requests)
    out: dict[str, Any] = {
        "test": SPREAD_TEST,
        "stated_quantiles": dict(spread.quantiles),
        "fitted_quantiles": dict(zip(LEVEL_NAMES, draw.knots, strict=True)),
        "requests": n,
        "alpha": alpha,
        "power": SPREAD_POWER,
        "min_effect": min_effect,
        "realized_quantiles": None,
        "bins": [],
        "statistic": None,
        "df": None,
        "p": None,
        "detectable_effect": None,
    }
    if n:
        als = [acceptance_length(a, s) for s, a in requests]
        realized = weighted_quantiles(als, [s for s, _ in requests])
        out["realized_quantiles"] = dict(zip(LEVEL_NAMES, realized, strict=True))
    if n < MIN_REQUESTS:
        return {
            **out,
            "passed": False,
            "inconclusive": True,
            "reason": f"{n} requests with verify steps, at least {MIN_REQUESTS} are needed to "
            "test the spread (send more requests)",
        }
    edges = sorted(set(draw.knots[1:-1]))
    observed = _observed(requests, edges)
    expected = _expected(draw, edges, [s + a for s, a in requests]).sum(axis=0)
    groups = _merged(expected.tolist())
    top = draw.k + 1.0
    bounds = [1.0, *edges, top]
    bins = [
        {
            "low": bounds[g[0]],
            "high": bounds[g[-1] + 1],
            "observed": float(observed[g].sum()),
            "expected": float(expected[g].sum()),
        }
        for g in groups
    ]
    out["bins"] = bins
    if len(bins) < 2:
        return {
            **out,
            "passed": True,
            "inconclusive": False,
            "reason": f"the stated spread puts all {n} requests in one bin: nothing between "
            "requests to test beyond the counts",
        }
    statistic = math.fsum((b["observed"] - b["expected"]) ** 2 / b["expected"] for b in bins)
    df = len(bins) - 1
    p = float(_stats.chi2.sf(statistic, df))
    lam = noncentrality_for_power(alpha, df, SPREAD_POWER)
    delta = min(1.0, math.sqrt(lam / (4 * n)))
    out.update(statistic=statistic, df=df, p=p, detectable_effect=delta)
    test = f"chi-square {statistic:.2f} on {df} df over {n} requests, p {p:.3g}"
    if p < alpha:
        worst = max(bins, key=lambda b: (b["observed"] - b["expected"]) ** 2 / b["expected"])
        return {
            **out,
            "passed": False,
            "inconclusive": False,
            "reason": f"the per-request ALs do not follow the stated spread: {test} < alpha "
            f"{alpha:g} (AL {worst['low']:.3g} to {worst['high']:.3g}: {worst['observed']:.1f} "
            f"requests where {worst['expected']:.1f} were expected)",
        }
    if delta > min_effect:
        needed = math.ceil(lam / (4 * min_effect**2))
        return {
            **out,
            "passed": False,
            "inconclusive": True,
            "reason": f"{n} requests detect a total variation of {delta:.2f} at "
            f"{SPREAD_POWER:.0%} power, at most {min_effect:g} is needed to pass ({test}; "
            f"send about {needed} requests)",
        }
    return {
        **out,
        "passed": True,
        "inconclusive": False,
        "reason": f"the per-request ALs match the stated spread: {test} >= alpha {alpha:g}, "
        f"detecting a total variation of {delta:.2f} at {SPREAD_POWER:.0%} power",
    }


def _observed(requests: Sequence[Request], edges: Sequence[float]) -> np.ndarray:
    """Requests per bin, each spread evenly over its cell: a request of t tokens in s verify
    steps realizes t / s, and its cell runs from t / (s + 1/2) to t / (s - 1/2)."""
    steps = np.array([s for s, _ in requests], dtype=float)[:, None]
    tokens = steps + np.array([a for _, a in requests], dtype=float)[:, None]
    low, high = tokens / (steps + 0.5), tokens / (steps - 0.5)
    below = np.clip((np.asarray(edges, dtype=float)[None, :] - low) / (high - low), 0.0, 1.0)
    ones = np.ones((len(requests), 1))
    shares = np.diff(np.hstack([0.0 * ones, below, ones]), axis=1)
    return np.asarray(shares.sum(axis=0))


def _expected(draw: RequestDraw, edges: Sequence[float], tokens: Sequence[int]) -> np.ndarray:
    """Each request's chance of each bin (rows: requests), its emitted tokens ``tokens``: see
    ``spread_check``."""
    al = np.array([draw.al((g + 0.5) / GRID) for g in range(GRID)])
    whole = np.clip(np.floor(al - 1.0 + _EPS), 0, draw.k)
    frac = np.where(whole >= draw.k, 0.0, np.clip(al - 1.0 - whole, 0.0, 1.0))
    variance = frac * (1.0 - frac) * al  # a request's realized AL: a ± sqrt(variance / tokens)
    distinct, index = np.unique(np.asarray(tokens, dtype=float), return_inverse=True)
    t = distinct[:, None]
    sd = np.sqrt(variance[None, :] / t)
    width = al[None, :] ** 2 / t  # its cell: one verify step more or fewer
    below = [_normal_uniform_cdf(edge - al[None, :], sd, width).mean(axis=1) for edge in edges]
    cumulative = np.column_stack([np.zeros(len(distinct)), *below, np.ones(len(distinct))])
    shares = np.clip(np.diff(cumulative, axis=1), 0.0, None)
    return np.asarray(shares[index])


def _normal_uniform_cdf(x: np.ndarray, sd: np.ndarray, width: np.ndarray) -> np.ndarray:
    """P(N(0, sd²) + U(-width/2, width/2) < x), elementwise (width > 0): the uniform's own
    cdf where the normal is too narrow to matter (an AL whose steps all accept alike)."""
    uniform = np.clip((x + width / 2) / width, 0.0, 1.0)
    sd = np.maximum(sd, 1e-6 * width)
    hi, lo = (x + width / 2) / sd, (x - width / 2) / sd

    def antiderivative(z: np.ndarray) -> np.ndarray:  # ∫ Φ = z Φ(z) + φ(z)
        return np.asarray(z * _stats.norm.cdf(z) + _stats.norm.pdf(z))

    smooth = (antiderivative(hi) - antiderivative(lo)) * sd / width
    return np.asarray(np.clip(np.where(sd > 1e-6 * width, smooth, uniform), 0.0, 1.0))


def _merged(expected: Sequence[float]) -> list[list[int]]:
    """Neighbouring bins merged, left to right, until each expects at least ``MIN_EXPECTED``;
    a short last group joins the one before it."""
    groups: list[list[int]] = []
    current: list[int] = []
    total = 0.0
    for i, e in enumerate(expected):
        current.append(i)
        total += e
        if total >= MIN_EXPECTED:
            groups.append(current)
            current, total = [], 0.0
    if current:
        if groups:
            groups[-1].extend(current)
        else:
            groups.append(current)
    return groups


def step_mixture(draw: RequestDraw) -> dict[int, float]:
    """P(a verify step accepts j drafts) over the spread's steps: the minimum-variance schedule
    at AL a accepts j with the tent max(0, 1 - |a - 1 - j|), averaged over each segment's
    uniform AL by its share of steps."""

    def ramp(x: float) -> float:  # the tent's integral up to x
        if x <= -1.0:
            return 0.0
        if x <= 0.0:
            return (x + 1.0) ** 2 / 2
        if x <= 1.0:
            return 1.0 - (1.0 - x) ** 2 / 2
        return 1.0

    out: dict[int, float] = {}
    for j in range(draw.k + 1):
        total = 0.0
        for s in draw.segments:
            if s.step_mass <= 0:
                continue
            lo, hi = s.low - 1.0 - j, s.high - 1.0 - j
            if hi - lo < 1e-12:
                share = max(0.0, 1.0 - abs(lo))
            else:
                share = (ramp(hi) - ramp(lo)) / (hi - lo)
            total += s.step_mass * share
        if total > 1e-12:
            out[j] = total
    return out


@functools.lru_cache(maxsize=64)
def noncentrality_for_power(alpha: float, df: int, power: float = SPREAD_POWER) -> float:
    """The noncentrality at which a level-``alpha`` chi-square test on ``df`` df rejects with
    probability ``power``."""
    critical = float(_stats.chi2.isf(alpha, df))

    def short(lam: float) -> float:
        return float(_stats.ncx2.sf(critical, df, lam)) - power

    high = 1.0
    while short(high) < 0:
        high *= 2
    return float(_optimize.brentq(short, 1e-9, high, xtol=1e-9))


def spread_line(block: dict[str, Any]) -> str:
    """The spread check in one line (the bench console): its word, test, requests, p and δ."""
    word = "PASS" if block["passed"] else "INCONCLUSIVE" if block["inconclusive"] else "FAIL"
    if block.get("p") is None:
        return f"spread check {word}: {block['reason']}"
    return (
        f"spread check {word}: {block['test']}: {block['requests']} requests, "
        f"{len(block['bins'])} bins, chi-square {block['statistic']:.2f} on {block['df']} df, "
        f"p {block['p']:.3g} (alpha {block['alpha']:g}); detects total variation "
        f"{block['detectable_effect']:.2f} at {block['power']:.0%} power (a pass needs "
        f"<= {block['min_effect']:g})"
    )


def thin_categories(summary: dict[str, Any]) -> list[str]:
    """One warning per category whose AL rests on fewer than ``MIN_VERIFY_STEPS`` verify steps
    (none when only one category was sent: the verdict's own evidence line says it)."""
    rows = summary.get("figures", {}).get("acceptance", {}).get("al_by_category") or {}
    if len(rows) < 2:
        return []
    thin = sorted(
        (c, row["verify_steps"]) for c, row in rows.items()
        if row.get("al") is not None and row.get("verify_steps", 0) < MIN_VERIFY_STEPS
    )  # fmt: skip
    if not thin:
        return []
    shown = ", ".join(f"{c} ({n})" for c, n in thin)
    return [
        f"{len(thin)} of {len(rows)} categories have an AL resting on fewer than "
        f"{MIN_VERIFY_STEPS} verify steps: {shown}; send more requests to read them"
    ]
