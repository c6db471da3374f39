"""The verdict of a run forced with a stated spread: the mean over requests, the counts within
the spread's schedules, and the per-request ALs tested against the stated quantiles, with the
test's power stated and INCONCLUSIVE where the run is too short to tell.

The runs here are synthetic and seeded: each request draws its AL as the server does
(``RequestDraw`` over ``request_uniform``), then runs the minimum-variance schedule at it, one
Bernoulli a step, until it has emitted its tokens (the last step may overshoot, as under
max_tokens)."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from scipy import stats

from speclens.acceptance import AcceptanceSpread, ValidationError
from speclens.acceptance.spread import (
    LEVEL_NAMES,
    MIN_REQUESTS,
    RequestDraw,
    implied_mean,
    request_uniform,
)
from speclens.runs.stats import realized_al
from speclens.runs.verify import (
    MIN_SPREAD_EFFECT,
    SPREAD_ALPHA,
    SPREAD_POWER,
    noncentrality_for_power,
    spread_line,
    step_mixture,
    verify,
)

K = 4
#: A spread as wide as Spec-Bench's categories with n-gram drafting (2.1 to 3.9 by category).
QUANTILES = [1.6, 2.0, 2.2, 2.6, 3.1, 3.6, 4.0, 4.3, 4.9]
TARGET = implied_mean(QUANTILES)
SPREAD = AcceptanceSpread(
    num_spec_tokens=K, quantiles=dict(zip(LEVEL_NAMES, QUANTILES, strict=True)), requests=200
)


def forced_run(
    n: int, seed: int, tokens: int = 64, spread: bool = True, target: float = TARGET
) -> tuple[dict[str, int], list[tuple[int, int]]]:
    """A run of ``n`` requests forced at ``target`` (with the spread, or every request at the
    mean): the pooled histogram and each request's (verify steps, accepted drafts)."""
    draw = RequestDraw(QUANTILES, target, K)
    rng = random.Random(seed)
    histogram: dict[str, int] = {}
    requests = []
    for i in range(n):
        al = draw.al(request_uniform(seed, str(i))) if spread else target
        whole = min(int(al - 1.0 + 1e-9), K)
        frac = 0.0 if whole == K else al - 1.0 - whole
        emitted, steps, accepted = 1, 0, 0
        while emitted < tokens:
            count = whole + (rng.random() < frac)
            histogram[str(count)] = histogram.get(str(count), 0) + 1
            steps, accepted, emitted = steps + 1, accepted + count, emitted + count + 1
        requests.append((steps, accepted))
    return histogram, requests


def judged(n: int, seed: int, spread: bool = True) -> dict[str, Any]:
    histogram, requests = forced_run(n, seed, spread=spread)
    return verify(histogram, TARGET, K, spread=SPREAD, requests=requests)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_run_forced_with_the_spread_passes(seed: int) -> None:
    verdict = judged(200, seed)
    assert verdict["passed"] and not verdict["inconclusive"], verdict["reason"]
    block = verdict["spread"]
    assert block["passed"] and not block["inconclusive"]
    assert block["p"] >= SPREAD_ALPHA and block["detectable_effect"] <= MIN_SPREAD_EFFECT
    assert block["requests"] == 200 and block["df"] == len(block["bins"]) - 1 >= 4
    assert all(b["expected"] >= 5 for b in block["bins"])
    assert sum(b["observed"] for b in block["bins"]) == pytest.approx(200)
    assert "the per-request ALs match the stated spread" in verdict["reason"]


@pytest.mark.parametrize("tokens", [32, 128])
def test_a_long_run_forced_with_the_spread_passes(tokens: int) -> None:
    """1,000 requests see small misfits: short requests (32 tokens, about 10 verify steps) pile
    on the lattice of t / s, and expecting the step measure's shares instead of the request
    measure's would fail here."""
    histogram, requests = forced_run(1000, 4, tokens=tokens)
    verdict = verify(histogram, TARGET, K, spread=SPREAD, requests=requests)
    assert verdict["passed"], verdict["reason"]
    assert verdict["spread"]["detectable_effect"] < 0.1


