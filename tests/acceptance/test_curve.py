"""``speclens.acceptance.curve``: AL at K 1..8 from one K, by a geometric decay of the
per-position acceptance fitted on the golden curves, with a range from their residuals.

The formulas are worked out here by hand (a few positions, numbers chosen to be exact), the fit
is held to curves made from a known decay, and the shipped model to the golden curves it was
fitted on (its range holds every one of them, by construction of the envelope)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from speclens.acceptance import ValidationError, curve
from speclens.acceptance.registry import ACCEPTANCE_DIR, load_sets, shipped_registry


def _golden() -> list[curve.TrainingCurve]:
    path = shipped_registry() / ACCEPTANCE_DIR / f"{curve.TRAINING_SET}.yaml"
    (registered,) = load_sets([path])
    return curve.training_curves(registered.profile_set)


def _made(first: float, decay: float, name: str) -> curve.TrainingCurve:
    """A curve written out from the model's definition: r_i = a^i d^(i(i-1)/2), AL = 1 + sum."""
    rates = [first**i * decay ** (i * (i - 1) / 2) for i in curve.CURVE_KS]
    return curve.TrainingCurve(name, name, tuple(1 + sum(rates[:k]) for k in curve.CURVE_KS))


def test_lengths_by_hand() -> None:
    # a 0.8, d 0.5: r = 0.8, 0.64 * 0.5 = 0.32, 0.512 * 0.125 = 0.064, 0.4096 / 64 = 0.0064
    got = curve.lengths(0.8, 0.5)
    assert got[:4] == pytest.approx([1.8, 2.12, 2.184, 2.1904])
    # d 1 is the constant per-position rate: AL(K) = (1 - a^(K+1)) / (1 - a)
    assert curve.lengths(0.6, 1.0) == pytest.approx(
        [(1 - 0.6 ** (k + 1)) / 0.4 for k in curve.CURVE_KS]
    )


def test_solve_recovers_the_first_rate_and_matches_the_observation() -> None:
    made = _made(0.7, 0.9, "x")
    for k in curve.CURVE_KS:
        a, d = curve.solve(made.lengths[k - 1], k, 0.9)
        assert float(a) == pytest.approx(0.7, abs=1e-9) and float(d) == 0.9


def test_an_al_the_decay_cannot_reach_raises_the_decay_with_every_first_draft_accepted() -> None:
    # At d 0.5 and a = 1, AL(4) = 1 + 1 + 0.5 + 0.125 + 0.015625 = 2.640625: AL 3 needs d > 0.5.
    assert float(curve.lengths(1.0, 0.5)[3]) == pytest.approx(2.640625)
    a, d = curve.solve(3.0, 4, 0.5)
    assert float(a) == 1.0 and 0.5 < float(d) < 1.0
    assert float(curve.lengths(a, d)[3]) == pytest.approx(3.0, abs=1e-9)
    a, d = curve.solve(5.0, 4, 0.5)  # K + 1: every draft accepted
    assert float(a) == 1.0 and float(d) == pytest.approx(1.0, abs=1e-9)


def test_constant_rate_is_the_closed_form() -> None:
    # AL 2.2 at K 2: 1 + a + a^2 = 2.2, a = (-1 + sqrt(1 + 4.8)) / 2
    a = (-1 + math.sqrt(5.8)) / 2
    assert curve.constant_rate(2.2, 2) == pytest.approx(
        [(1 - a ** (k + 1)) / (1 - a) for k in curve.CURVE_KS]
    )


def test_the_fit_finds_the_decay_the_curves_were_made_with() -> None:
    made = [_made(0.85, 0.93, "a"), _made(0.7, 0.93, "b"), _made(0.95, 0.93, "c")]
    model = curve.fit(made, "made")
    assert model.decay == pytest.approx(0.93, abs=1e-9)
    assert model.curves == 3 and model.training_set == "made"
    # made from the model itself: every residual is rounding
    assert all(-1e-9 < low <= 0 <= high < 1e-9 for low, high in model.spread)
    points = model.predict(made[0].lengths[1], 2)
    assert [p.acceptance_length for p in points] == pytest.approx(made[0].lengths, abs=1e-9)


def test_the_fit_is_coarse_then_fine() -> None:
    # 0.937 is off the coarse grid (0.93, 0.94): the fine search finds it
    made = [_made(0.8, 0.937, "a"), _made(0.9, 0.937, "b")]
    assert curve.fit(made, "made").decay == pytest.approx(0.937, abs=1e-9)


