"""The correctness test every speculative engine owes: at temperature 0, speculative decoding emits
exactly the target's own greedy tokens, whatever the drafter proposes and however many of its
drafts are accepted. Also under preemption (recompute) with a deliberately small KV cache."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from enginekit import config
from speclens.engine import Engine, SamplingParams, SpeculativeConfig
from speclens.engine.request import Request

MAX_TOKENS = 40
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)

#: Strings and token-id lists of different lengths; repetitive ones so n-gram drafts are accepted.
PROMPTS: list[str | list[int]] = [
    "Hello world",
    "abcabcabcabcabcabc",
    list(range(1, 13)),
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    [65, 66, 67] * 6,
    "x",
]
REPETITIVE = 1  # index of "abcabc..."

#: Drafters: the embedded draft model, a layer subset of the target, prompt lookup, and the draft
#: model with the confidence schedule (variable draft lengths). The thresholds sit inside the
#: dummy drafters' range of top-1 probabilities (their seeded weights give near-uniform
#: distributions over 320 ids, top-1 around 0.005-0.008), so some steps draft all K tokens and
#: others stop early.
DRAFTERS = {
    "dummy-draft": {"method": "draft_model"},
    "layers:2": {"method": "draft_model", "draft_model": "layers:2"},
    "ngram": {"method": "ngram"},
    "confidence": {
        "method": "draft_model",
        "confidence_schedule": True,
        "confidence_threshold": 0.006,
    },
    "confidence-layers:2": {
        "method": "draft_model",
        "draft_model": "layers:2",
        "confidence_schedule": True,
        "confidence_threshold": 0.007,
    },
}


def token_ids(engine: Engine, prompts: Sequence[str | Sequence[int]], params=GREEDY) -> list:
    return [out.outputs[0].token_ids for out in engine.generate(prompts, params)]


@pytest.fixture(scope="module")
def plain_greedy() -> list[list[int]]:
    """Plain greedy decoding of the target (no speculation), the whole batch at once."""
    engine = Engine(config())
    outs = engine.generate(PROMPTS, GREEDY)
    assert engine.stats.num_drafts == 0
    for out in outs:
        assert out.outputs[0].finish_reason == "length"
        assert len(out.outputs[0].token_ids) == MAX_TOKENS
    return [out.outputs[0].token_ids for out in outs]


def test_plain_greedy_is_batch_invariant(plain_greedy: list[list[int]]) -> None:
    """The reference itself: each prompt decoded alone gives the batched result."""
    engine = Engine(config())
    for prompt, expected in zip(PROMPTS, plain_greedy, strict=True):
        assert token_ids(engine, [prompt]) == [expected]


@pytest.mark.parametrize("k", [1, 3, 7])
@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_speculative_greedy_equals_plain_greedy(
    plain_greedy: list[list[int]], drafter: str, k: int
) -> None:
    engine = Engine(config(SpeculativeConfig(num_speculative_tokens=k, **DRAFTERS[drafter])))
    outs = engine.generate(PROMPTS, GREEDY)
    for prompt, out, expected in zip(PROMPTS, outs, plain_greedy, strict=True):
        completion = out.outputs[0]
        assert completion.token_ids == expected, f"prompt {prompt!r} diverged"
        assert completion.finish_reason == "length"
    stats = engine.stats
    assert stats.num_drafts > 0, "no speculation happened"
    assert stats.histogram.max_accepted <= k
    drafted = [d for out in outs for d in out.outputs[0].acceptance.per_step_drafted]
    assert all(1 <= d <= k for d in drafted)
    if drafter == "ngram":
        assert stats.num_accepted_tokens > 0
        assert outs[REPETITIVE].outputs[0].acceptance.num_accepted_tokens > 0
    if drafter.startswith("confidence") and k > 1:
        # the confidence schedule made draft lengths vary
        assert len(set(drafted)) > 1
        assert stats.num_draft_tokens < k * stats.num_drafts
    if drafter in ("dummy-draft", "layers:2"):
        assert drafted == [k] * len(drafted)
    if drafter == "layers:2":
        assert stats.num_accepted_tokens > 0


def test_greedy_request_in_a_sampled_batch_stays_greedy(plain_greedy: list[list[int]]) -> None:
    """A batch mixing greedy and temperature > 0 requests runs the probabilistic sampler; the
    greedy rows still emit exactly the target's greedy tokens."""
    engine = Engine(
        config(
            SpeculativeConfig(
                method="draft_model", draft_model="layers:2", num_speculative_tokens=3
            )
        )
    )
    sampled = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, seed=7)
    params = [GREEDY if i % 2 == 0 else sampled for i in range(len(PROMPTS))]
    outs = engine.generate(PROMPTS, params)
    for i, (out, expected) in enumerate(zip(outs, plain_greedy, strict=True)):
        if i % 2 == 0:
            assert out.outputs[0].token_ids == expected
    assert engine.stats.num_drafts > 0


# --------------------------------------------------------------------------- preemption

PREEMPT_PROMPTS: list[str | list[int]] = [
    "Hello world",
    "abcabcabcabcabcabc",
    list(range(1, 13)),
    "The quick brown fox jumps",
    "zzzzzzzz",
    "Once upon a time",
]
MAX_MODEL_LEN = 128


@pytest.mark.parametrize("drafter", ["dummy-draft", "ngram", "layers:2"])
def test_preemption_keeps_greedy_output(drafter: str, monkeypatch: pytest.MonkeyPatch) -> None:
    k = 3
    params = [SamplingParams(max_tokens=60, temperature=0.0) for _ in PREEMPT_PROMPTS]
    # One request that grows to max_model_len: the cache must still hold it alone.
    long_prompt = list(range(40, 60))
    prompts = [*PREEMPT_PROMPTS, long_prompt]
    params.append(SamplingParams(max_tokens=MAX_MODEL_LEN - len(long_prompt), temperature=0.0))

    def run(kv_cache_tokens: int) -> tuple[Engine, list, list[Request]]:
        engine = Engine(
            config(
                SpeculativeConfig(num_speculative_tokens=k, **DRAFTERS[drafter]),
                kv_cache_tokens=kv_cache_tokens,
                max_model_len=MAX_MODEL_LEN,
                max_num_batched_tokens=MAX_MODEL_LEN,
            )
        )
        victims: list[Request] = []
        original = engine.scheduler._preempt

        def counting(request: Request) -> None:
            victims.append(request)
            original(request)

        monkeypatch.setattr(engine.scheduler, "_preempt", counting)
        return engine, engine.generate(prompts, params), victims

    _, expected, none = run(131072)
    assert none == []
    # Just above one request's need: max_model_len + K + 1 tokens (rounded up to blocks).
    small, outs, victims = run(MAX_MODEL_LEN + k + 1)
    assert small.blocks.num_blocks * small.blocks.block_size < 2 * MAX_MODEL_LEN
    assert victims, "the small cache never preempted"
    assert any(v.num_preemptions > 0 for v in victims)
    unique = {id(v): v for v in victims}.values()
    assert sum(v.num_preemptions for v in unique) == len(victims)
    for out, ref in zip(outs, expected, strict=True):
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids
        assert out.outputs[0].finish_reason == ref.outputs[0].finish_reason == "length"
    assert len(outs[-1].outputs[0].token_ids) == MAX_MODEL_LEN - len(long_prompt)
    assert small.blocks.num_free == small.blocks.num_blocks
    assert not small.has_unfinished()
    assert small.stats.num_drafts > 0
