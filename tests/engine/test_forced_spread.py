"""Forced acceptance with a spread between requests, end to end on the engine (sim executor, so
no forward runs): each request realizes its own AL, drawn from the stated quantiles under the
request measure, and the pooled AL still hits the target; without a spread every request
realizes the one schedule's AL.

Statistics (fixed seeds, so every outcome is deterministic; each band is stated with the chance
that a correct engine would leave it):

- a request's realized AL is 1 + the mean of its accepted counts over its n verify steps; under
  its own schedule that mean has variance v / n, v the accepted count's variance
  (``accepted_count_distribution``). ``dispersion`` = sum (realized - expected)^2 / sum (v / n)
  is about 1, with SD about sqrt(2 / N) = 0.07 over N = 400 requests: [0.75, 1.3] is over 3.5 SD;
- requests as units: the count of requests whose realized AL falls in each segment between
  neighbouring fitted quantiles, against ``RequestDraw.request_probabilities()``: chi-square with 7
  degrees of freedom, refused above 24.3 (p = 0.001);
- the pooled AL (tokens over verify steps) with its cluster-robust SE (requests as clusters, the
  ratio estimator's linearisation): within 4 SE of the target (p = 6e-5).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

import pytest

from speclens.acceptance import AcceptanceSpread, accepted_count_distribution
from speclens.acceptance.spread import LEVEL_NAMES, weighted_quantiles
from speclens.engine import ConfigError, Engine, EngineConfig, SamplingParams, SpeculativeConfig
from speclens.engine.config import StepCost

K = 7
AL = 3.8
QUANTILES = [1.6, 1.9, 2.2, 2.9, 3.8, 4.6, 5.4, 5.9, 6.8]  # implied mean 3.81, within 0.05 of AL
NUM_REQUESTS = 400
MAX_TOKENS = 256
CHI2_7DOF_P001 = 24.32
K5 = [1.5, 1.8, 2.0, 2.4, 2.9, 3.4, 3.9, 4.3, 5.0]


def spread(quantiles: list[float] = QUANTILES, k: int = K, **extra: object) -> AcceptanceSpread:
    return AcceptanceSpread.model_validate(
        {"num_spec_tokens": k, "quantiles": dict(zip(LEVEL_NAMES, quantiles, strict=True)),
         "requests": 200, **extra}
    )  # fmt: skip


@dataclass
class Run:
    engine: Engine
    realized: list[float]  # each request's AL (tokens per verify step)
    steps: list[int]  # its verify steps
    accepted: list[int]  # its accepted drafts
    keys: list[str]
    most_cached: int  # the most request rates cached at once


def run(with_spread: bool, seed: int = 5) -> Run:
    spec = SpeculativeConfig(
        method="draft_model", num_speculative_tokens=K, acceptance_length=AL, seed=seed,
        acceptance_spread=spread() if with_spread else None,
    )  # fmt: skip
    engine = Engine(
        EngineConfig(
            speculative=spec, executor="sim", kv_cache_tokens=1 << 20, max_model_len=1024,
            max_num_batched_tokens=8192, max_num_seqs=128, detokenize=False,
            step_cost=StepCost(base=1e-3),
        )
    )  # fmt: skip
    keys = [str(i) for i in range(NUM_REQUESTS)]
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    for key in keys:
        engine.add_request([1, 2, 3], params, request_id=key)
    finished, most = {}, 0
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.outputs[0].acceptance
        assert engine.synthetic is not None
        most = max(most, engine.synthetic.num_cached)
    acc = [finished[key] for key in keys]
    return Run(
        engine,
        [a.mean_acceptance_length for a in acc],
        [a.num_spec_steps for a in acc],
        [a.num_accepted_tokens for a in acc],
        keys,
        most,
    )


@pytest.fixture(scope="module")
def spread_run() -> Run:
    return run(with_spread=True)


@pytest.fixture(scope="module")
def plain_run() -> Run:
    return run(with_spread=False)


def dispersion(r: Run, expected: list[float]) -> float:
    """sum (realized - expected)^2 over sum of the realized AL's variance under each request's
    own schedule (about 1 when each request realizes its own ``expected``)."""
    assert r.engine.synthetic is not None
    num = den = 0.0
    for key, real, n, want in zip(r.keys, r.realized, r.steps, expected, strict=True):
        dist = accepted_count_distribution(r.engine.synthetic.request_rates(key))
        mean = sum(j * p for j, p in dist.items())
        var = sum(j * j * p for j, p in dist.items()) - mean**2
        num += (real - want) ** 2
        den += var / n
    return num / den


def pooled_and_se(r: Run) -> tuple[float, float]:
    """Pooled AL (tokens per verify step) and its cluster-robust SE, requests as clusters."""
    tokens = [a + n for a, n in zip(r.accepted, r.steps, strict=True)]
    total = sum(r.steps)
    pooled = sum(tokens) / total
    n = len(tokens)
    residual = sum((t - pooled * s) ** 2 for t, s in zip(tokens, r.steps, strict=True))
    return pooled, math.sqrt(n / (n - 1) * residual) / total


def test_each_request_realizes_its_own_drawn_al(spread_run: Run) -> None:
    synthetic = spread_run.engine.synthetic
    assert synthetic is not None and synthetic.spread is not None
    drawn = [synthetic.request_al(key) for key in spread_run.keys]
    assert 0.75 <= dispersion(spread_run, drawn) <= 1.3
    # and the draws do spread: against the one AL the same statistic is far from 1
    assert dispersion(spread_run, [AL] * NUM_REQUESTS) > 50


def test_realized_als_follow_the_stated_quantiles_requests_as_units(spread_run: Run) -> None:
    synthetic = spread_run.engine.synthetic
    assert synthetic is not None and synthetic.spread is not None
    draw = synthetic.spread
    inner = draw.knots[1:-1]
    counts = [0] * len(draw.segments)
    for real in spread_run.realized:
        counts[bisect_right(inner, real)] += 1
    expected = [NUM_REQUESTS * p for p in draw.request_probabilities()]
    assert min(expected) >= 5  # the chi-square approximation holds
    chi2 = sum((c - e) ** 2 / e for c, e in zip(counts, expected, strict=True))
    assert chi2 < CHI2_7DOF_P001, (counts, [round(e, 1) for e in expected])
    # the step-weighted quantiles land near the fitted ones (median within 0.15)
    got = weighted_quantiles(spread_run.realized, spread_run.steps)
    assert abs(got[4] - draw.knots[4]) < 0.15, (got, draw.knots)


def test_the_pooled_al_still_hits_the_target(spread_run: Run) -> None:
    pooled, se = pooled_and_se(spread_run)
    assert pooled == pytest.approx(spread_run.engine.stats.acceptance_length, abs=1e-12)
    assert 0.03 < se < 0.15  # the spread between requests, not steps, sets the SE
    assert abs(pooled - AL) <= 4 * se, (pooled, se)


def test_without_a_spread_every_request_realizes_the_same_al(plain_run: Run) -> None:
    assert 0.75 <= dispersion(plain_run, [AL] * NUM_REQUESTS) <= 1.3
    pooled, se = pooled_and_se(plain_run)
    assert abs(pooled - AL) <= 4 * se


def test_a_request_s_rates_are_cached_while_it_runs_and_dropped_when_it_ends(
    spread_run: Run,
) -> None:
    synthetic = spread_run.engine.synthetic
    assert synthetic is not None
    assert 0 < spread_run.most_cached <= 128  # at most the running batch (max_num_seqs)
    assert synthetic.num_cached == 0


def test_an_aborted_request_s_rates_are_dropped() -> None:
    spec = SpeculativeConfig(method="draft_model", num_speculative_tokens=K, acceptance_length=AL,
                             acceptance_spread=spread())  # fmt: skip
    engine = Engine(EngineConfig(speculative=spec, executor="sim", max_model_len=512,
                                 detokenize=False))  # fmt: skip
    engine.add_request([1, 2], SamplingParams(max_tokens=200, ignore_eos=True), request_id="a")
    for _ in range(3):
        engine.step()
    assert engine.synthetic is not None and engine.synthetic.num_cached == 1
    engine.abort("a")
    assert engine.synthetic.num_cached == 0


# ------------------------------------------------------------------------- configuration
def forced(**extra: object) -> SpeculativeConfig:
    return SpeculativeConfig(method="draft_model", num_speculative_tokens=K, **extra)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"acceptance_spread": spread()}, "acceptance_spread (--spec-decode-acceptance-spread): "
         "expected forced acceptance"),
        ({"acceptance_length": AL, "acceptance_spread": spread(K5, k=5)},
         "acceptance_spread.num_spec_tokens: is 5, but num_speculative_tokens is 7"),
        ({"acceptance_length": 3.0, "acceptance_spread": spread()},
         "acceptance_spread.quantiles: imply a mean AL of 3.8100, 0.8100 from the stated "
         "acceptance_length 3"),
        ({"acceptance_length": AL, "acceptance_spread": {"quantiles": {}}},
         "acceptance_spread: expected an AcceptanceSpread"),
    ],
    ids=["not-forced", "other-k", "mean-off", "not-a-spread"],
)  # fmt: skip
def test_a_spread_the_forced_al_cannot_take_is_refused_in_one_line(
    extra: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        forced(**extra)
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


def test_a_spread_within_its_tolerance_and_the_rates_it_spreads() -> None:
    widened = forced(acceptance_length=3.7, acceptance_spread=spread(tolerance=0.2))
    assert widened.acceptance_spread is not None and widened.rates_derived
    stated = forced(acceptance_rates=[0.9, 0.8, 0.6, 0.3, 0.1, 0.0, 0.0],
                    acceptance_spread=spread(tolerance=0.2))  # fmt: skip
    assert not stated.rates_derived  # each request keeps the stated shape
    same = forced(acceptance_rates=[1.0, 1.0, 0.8, 0.0, 0.0, 0.0, 0.0])
    assert same.rates_derived  # the minimum-variance schedule, stated
    line = widened.log_line()
    assert line is not None and "Each request draws its own AL from a spread over 200" in line
