"""Draft coverage: the share of decode steps that drafted, counted by the engine.

A decode step is a target forward for a request after its prefill; the n-gram drafter often finds
no match, so some decode steps draft nothing. AL counts only the steps that drafted (vLLM's
convention); coverage is what it leaves out. Each count here is checked against one made
independently: the drafter's own proposals, and the engine's step log.
"""

from __future__ import annotations

import pytest

from enginekit import config
from speclens.engine import Engine, SamplingParams, SpeculativeConfig
from speclens.engine.request import Request, RequestOutput

K = 4
MAX_TOKENS = 40
#: One prompt rich in repeats (the lookup often matches), one with no repeated bigram at all
#: (nothing matches until the output itself repeats), one in between.
PROMPTS = [
    [65, 66, 67, 68] * 6,
    list(range(70, 94)),
    [65, 66, 67, 68, 69, *range(100, 115), 65, 66, 67],
]


Run = tuple[Engine, list[RequestOutput], dict[str, list[int]]]


@pytest.fixture(scope="module")
def ngram_run() -> Run:
    """A greedy n-gram run; records, per request (parent id), the drafts proposed at each decode
    step (the drafter runs once per decode step, for every request in the batch)."""
    spec = SpeculativeConfig(num_speculative_tokens=K, method="ngram", ngram_min=2, ngram_max=3)
    engine = Engine(config(spec, max_model_len=256))
    drafter = engine.drafter
    assert drafter is not None
    proposed: dict[str, list[int]] = {}
    original = drafter.propose

    def recording(requests: list[Request], want_probs: bool, device: object):  # type: ignore[no-untyped-def]
        proposal = original(requests, want_probs, device)  # type: ignore[arg-type]
        for r, n in zip(requests, proposal.num_tokens.tolist(), strict=True):
            proposed.setdefault(r.parent_id, []).append(int(n))
        return proposal

    drafter.propose = recording  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    outs = engine.generate(PROMPTS, params)
    return engine, outs, proposed


def test_request_coverage_is_drafted_steps_over_decode_steps(ngram_run: Run) -> None:
    _, outs, proposed = ngram_run
    assert len(proposed) == len(outs) == len(PROMPTS)
    for out in outs:
        drafts = proposed[out.request_id]
        acc = out.outputs[0].acceptance
        assert acc.num_decode_steps == len(drafts)
        assert acc.num_spec_steps == sum(1 for n in drafts if n > 0)
        assert acc.per_step_drafted == [n for n in drafts if n > 0]
        assert acc.draft_coverage == acc.num_spec_steps / len(drafts)
        # Every decode step emits its accepted drafts plus one token, the prefill one more; only
        # the last step can be cut at max_tokens (by at most its accepted drafts).
        emitted = 1 + acc.num_decode_steps + acc.num_accepted_tokens
        assert emitted - K <= len(out.outputs[0].token_ids) == MAX_TOKENS <= emitted
    coverages = [out.outputs[0].acceptance.draft_coverage for out in outs]
    assert min(coverages) < 1.0 and max(coverages) > 0.0, coverages  # both kinds of step ran


def test_engine_totals_match_the_step_log(ngram_run: Run) -> None:
    engine, outs, _ = ngram_run
    stats = engine.stats
    decode_steps = sum(s.num_requests for s in engine.steps if s.kind == "decode")
    assert stats.num_decode_steps == decode_steps
    accs = [out.outputs[0].acceptance for out in outs]
    assert decode_steps == sum(a.num_decode_steps for a in accs)
    assert stats.num_drafts == sum(a.num_spec_steps for a in accs)
    assert stats.draft_coverage == stats.num_drafts / decode_steps
    assert stats.mtp_stats()["draft_coverage"] == stats.draft_coverage
    assert 0.0 < stats.draft_coverage < 1.0


def test_no_speculation_counts_decode_steps_with_zero_coverage() -> None:
    engine = Engine(config(max_model_len=128))
    (out,) = engine.generate([[65, 66, 67]], SamplingParams(max_tokens=6, ignore_eos=True))
    acc = out.outputs[0].acceptance
    assert acc.num_decode_steps == 5  # the prefill gave the first of 6 tokens
    assert acc.num_spec_steps == 0 and acc.draft_coverage == 0.0
    assert engine.stats.num_decode_steps == 5 and engine.stats.draft_coverage == 0.0


def test_coverage_is_none_before_a_decode_step() -> None:
    engine = Engine(config(max_model_len=128))
    (out,) = engine.generate([[65, 66, 67]], SamplingParams(max_tokens=1))
    assert out.outputs[0].acceptance.num_decode_steps == 0
    assert out.outputs[0].acceptance.draft_coverage is None
    assert engine.stats.draft_coverage is None