def test_the_range_is_the_residuals_envelope_at_each_step() -> None:
    """Three curves of different decays: the fitted d is the middle one's (the least mean
    error), and the residuals of the others at step K - K_obs bound the range at that step; the
    step is signed (the slow curve lies above the prediction at K above K_obs, below under)."""
    slow, mid, fast = _made(0.8, 0.98, "slow"), _made(0.8, 0.92, "mid"), _made(0.8, 0.85, "fast")
    model = curve.fit([slow, mid, fast], "three")
    assert model.decay == pytest.approx(0.92, abs=1e-9)
    residual = {}
    for c in (slow, mid, fast):
        predicted = curve.predictions(model.decay, np.array([c.lengths]))[0]
        residual[c.name] = np.log(np.array(c.lengths)[None, :] / predicted)
    for step in range(-7, 8):
        mask = (np.arange(8)[None, :] - np.arange(8)[:, None]) == step
        values = np.concatenate([r[mask] for r in residual.values()])
        low, high = model.spread[step + 7]
        assert low == pytest.approx(min(0.0, values.min())) and high == pytest.approx(
            max(0.0, values.max())
        )
    assert residual["slow"][1, 7] > 0 > residual["slow"][7, 1]  # K 2 -> 8 short, K 8 -> 2 over
    # from K 2 of the slow curve: at K 8 the range reaches up to the slow curve's own AL
    points = model.predict(slow.lengths[1], 2)
    assert points[7].low < points[7].acceptance_length < slow.lengths[7] <= points[7].high + 1e-12


def test_the_shipped_model_on_the_golden_curves() -> None:
    model = curve.shipped()
    golden = _golden()
    assert model.curves == len(golden) == 14 and model.training_set == curve.TRAINING_SET
    assert 0.9 < model.decay < 1.0  # acceptance falls off along the positions
    assert f"d {model.decay:.3f}" in model.describe() and curve.TRAINING_SET in model.describe()
    model_errors, base_errors = [], []
    for c in golden:
        for k in curve.CURVE_KS:
            points = model.predict(c.lengths[k - 1], k)
            base = curve.constant_rate(c.lengths[k - 1], k)
            values = [p.acceptance_length for p in points]
            assert values[k - 1] == c.lengths[k - 1]
            assert all(x < y for x, y in itertools.pairwise(values))  # it rises with K
            for p, measured in zip(points, c.lengths, strict=True):
                # in-sample, the envelope holds every golden AL, within [1, K + 1]
                assert 1 <= p.low <= min(p.acceptance_length, measured) + 1e-9
                assert max(p.acceptance_length, measured) - 1e-9 <= p.high <= p.num_spec_tokens + 1
                if p.num_spec_tokens != k:
                    model_errors.append(abs(p.acceptance_length / measured - 1))
                    base_errors.append(abs(base[p.num_spec_tokens - 1] / measured - 1))
    assert np.median(model_errors) < np.median(base_errors)
    assert np.quantile(model_errors, 0.9) < np.quantile(base_errors, 0.9)


def test_an_observation_with_its_own_range_widens_the_curve_s() -> None:
    model = curve.shipped()
    alone = model.predict(2.3, 3)
    wide = model.predict(2.3, 3, 2.1, 2.5)
    assert (wide[2].low, wide[2].acceptance_length, wide[2].high) == (2.1, 2.3, 2.5)
    assert (alone[2].low, alone[2].high) == (2.3, 2.3)
    for a, w in zip(alone, wide, strict=True):
        assert w.acceptance_length == a.acceptance_length
        assert w.low <= a.low and w.high >= a.high
    # the low end is predicted from the low AL: at K 4 that is the low curve times e^min
    least = model.spread[4 - 3 + 7][0]
    low_curve = curve.lengths(*curve.solve(2.1, 3, model.decay))
    assert wide[3].low == pytest.approx(max(1.0, float(low_curve[3]) * math.exp(least)))


def test_the_ends_of_the_range_are_clipped_to_one_and_k_plus_one() -> None:
    model = curve.shipped()
    top = model.predict(9.0, 8)  # every draft accepted at K 8
    assert [p.acceptance_length for p in top] == pytest.approx([k + 1 for k in curve.CURVE_KS])
    assert all(p.high == p.num_spec_tokens + 1 for p in top)
    bottom = model.predict(1.0, 4)  # none accepted
    assert all(
        p.acceptance_length == pytest.approx(1.0, abs=1e-12) and p.low == 1.0 for p in bottom
    )


@pytest.mark.parametrize(("length", "k", "field"), [
    (2.0, 0, "num_spec_tokens"), (2.0, 9, "num_spec_tokens"), (2.0, True, "num_spec_tokens"),
    (0.99, 3, "acceptance_length"), (4.01, 3, "acceptance_length"),
    (math.nan, 3, "acceptance_length"), (math.inf, 3, "acceptance_length"),
])  # fmt: skip
def test_an_observation_outside_the_model_is_refused_in_one_line(length: float, k: int,
                                                                 field: str) -> None:  # fmt: skip
    with pytest.raises(ValidationError) as exc:
        curve.shipped().predict(length, k, file="run/summary.json")
    (problem,) = exc.value.problems
    assert problem.file == "run/summary.json" and problem.path == field
    assert "\n" not in str(exc.value)
    assert ("outside 1..8" if field == "num_spec_tokens" else "outside [1, ") in problem.message


def test_a_range_that_does_not_hold_the_al_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"range: \[2.4, 2.6\] does not hold the AL 2.3"):
        curve.shipped().predict(2.3, 3, 2.4, 2.6)
