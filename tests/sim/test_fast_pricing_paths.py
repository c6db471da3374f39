"""The fast path's cheaper ways to the same numbers: a short stretch priced as Python numbers
(``Roofline.decode_rows``) against the roofline's own prices, stretches priced either way giving
the same run, and a request's steps drawn with a margin from the variance of a step's tokens
(one drawn short is extended, never redrawn)."""

from __future__ import annotations

import numpy as np
import pytest

from speclens.acceptance import minimum_variance_rates
from speclens.cost import StepCost
from speclens.sim import catalog, fast, roofline
from speclens.sim.fast import _cdf, _Draws, _variance, run_replica
from speclens.sim.roofline import Efficiency, Roofline
from speclens.sim.sketch import Tally, Totals


def _roof(method: str | None) -> Roofline:
    return Roofline(catalog.model("deepseek-r1"), catalog.chip("h200"), 8, method=method,
                    efficiency=Efficiency(overhead=1e-3))  # fmt: skip


@pytest.mark.parametrize(("method", "k"), [("mtp", 3), ("ngram", 5), (None, 0)])
def test_decode_rows_prices_each_step_as_decode_does(method: str | None, k: int) -> None:
    """The same floats as ``decode`` a step at a time, the drafter's terms included, for a row
    inside the tables and for rows that grow them or lie past them (the formula's price)."""
    roofline._shared.clear()
    roof = _roof(method)
    rows = [[1, 900, 1], [32, 30_000, 20], [7, 5_000, 0], [256, 400_000, 256]]
    want = [float(roof.decode(s + k * d, s, c, d, k)) for s, c, d in rows]
    assert roof.decode_rows(rows, k) == want
    big = roofline.MAX_TABLE  # past the tables: priced by the formula
    assert roof.decode_rows([[big, 10**8, 0]], k) == [float(roof.decode(big, big, 10**8, 0, k))]


def _run(cost: object, seed: int = 3) -> tuple[Tally, Totals]:
    rates = minimum_variance_rates(3.2, 4)
    rng = np.random.default_rng([seed])
    requests = [(i, 0.0, int(n), int(m)) for i, (n, m) in
                enumerate(zip(rng.integers(200, 900, 120), rng.integers(2, 200, 120), strict=True))]  # fmt: skip
    tally, pooled = Tally(), Totals()
    run_replica(requests, 4, rates, 0.8, cost, 64, 8192, 200, 24,  # type: ignore[arg-type]
                np.random.default_rng([seed, 1]), tally, pooled)  # fmt: skip
    return tally, pooled


@pytest.mark.parametrize("cost", ["roofline", "linear"])
def test_a_stretch_priced_as_numbers_or_as_arrays_gives_the_same_run(
    monkeypatch: pytest.MonkeyPatch, cost: str
) -> None:
    """Every stretch priced a step at a time (``SHORT`` past any stretch) and every one priced
    as arrays (``SHORT`` 0) give the same run, to rounding, on the same draws."""
    price = _roof("mtp") if cost == "roofline" else StepCost(draft_base=1e-3)
    runs = []
    for short in (0, 10**9):
        monkeypatch.setattr(fast, "SHORT", short)
        runs.append(_run(price))
    (numbers, pooled_n), (arrays, pooled_a) = runs
    assert pooled_n.requests == pooled_a.requests == 120
    assert pooled_n.end == pytest.approx(pooled_a.end, rel=1e-12)
    for name in ("ttft", "tpot", "itl", "e2e"):
        got, want = numbers.latency_ms()[name], arrays.latency_ms()[name]
        assert got is not None and want is not None
        assert got["mean"] == pytest.approx(want["mean"], rel=1e-12), name


@pytest.mark.parametrize("coverage", [1.0, 0.6])
def test_the_variance_of_a_steps_tokens_is_the_draws_own(coverage: float) -> None:
    """``_variance`` against the variance of a million drawn steps (and its rows, a request's
    schedule each, against each schedule alone)."""
    rates = minimum_variance_rates(2.7, 5)
    draws = _Draws(5, rates, coverage, np.random.default_rng(11))
    accepted, _ = draws._draw(1_000_000)
    tokens = 1 + accepted
    assert float(draws.variance) == pytest.approx(float(tokens.var()), rel=0.01)
    assert draws.mean_tokens == pytest.approx(float(tokens.mean()), rel=0.002)
    other = _cdf(minimum_variance_rates(4.1, 5), 5)
    rows = _variance(np.stack([_cdf(rates, 5), other]), coverage)
    assert rows.tolist() == pytest.approx(
        [float(draws.variance), float(_variance(other, coverage))]
    )


def test_a_request_drawn_short_is_extended_to_its_length() -> None:
    """With the margin taken away (a variance of 0: a quarter of the 3,000-token requests
    draw too few steps), each request still emits exactly its output past the prefill over
    its own steps (its context counts only its own tokens), and the statistics count exactly
    the steps it takes."""
    draws = _Draws(4, minimum_variance_rates(3.0, 4), 0.7, np.random.default_rng(5))
    draws.variance = np.float64(0.0)
    outputs = np.array([1, 2, 50, 400, *[3000] * 20])
    lengths, steps, drafted = [], 0, 0
    for emitted, context, drafting, accepted in draws.trajectories(np.full(24, 100), outputs):
        assert context.tolist() == (100 + np.cumsum([1, *emitted[:-1]]) + 4 * drafting).tolist()
        assert (emitted[:-1] == 1 + accepted[:-1]).all()
        lengths.append(int(emitted.sum()))
        steps, drafted = steps + emitted.size, drafted + int(drafting.sum())
    assert lengths == (outputs - 1).tolist()
    assert (draws.request_steps, draws.drafting_steps) == (steps, drafted)
    assert int(draws.histogram.sum()) == drafted
