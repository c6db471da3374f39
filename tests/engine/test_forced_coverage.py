"""Forced draft coverage (``SpeculativeConfig.draft_coverage``, ``serve
--spec-decode-draft-coverage``): a request-step keeps its drafts with probability coverage, so
tokens per decode step are 1 + coverage x (AL - 1), as under natural n-gram drafting; with a
spread the pooled AL still hits the target, its request measure weighed at that coverage.

Real forward passes on the embedded dummy target and drafter. Bands: the realized coverage is a
share of N request-steps, within 4 binomial SEs of the target (p = 6e-5); the pooled AL within 4
cluster-robust SEs, requests as clusters."""

from __future__ import annotations

import math

import pytest

from speclens.acceptance import AcceptanceSpread
from speclens.acceptance.spread import LEVEL_NAMES
from speclens.engine import ConfigError, Engine, EngineConfig, SamplingParams, SpeculativeConfig

K, AL, COVERAGE = 4, 3.0, 0.35
QUANTILES = [1.4, 1.7, 1.9, 2.4, 3.0, 3.6, 4.1, 4.4, 5.0]  # implied mean 3.0075
REQUESTS, MAX_TOKENS = 32, 64


def _spread() -> AcceptanceSpread:
    return AcceptanceSpread.model_validate(
        {"num_spec_tokens": K, "quantiles": dict(zip(LEVEL_NAMES, QUANTILES, strict=True)),
         "requests": 100}
    )  # fmt: skip


def _run(coverage: float, spread: AcceptanceSpread | None = None, seed: int = 3) -> list:
    spec = SpeculativeConfig(
        method="draft_model", num_speculative_tokens=K, acceptance_length=AL, seed=seed,
        acceptance_spread=spread, draft_coverage=coverage, spread_coverage=coverage,
    )  # fmt: skip
    engine = Engine(EngineConfig(speculative=spec, max_num_seqs=REQUESTS, max_model_len=512,
                                 detokenize=False))  # fmt: skip
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    for i in range(REQUESTS):
        engine.add_request([1, 2, 3, 4 + i], params, request_id=f"r{i}")
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].acceptance
    return [done[f"r{i}"] for i in range(REQUESTS)]


def _pooled(acc: list) -> tuple[float, float]:
    steps = [a.num_spec_steps for a in acc]
    tokens = [a.num_accepted_tokens + s for a, s in zip(acc, steps, strict=True)]
    pooled = sum(tokens) / sum(steps)
    n = len(acc)
    residual = sum((t - pooled * s) ** 2 for t, s in zip(tokens, steps, strict=True))
    return pooled, math.sqrt(n / (n - 1) * residual) / sum(steps)


@pytest.fixture(scope="module")
def covered() -> list:
    return _run(COVERAGE)


def test_a_share_coverage_of_request_steps_drafts(covered: list) -> None:
    decode = sum(a.num_decode_steps for a in covered)
    drafting = sum(a.num_spec_steps for a in covered)
    se = math.sqrt(COVERAGE * (1 - COVERAGE) / decode)
    assert abs(drafting / decode - COVERAGE) < 4 * se


def test_the_steps_that_draft_still_hit_the_forced_al(covered: list) -> None:
    pooled, se = _pooled(covered)
    assert abs(pooled - AL) < 4 * se + 1e-9


def test_with_a_spread_the_pooled_al_hits_the_target_at_that_coverage() -> None:
    pooled, se = _pooled(_run(COVERAGE, _spread(), seed=7))
    assert abs(pooled - AL) < 4 * se


def test_full_coverage_drafts_every_step() -> None:
    acc = _run(1.0)
    assert all(a.num_decode_steps == a.num_spec_steps for a in acc)


@pytest.mark.parametrize(
    ("coverage", "forced", "words"),
    [(0.0, True, "expected a number in (0, 1]"), (1.5, True, "expected a number in (0, 1]"),
     (0.5, False, "expected forced acceptance")],
)  # fmt: skip
def test_a_coverage_outside_its_range_or_without_forcing_is_refused(
    coverage: float, forced: bool, words: str
) -> None:
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace("]", r"\]")):
        SpeculativeConfig(method="draft_model", num_speculative_tokens=K,
                          acceptance_length=AL if forced else None, draft_coverage=coverage)  # fmt: skip
