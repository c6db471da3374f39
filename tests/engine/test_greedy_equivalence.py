"""The correctness test every speculative engine owes: at temperature 0, speculative decoding emits
exactly the target's own greedy tokens, whatever the drafter proposes and however many of its
drafts are accepted. Every case takes both paths (some drafts accepted, some rejected); a draft
equal to the target accepts every draft, so its AL is exactly K + 1. Also under preemption
(recompute) with a deliberately small KV cache."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import pytest
import torch

from enginekit import config
from speclens.engine import Engine, SamplingParams, SpeculativeConfig
from speclens.engine.model import LlamaModel
from speclens.engine.request import Request
from speclens.engine.weights import load_model, model_config

MAX_TOKENS = 40
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
TARGET_LAYERS = model_config("dummy").num_hidden_layers

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

#: Drafters that agree with the target often but not always, so every case accepts some drafts
#: and rejects others: a separate draft model (the target's weights plus noise, with its own KV
#: pool), a layer subset of the target, prompt lookup, and layer subsets with the confidence
#: schedule (variable draft lengths; the thresholds sit inside the subsets' range of top-1
#: probabilities, near-uniform over 320 ids, so some steps draft all K tokens and others stop
#: early). The unrelated ``dummy-draft`` is not here: its argmax never matched the target's (0 of
#: 1,638 drafts), so it never took the accept path.
DRAFTERS = {
    "perturbed-target": {"method": "draft_model"},
    "layers:2": {"method": "draft_model", "draft_model": "layers:2"},
    "ngram": {"method": "ngram"},
    "confidence-layers:3": {
        "method": "draft_model",
        "draft_model": "layers:3",
        "confidence_schedule": True,
        "confidence_threshold": 0.007,
    },
    "confidence-layers:2": {
        "method": "draft_model",
        "draft_model": "layers:2",
        "confidence_schedule": True,
        "confidence_threshold": 0.007,
    },
}
#: The target itself as the drafter (all its layers): every draft is its own greedy token.
TARGET = {"method": "draft_model", "draft_model": f"layers:{TARGET_LAYERS}"}
SPECS = {**DRAFTERS, "target": TARGET}
#: The noise added to the target's weights (normal(0, 0.02)) for the perturbed draft model: about
#: a third of its greedy drafts are accepted.
NOISE = 0.005


def perturbed_target(seed: int) -> LlamaModel:
    """A separate draft model: the dummy target's weights plus seeded normal(0, NOISE) noise."""
    model, _ = load_model("dummy", seed=seed)
    model = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * NOISE)
    return model


def spec_engine(drafter: str, k: int, **kwargs: object) -> Engine:
    cfg = config(SpeculativeConfig(num_speculative_tokens=k, **SPECS[drafter]), **kwargs)
    draft = perturbed_target(cfg.seed) if drafter == "perturbed-target" else None
    return Engine(cfg, draft=draft)


def verify_steps(max_tokens: int, k: int, num_preemptions: int = 0) -> int:
    """Verify steps of a request whose every draft is accepted, run to ``max_tokens``.

    Its prefill emits one token, and so does every re-prefill after a preemption; each verify
    step emits K + 1, the last one cut at ``max_tokens``. So max_tokens = 1 + P + (K + 1) D - t
    with 0 <= t <= K, which gives D = ceil((max_tokens - 1 - P) / (K + 1)).
    """
    return math.ceil((max_tokens - 1 - num_preemptions) / (k + 1))


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
    engine = spec_engine(drafter, k)
    outs = engine.generate(PROMPTS, GREEDY)
    for prompt, out, expected in zip(PROMPTS, outs, plain_greedy, strict=True):
        completion = out.outputs[0]
        assert completion.token_ids == expected, f"prompt {prompt!r} diverged"
        assert completion.finish_reason == "length"
    stats = engine.stats
    assert stats.num_drafts > 0, "no speculation happened"
    # Both paths: some drafts accepted (emitted as drafts), some rejected (the correction).
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert stats.histogram.max_accepted <= k
    drafted = [d for out in outs for d in out.outputs[0].acceptance.per_step_drafted]
    assert all(1 <= d <= k for d in drafted)
    if drafter == "ngram":
        assert outs[REPETITIVE].outputs[0].acceptance.num_accepted_tokens > 0
    if drafter.startswith("confidence") and k > 1:
        # the confidence schedule made draft lengths vary
        assert len(set(drafted)) > 1
        assert stats.num_draft_tokens < k * stats.num_drafts
    if drafter in ("perturbed-target", "layers:2"):
        assert drafted == [k] * len(drafted)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_draft_equal_to_target_accepts_every_draft(plain_greedy: list[list[int]], k: int) -> None:
    """Drafting with all of the target's layers proposes the target's own greedy tokens, so every
    draft is accepted: each request runs exactly ``verify_steps`` steps of K accepted drafts, and
    AL is exactly K + 1."""
    engine = spec_engine("target", k)
    outs = engine.generate(PROMPTS, GREEDY)
    steps = verify_steps(MAX_TOKENS, k)
    for out, expected in zip(outs, plain_greedy, strict=True):
        completion = out.outputs[0]
        assert completion.token_ids == expected
        assert completion.acceptance.per_step_drafted == [k] * steps
        assert completion.acceptance.per_step_accepted == [k] * steps
    assert engine.stats.histogram.counts == {k: steps * len(PROMPTS)}
    assert engine.stats.histogram.acceptance_length == k + 1


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
#: One request grows to max_model_len: the small cache must still hold it alone.
LONG_PROMPT = list(range(40, 60))
PREEMPT_PARAMS = [SamplingParams(max_tokens=60, temperature=0.0) for _ in PREEMPT_PROMPTS] + [
    SamplingParams(max_tokens=MAX_MODEL_LEN - len(LONG_PROMPT), temperature=0.0)
]


