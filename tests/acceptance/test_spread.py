"""The spread between requests (``acceptance/spread.py``): its quantiles, the linear map that moves
their mean onto a target, and the request draw whose pooled AL is that target. Statistical claims
are checked with fixed seeds and tolerances from their standard errors."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from speclens.acceptance import AcceptanceValue, minimum_variance_rates, validate
from speclens.acceptance.registry import Registry
from speclens.acceptance.resolver import resolve
from speclens.acceptance.schema import AcceptancePin
from speclens.acceptance.spread import (
    LEVELS,
    RequestDraw,
    fitted,
    implied_mean,
    request_rates,
    request_uniform,
    weighted_quantiles,
)

QUANTILES = [1.5, 1.9, 2.1, 2.5, 3.0, 3.4, 3.8, 4.1, 4.6]


def test_the_implied_mean_is_the_piecewise_uniform_mean_worked_out_by_hand() -> None:
    by_hand = (
        0.05 * (1.5 + 1.9) / 2 + 0.05 * (1.9 + 2.1) / 2 + 0.15 * (2.1 + 2.5) / 2
        + 0.25 * (2.5 + 3.0) / 2 + 0.25 * (3.0 + 3.4) / 2 + 0.15 * (3.4 + 3.8) / 2
        + 0.05 * (3.8 + 4.1) / 2 + 0.05 * (4.1 + 4.6) / 2
    )  # fmt: skip
    assert implied_mean(QUANTILES) == pytest.approx(by_hand, abs=1e-12)


@pytest.mark.parametrize("target", [1.2, 2.4, 2.9725, 3.6, 4.9])
def test_fitted_quantiles_hit_the_target_and_stay_ordered_inside_the_bounds(target: float) -> None:
    moved = fitted(QUANTILES, target, 4)
    assert implied_mean(moved) == pytest.approx(target, abs=1e-12)
    assert moved == sorted(moved)
    assert moved[0] >= 1.0 and moved[-1] <= 5.0


def test_weighted_quantiles_follow_numpy_on_a_weighted_sample() -> None:
    rng = np.random.default_rng(3)
    values = rng.uniform(1, 5, 4000)
    weights = rng.integers(1, 6, 4000)
    expanded = np.repeat(values, weights)
    got = weighted_quantiles(values.tolist(), weights.tolist())
    want = np.quantile(expanded, LEVELS, method="hazen")
    assert got[0] == values.min() and got[-1] == values.max()
    assert got[1:-1] == pytest.approx(want[1:-1].tolist(), abs=0.01)


def test_weighting_by_steps_differs_from_weighting_by_requests() -> None:
    values, steps = [2.0, 4.0], [30, 10]  # three quarters of the steps sit at 2
    # Hazen: the values stand at their mid-weights, 0.375 and 0.875 of the steps
    assert weighted_quantiles(values, steps)[4] == pytest.approx(2 + 2 * 0.125 / 0.5)
    assert weighted_quantiles(values, [1, 1])[4] == pytest.approx(3.0)


def test_requests_drawn_pool_to_the_target_and_reproduce_the_stated_quantiles() -> None:
    """Each request decodes O tokens in O / a steps: its steps-weighted ALs must show the stated
    (fitted) quantiles, and the pooled AL Σ tokens / Σ steps must be the target, where drawing
    from the step measure itself would pool to the lower harmonic mean."""
    target, n, tokens = 3.1, 40_000, 120
    draw = RequestDraw(QUANTILES, target, 4)
    rng = random.Random(7)
    als = np.array([draw.al(rng.random()) for _ in range(n)])
    steps = tokens / als
    pooled = tokens * n / steps.sum()
    # the pooled AL's SE over requests (a ratio estimator, requests as units)
    residual = tokens - pooled * steps
    se = math.sqrt(float((residual**2).sum()) / (n - 1) * n) / steps.sum()
    assert abs(pooled - target) < 4 * se
    got = weighted_quantiles(als.tolist(), steps.tolist())
    assert got[1:-1] == pytest.approx(draw.knots[1:-1], abs=0.03)
    assert draw.knots[0] <= als.min() and als.max() <= draw.knots[-1]


def test_a_segment_s_request_share_is_its_step_share_times_its_mid_al() -> None:
    draw = RequestDraw(QUANTILES, implied_mean(QUANTILES), 4)
    mids = [(QUANTILES[j] + QUANTILES[j + 1]) / 2 for j in range(8)]
    masses = [(LEVELS[j + 1] - LEVELS[j]) * mids[j] for j in range(8)]
    assert draw.request_probabilities() == pytest.approx([m / sum(masses) for m in masses])


def test_request_uniform_is_fixed_by_seed_and_key_and_spreads_over_the_unit_interval() -> None:
    assert request_uniform(5, "req-1") == request_uniform(5, "req-1")
    assert request_uniform(5, "req-1") != request_uniform(6, "req-1")
    draws = [request_uniform(0, str(i)) for i in range(20_000)]
    counts, _ = np.histogram(draws, bins=10, range=(0, 1))
    # chi-square over 10 equal bins: 9 df, 27.9 is its 0.999 quantile
    assert float(((counts - 2000) ** 2 / 2000).sum()) < 27.9


@pytest.mark.parametrize("al", [1.0, 1.7, 2.4, 3.3, 5.0])
def test_a_request_s_rates_keep_the_stated_shape_and_sum_to_its_al(al: float) -> None:
    stated = [0.8, 0.6, 0.45, 0.2]
    rates = request_rates(al, stated, derived=False)
    assert sum(rates) == pytest.approx(al - 1, abs=1e-12)
    assert all(a >= b for a, b in itertools.pairwise(rates))
    assert all(0 <= r <= 1 for r in rates)
    assert request_rates(al, stated, derived=True) == minimum_variance_rates(al, 4)


def test_the_resolution_carries_the_winning_layer_s_spread() -> None:
    spread = {
        "num_spec_tokens": 4,
        "quantiles": dict(zip(("p0", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p100"),
                              QUANTILES, strict=True)),
        "requests": 64,
    }  # fmt: skip
    value = validate(
        AcceptanceValue, {"num_spec_tokens": 4, "acceptance_length": 2.97, "spread": spread}
    )
    res = resolve(model="m", method="mtp", num_spec_tokens=4, registry=Registry([]),
                  scenario=AcceptancePin(value=value))  # fmt: skip
    assert res.spread is not None and res.spread.values == QUANTILES
    plain = validate(AcceptanceValue, {"num_spec_tokens": 4, "acceptance_length": 2.97})
    assert resolve(model="m", method="mtp", num_spec_tokens=4, registry=Registry([]),
                   scenario=AcceptancePin(value=plain)).spread is None  # fmt: skip


@pytest.mark.parametrize("coverage", [0.3, 0.7])
def test_under_partial_coverage_requests_still_pool_to_the_target(coverage: float) -> None:
    """A request at AL a gains 1 + c(a − 1) tokens a decode step and drafts on c of them: its
    verify steps are c·O / (1 + c(a − 1)), and the drawn requests' pooled AL is the target."""
    target, n, tokens = 2.6, 40_000, 120
    draw = RequestDraw(QUANTILES, target, 4, coverage)
    rng = random.Random(11)
    als = np.array([draw.al(rng.random()) for _ in range(n)])
    steps = coverage * tokens / (1 + coverage * (als - 1))
    pooled = float((steps * als).sum() / steps.sum())
    residual = steps * als - pooled * steps
    se = math.sqrt(float((residual**2).sum()) / (n - 1) * n) / steps.sum()
    assert abs(pooled - target) < 4 * se
    assert weighted_quantiles(als.tolist(), steps.tolist())[1:-1] == pytest.approx(
        draw.knots[1:-1], abs=0.03
    )