def test_a_run_forced_without_the_spread_fails_on_the_spread_alone() -> None:
    """Every request at the mean: the mean and the counts match (each step still accepts 1 to
    4 drafts), but the per-request ALs sit in the middle bins."""
    verdict = judged(200, 1, spread=False)
    assert not verdict["passed"] and not verdict["inconclusive"]
    assert verdict["al_ok"] and verdict["histogram_ok"]
    block = verdict["spread"]
    assert not block["passed"] and not block["inconclusive"] and block["p"] < 1e-6
    assert verdict["reason"].startswith("the per-request ALs do not follow the stated spread")


def test_a_run_with_too_few_requests_is_inconclusive() -> None:
    verdict = judged(MIN_REQUESTS - 1, 1)
    assert not verdict["passed"] and verdict["inconclusive"]
    assert verdict["al_ok"] and verdict["histogram_ok"]
    block = verdict["spread"]
    assert block["inconclusive"] and block["p"] is None
    reason = verdict["reason"]
    assert f"{MIN_REQUESTS - 1} requests with verify steps, at least {MIN_REQUESTS}" in reason
    assert verdict["reason"].startswith("inconclusive: spread: ")


def test_a_run_too_short_to_see_the_minimum_effect_is_inconclusive() -> None:
    """30 requests are enough to run the test, not to detect a total variation of 0.3."""
    verdict = judged(30, 1)
    block = verdict["spread"]
    assert not verdict["passed"] and verdict["inconclusive"]
    assert block["p"] >= SPREAD_ALPHA and block["detectable_effect"] > MIN_SPREAD_EFFECT
    reason = verdict["reason"]
    assert f"30 requests detect a total variation of {block['detectable_effect']:.2f}" in reason
    # Failing is never held back for want of power: the mean-only run fails at 30 requests.
    assert not judged(30, 1, spread=False)["inconclusive"]


def test_the_detectable_effect_is_the_one_sample_power_formula() -> None:
    block = judged(200, 1)["spread"]
    lam = noncentrality_for_power(SPREAD_ALPHA, block["df"])
    critical = stats.chi2.isf(SPREAD_ALPHA, block["df"])
    assert stats.ncx2.sf(critical, block["df"], lam) == pytest.approx(SPREAD_POWER, abs=1e-6)
    assert block["detectable_effect"] == pytest.approx(math.sqrt(lam / (4 * 200)))
    assert (block["alpha"], block["power"], block["min_effect"]) == (
        SPREAD_ALPHA, SPREAD_POWER, MIN_SPREAD_EFFECT,
    )  # fmt: skip


def test_the_mean_is_judged_over_requests_not_steps() -> None:
    """Between-request spread makes the pooled AL vary far more than the per-step binomial
    says: the SE is the ratio estimator's over requests, and a run whose pooled AL is off by
    many per-step SEs (but few request SEs) passes the mean."""
    histogram, requests = forced_run(200, 1)
    verdict = verify(histogram, TARGET, K, spread=SPREAD, requests=requests)
    steps = [s for s, _ in requests]
    se = realized_al([a for _, a in requests], steps).se
    assert verdict["standard_error"] == pytest.approx(se)
    assert verdict["standard_error_over"] == "requests"
    per_step = math.sqrt(0.25 / sum(steps))  # the widest a per-step binomial SE can be
    assert se > 3 * per_step
    off = abs(verdict["realized_acceptance_length"] - TARGET)
    assert off > 4 * per_step and verdict["al_ok"]


def test_a_pooled_al_beyond_the_requests_se_fails_the_mean() -> None:
    histogram, requests = forced_run(200, 1, target=TARGET - 0.4)
    verdict = verify(histogram, TARGET, K, spread=SPREAD, requests=requests)
    assert not verdict["al_ok"] and not verdict["passed"] and not verdict["inconclusive"]
    assert "standard errors of" in verdict["reason"] and "over 200 requests" in verdict["reason"]