def run_tracked(engine: Engine) -> tuple[list[list[int]], list[Request]]:
    """Generate the preemption batch; return each output and its ``Request`` (for its count of
    preemptions), in prompt order."""
    ids = [
        engine.add_request(p, sp)
        for p, sp in zip([*PREEMPT_PROMPTS, LONG_PROMPT], PREEMPT_PARAMS, strict=True)
    ]
    requests = [r for rid in ids for r in engine._groups[rid]]
    final = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    for rid, sp in zip(ids, PREEMPT_PARAMS, strict=True):
        completion = final[rid].outputs[0]
        assert completion.finish_reason == "length"
        assert len(completion.token_ids) == sp.max_tokens
    return [final[rid].outputs[0].token_ids for rid in ids], requests


def small_cache_engine(drafter: str, k: int) -> Engine:
    """Just above one request's need: max_model_len + K + 1 tokens (rounded up to blocks)."""
    engine = spec_engine(
        drafter,
        k,
        kv_cache_tokens=MAX_MODEL_LEN + k + 1,
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=MAX_MODEL_LEN,
    )
    assert engine.blocks.num_blocks * engine.blocks.block_size < 2 * MAX_MODEL_LEN
    return engine


@pytest.fixture(scope="module")
def preempt_reference() -> list[list[int]]:
    """Plain greedy decoding of the preemption batch in a cache that never preempts."""
    engine = Engine(config(max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=MAX_MODEL_LEN))
    tokens, _ = run_tracked(engine)
    assert engine.scheduler.num_preemptions == 0
    return tokens


def check_preempted(engine: Engine, requests: list[Request]) -> None:
    """Preemption happened, each counted once, and every block came back."""
    assert engine.scheduler.num_preemptions > 0, "the small cache never preempted"
    assert sum(r.num_preemptions for r in requests) == engine.scheduler.num_preemptions
    assert engine.blocks.num_free == engine.blocks.num_blocks
    assert not engine.has_unfinished()


@pytest.mark.parametrize("drafter", ["perturbed-target", "layers:2", "ngram"])
def test_preemption_keeps_greedy_output(preempt_reference: list[list[int]], drafter: str) -> None:
    engine = small_cache_engine(drafter, 3)
    tokens, requests = run_tracked(engine)
    check_preempted(engine, requests)
    assert tokens == preempt_reference
    assert 0 < engine.stats.num_accepted_tokens < engine.stats.num_draft_tokens


@pytest.mark.parametrize("k", [1, 3, 7])
def test_draft_equal_to_target_under_preemption(preempt_reference: list[list[int]], k: int) -> None:
    """Recompute after a preemption rebuilds the drafter's cache too: every draft is still
    accepted. A preempted request's re-prefill emits one token outside any verify step, so its
    verify steps are ``verify_steps(max_tokens, K, its preemptions)``, each accepting K."""
    engine = small_cache_engine("target", k)
    tokens, requests = run_tracked(engine)
    check_preempted(engine, requests)
    assert tokens == preempt_reference
    for request, sp in zip(requests, PREEMPT_PARAMS, strict=True):
        steps = verify_steps(sp.max_tokens, k, request.num_preemptions)
        assert request.acceptance.per_step_accepted == [k] * steps
        assert request.acceptance.per_step_drafted == [k] * steps
    assert engine.stats.histogram.acceptance_length == k + 1
