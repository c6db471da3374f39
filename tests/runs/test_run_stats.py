"""The intervals cover what they claim, checked by simulation with fixed seeds.

Coverage over T trials is a binomial proportion: at 95% nominal its standard error is
sqrt(0.95 * 0.05 / T); each check allows four of them (the percentile bootstrap and the delta
method are asymptotic, so their small-sample coverage is checked against a looser floor).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from speclens.runs.stats import bootstrap_interval, realized_al, t_interval

TRIALS = 2000
SE = math.sqrt(0.95 * 0.05 / TRIALS)


def test_t_interval_covers_the_mean_at_95_percent_with_three_rounds() -> None:
    rng = np.random.default_rng(1)
    hits = sum(t_interval(rng.normal(10.0, 2.0, size=3)).contains(10.0) for _ in range(TRIALS))
    assert abs(hits / TRIALS - 0.95) < 4 * SE


#: Student's t quantiles by their closed forms (no scipy), for the few rounds a sweep runs:
#: df 1 (Cauchy): t_p = tan(pi (p - 1/2));
#: df 2: t_p = (2p - 1) / sqrt(2 p (1 - p));
#: df 4: a = 4 p (1 - p), q = cos(arccos(sqrt(a)) / 3) / sqrt(a), t_p = 2 sqrt(q - 1).
#: A normal quantile would be 1.960 (95%) and 1.645 (90%) at every df.
def _t_by_hand(p: float, df: int) -> float:
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    assert df == 4
    a = 4 * p * (1 - p)
    q = math.cos(math.acos(math.sqrt(a)) / 3) / math.sqrt(a)
    return 2 * math.sqrt(q - 1)


@pytest.mark.parametrize(
    ("values", "confidence", "quantile"),
    [
        # two rounds 9 and 11: mean 10, s = sqrt(2), se = s / sqrt(2) = 1; t(0.975, 1) = 12.706
        ([9.0, 11.0], 0.95, 12.706204736174696),
        # the same at 90%: t(0.95, 1) = tan(0.45 pi) = 6.3138
        ([9.0, 11.0], 0.90, 6.313751514675031),
        # three rounds 7, 10, 13: s = 3, se = 3 / sqrt(3); t(0.975, 2) = 4.3027
        ([7.0, 10.0, 13.0], 0.95, 4.302652729749462),
        # five rounds 8, 9, 10, 11, 12: s = sqrt(10 / 4), se = s / sqrt(5); t(0.975, 4) = 2.7764
        ([8.0, 9.0, 10.0, 11.0, 12.0], 0.95, 2.7764451051977934),
    ],
)
def test_a_few_rounds_get_students_t_width_not_a_normal_one(
    values: list[float], confidence: float, quantile: float
) -> None:
    """t_interval's half width is t(df = n - 1) x s / sqrt(n), against quantiles worked out
    above: a normal quantile (1.96 where t is 12.7 at two rounds) fails every case."""
    n = len(values)
    assert _t_by_hand((1 + confidence) / 2, n - 1) == pytest.approx(quantile, rel=1e-12)
    mean = sum(values) / n
    s = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    iv = t_interval(values, confidence)
    assert (iv.method, iv.n, iv.confidence, iv.mean) == ("t", n, confidence, 10.0)
    assert iv.half_width == pytest.approx(quantile * s / math.sqrt(n), rel=1e-9)
    assert iv.low == pytest.approx(10.0 - quantile * s / math.sqrt(n), rel=1e-9)


def test_two_rounds_cover_at_95_percent_where_a_normal_quantile_covers_70() -> None:
    """Coverage of t_interval over 2,000 seeded two-round draws is 0.95 within four binomial
    standard errors (0.019); with z = 1.96 in place of t(0.975, 1) it would be
    P(|T_1| < 1.96) = 2 atan(1.96) / pi = 0.70."""
    rng = np.random.default_rng(4)
    hits = sum(t_interval(rng.normal(5.0, 3.0, size=2)).contains(5.0) for _ in range(TRIALS))
    assert abs(hits / TRIALS - 0.95) < 4 * SE, hits / TRIALS


def test_one_value_gives_no_interval_not_a_zero_width_one() -> None:
    one = t_interval([3.0])
    assert one.method == "none" and math.isnan(one.low) and one.mean == 3.0
    assert one.to_json()["low"] is None


def test_bootstrap_of_a_mean_covers_at_about_95_percent() -> None:
    rng = np.random.default_rng(2)
    trials = 500
    hits = sum(
        bootstrap_interval(rng.exponential(1.0, size=60), lambda m: m.mean(-1), resamples=1000,
                           seed=i).contains(1.0)
        for i in range(trials)
    )  # fmt: skip
    se = math.sqrt(0.95 * 0.05 / trials)
    assert 0.95 - 0.03 - 4 * se < hits / trials < 0.95 + 4 * se  # percentile bootstrap runs low


def test_bootstrap_is_seeded_and_says_so() -> None:
    x = np.arange(20.0)
    a, b = (bootstrap_interval(x, lambda m: m.mean(-1), seed=5) for _ in range(2))
    assert a == b and a.method == "bootstrap" and a.n == 20
    assert a.low < a.mean < a.high


def test_bootstrap_of_a_ratio_statistic_over_request_rows() -> None:
    """Throughput = total tokens / duration: a statistic over (n, k) rows."""
    rows = np.array([[10.0, 1.0], [30.0, 1.0], [20.0, 1.0], [40.0, 1.0]])
    iv = bootstrap_interval(rows, lambda m: m[..., 0].sum(-1) / 2.0)
    assert iv.mean == pytest.approx(50.0)
    assert iv.low < 50.0 < iv.high


def test_realized_al_is_the_pooled_ratio() -> None:
    r = realized_al([10, 30], [10, 10])
    assert r.al == pytest.approx(1 + 40 / 20) and r.verify_steps == 20 and r.requests == 2


def test_realized_al_standard_error_covers_the_true_al() -> None:
    """Requests of random length, each accepting Binomial(K, p) per step: true AL = 1 + K p."""
    rng = np.random.default_rng(3)
    k, p, trials = 7, 0.4, 1000
    hits = 0
    for _ in range(trials):
        steps = rng.poisson(15, size=40) + 1
        accepted = rng.binomial(k * steps, p)
        hits += realized_al(accepted.tolist(), steps.tolist()).interval().contains(1 + k * p)
    se = math.sqrt(0.95 * 0.05 / trials)
    assert abs(hits / trials - 0.95) < 4 * se


def test_the_se_of_per_request_als_would_be_wrong_when_lengths_differ() -> None:
    """Mutation guard: dropping the ratio form (SE of mean per-request AL) is a different,
    smaller number when short requests are noisier; the pooled SE is checked against it."""
    steps = [1, 1, 1, 50, 50]
    accepted = [0, 7, 0, 150, 160]
    pooled = realized_al(accepted, steps)
    per_request = np.array([1 + a / s for a, s in zip(accepted, steps, strict=True)])
    naive = per_request.std(ddof=1) / math.sqrt(len(per_request))
    assert pooled.se < naive / 2
    assert realized_al([5], [3]).se != realized_al([5], [3]).se  # NaN under two requests