def test_a_count_no_schedule_of_the_spread_draws_fails() -> None:
    """The spread's ALs run from 1.6 to 4.9, so steps accept 0 to 4 drafts; a narrower spread
    (2.2 to 3.6: 1 to 3) is failed by a step that accepted 4."""
    narrow = [2.2, 2.3, 2.4, 2.6, 2.9, 3.2, 3.4, 3.5, 3.6]
    spread = SPREAD.model_copy(update={"quantiles": dict(zip(LEVEL_NAMES, narrow, strict=True))})
    histogram, requests = forced_run(200, 1)
    target = implied_mean(narrow)
    verdict = verify(histogram, target, K, spread=spread, requests=requests)
    assert not verdict["histogram_ok"] and not verdict["passed"]
    assert set(verdict["unexpected_buckets"]) == {"0", "4"}
    assert "never draw" in verdict["reason"] and "(expected only 1..3)" in verdict["reason"]


def test_the_bins_expect_the_request_measure_not_the_step_measure() -> None:
    """High-AL requests carry fewer steps: a share of requests is the share of steps times the
    AL, normalised. With long requests (little noise) the bins expect exactly those shares."""
    histogram, requests = forced_run(200, 1, tokens=4000)
    block = verify(histogram, TARGET, K, spread=SPREAD, requests=requests)["spread"]
    draw = RequestDraw(QUANTILES, TARGET, K)
    knots = draw.knots
    apart = 0.0
    for b in block["bins"]:
        inside = [
            s for s, lo, hi in zip(draw.segments, knots, knots[1:], strict=False)
            if lo >= b["low"] - 1e-9 and hi <= b["high"] + 1e-9
        ]  # fmt: skip
        request_share = sum(s.request_mass for s in inside)
        step_share = sum(s.step_mass for s in inside)
        assert b["expected"] / 200 == pytest.approx(request_share, abs=0.01)
        apart += abs(request_share - step_share) / 2
    assert apart > 0.05  # the step measure would expect other shares (0.09 apart)


def test_the_expected_step_distribution_mixes_the_spreads_schedules() -> None:
    """``expected_distribution`` (what the report plots against the histogram) is the
    step-weighted mixture of the spread's minimum-variance schedules: its mean is AL - 1."""
    mixture = step_mixture(RequestDraw(QUANTILES, TARGET, K))
    assert sum(mixture.values()) == pytest.approx(1.0)
    assert sum(j * p for j, p in mixture.items()) == pytest.approx(TARGET - 1.0)
    verdict = judged(200, 1)
    assert verdict["expected_distribution"] == {str(j): p for j, p in mixture.items()}


def test_without_a_stated_spread_the_verdict_is_todays() -> None:
    histogram, requests = forced_run(50, 1, spread=False)
    today = verify(histogram, TARGET, K)
    assert verify(histogram, TARGET, K, spread=None, requests=requests) == today
    assert "spread" not in today and "standard_error_over" not in today


def test_a_spread_at_another_k_is_refused() -> None:
    histogram, requests = forced_run(50, 1)
    with pytest.raises(ValidationError, match=r"spread\.num_spec_tokens: is 4, but the run"):
        verify(histogram, TARGET, 5, spread=SPREAD, requests=requests)


def test_the_verdict_keeps_its_keys_and_adds_the_spread_block() -> None:
    verdict = judged(200, 1)
    for key in ("expected_acceptance_length", "num_spec_tokens", "z", "verify_steps",
                "expected_distribution", "realized_acceptance_length", "standard_error",
                "interval", "al_ok", "histogram_ok", "unexpected_buckets", "observed_split",
                "expected_split", "passed", "inconclusive", "reason"):  # fmt: skip
        assert key in verdict
    block = verdict["spread"]
    assert set(block) >= {"test", "statistic", "df", "p", "alpha", "requests", "bins",
                          "detectable_effect", "min_effect", "passed", "inconclusive",
                          "reason", "stated_quantiles", "fitted_quantiles",
                          "realized_quantiles"}  # fmt: skip
    assert list(block["realized_quantiles"]) == list(LEVEL_NAMES)


def test_the_spread_line_names_the_test_requests_p_and_effect() -> None:
    line = spread_line(judged(200, 1)["spread"])
    assert line.startswith("spread check PASS: chi-square goodness of fit")
    assert "200 requests" in line and " p " in line and "detects total variation" in line
    few = spread_line(judged(10, 1)["spread"])
    assert few.startswith("spread check INCONCLUSIVE: 10 requests with verify steps")
