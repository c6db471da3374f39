"""The n-gram (prompt-lookup) drafter follows vLLM 0.32.0's rule exactly.

Upstream: ``vllm/v1/spec_decode/ngram_proposer.py`` (``NgramProposer.propose``,
``batch_propose_numba``, ``_find_longest_matched_ngram_and_propose_tokens``), called from
``vllm/v1/worker/gpu_model_runner.py`` (``propose_draft_token_ids``, after ``_bookkeeping_sync``
has appended the step's sampled tokens to ``token_ids_cpu``), with the step trimmed by
``vllm/v1/core/sched/scheduler.py`` (``schedule``: the step's positions stay inside
``max_model_len``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from enginekit import config
from speclens.engine import Engine, SamplingParams, SpeculativeConfig
from speclens.engine.drafters import NgramDrafter
from speclens.engine.request import Request


def vllm_find_longest_matched_ngram_and_propose_tokens(
    origin_tokens: np.ndarray, min_ngram: int, max_ngram: int, max_model_len: int, k: int
) -> np.ndarray:
    """A literal transcription (numba decorator dropped) of vLLM 0.32.0's
    ``_find_longest_matched_ngram_and_propose_tokens`` in ``vllm/v1/spec_decode/ngram_proposer.py``
    (Apache-2.0, copyright the vLLM contributors): KMP over the reversed context."""
    total_token = origin_tokens.shape[0]
    if total_token < min_ngram:
        return np.empty((0,), dtype=origin_tokens.dtype)
    k = min(k, max_model_len - total_token)
    if k <= 0:
        return np.empty((0,), dtype=origin_tokens.dtype)
    tokens = origin_tokens[::-1]
    lps = np.zeros(max_ngram, dtype=np.int32)
    longest_ngram = 0
    position = 0
    prev_lps = 0
    i = 1
    while i < total_token:
        if tokens[prev_lps] == tokens[i]:
            prev_lps += 1
            if prev_lps >= longest_ngram:
                longest_ngram = prev_lps
                position = i
            if i < max_ngram:
                lps[i] = prev_lps
            if prev_lps == max_ngram:
                prev_lps = lps[max_ngram - 1]
            i += 1
        elif prev_lps != 0:
            prev_lps = lps[prev_lps - 1]
        else:
            i += 1
    if longest_ngram < min_ngram:
        return np.empty((0,), dtype=origin_tokens.dtype)
    start_position = total_token - 1 - position + longest_ngram
    k = min(k, total_token - start_position)
    return origin_tokens[start_position : start_position + k]


def lookup(tokens: list[int], lo: int, hi: int, k: int, max_model_len: int | None = None):
    return NgramDrafter(k, 100, ngram_max=hi, ngram_min=lo, max_model_len=max_model_len).lookup(
        tokens
    )


def test_longest_n_wins_over_a_later_shorter_match() -> None:
    """``_find_longest_matched_ngram_and_propose_tokens``: the longest n-gram in [min, max] is
    chosen, even when a shorter suffix matches later (closer to the end)."""
    tokens = [1, 2, 3, 7, 9, 3, 8, 1, 2, 3]
    #         ^^^^^^^ 3-gram, then 7        ^ 1-gram "3" also at 5 (then 8)
    assert lookup(tokens, 1, 3, 1) == [7]
    assert lookup(tokens, 1, 1, 1) == [7]  # 1-gram "3": earliest occurrence (index 2) wins


def test_earliest_occurrence_wins() -> None:
    """``_find_longest_matched_ngram_and_propose_tokens`` updates ``position`` on ``>=``, walking
    the reversed context: among equally long matches the earliest in the context wins."""
    tokens = [1, 2, 9, 4, 1, 2, 8, 5, 1, 2]
    assert lookup(tokens, 2, 2, 1) == [9]
    assert lookup(tokens, 2, 2, 3) == [9, 4, 1]


def test_the_cap_at_max_n_can_move_the_match_earlier() -> None:
    """``_find_longest_matched_ngram_and_propose_tokens``: match lengths are capped at
    ``max_ngram``, so a 4-gram match at index 4 ties with an earlier 3-gram one when max is 3."""
    tokens = [1, 2, 3, 7, 0, 1, 2, 3, 8, 0, 1, 2, 3]
    assert lookup(tokens, 1, 3, 1) == [7]
    assert lookup(tokens, 1, 4, 1) == [8]


def test_short_continuation_proposes_fewer_than_k() -> None:
    """``_find_longest_matched_ngram_and_propose_tokens``: ``k = min(k, total_token -
    start_position)``: a match near the end proposes only what follows it, which may run into
    the suffix itself."""
    assert lookup([5, 6, 7, 5, 6], 2, 2, 4) == [7, 5, 6]
    assert lookup([3, 3, 3], 1, 2, 4) == [3]  # overlapping occurrence at 0, one token after it


def test_no_draft_when_context_is_shorter_than_min_or_unmatched() -> None:
    """``_find_longest_matched_ngram_and_propose_tokens``: nothing when ``total_token <
    min_ngram`` or when no n-gram of at least ``min_ngram`` matches."""
    assert lookup([1, 2], 3, 4, 4) == []
    assert lookup([1, 2, 3], 3, 4, 4) == []  # the whole context has no earlier occurrence
    assert lookup([1, 2, 3, 4, 1], 2, 4, 4) == []  # only a 1-gram matches
    assert lookup([1, 2, 3, 4, 1], 1, 4, 4) == [2, 3, 4, 1]
    assert lookup([7], 1, 4, 4) == []


def test_proposer_cap_at_max_model_len() -> None:
    """``_find_longest_matched_ngram_and_propose_tokens``: ``k = min(k, max_model_len -
    total_token)``, nothing when that is not positive."""
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    assert lookup(tokens, 2, 2, 4, max_model_len=10) == [3, 4]
    assert lookup(tokens, 2, 2, 4, max_model_len=8) == []


def _request(tokens: list[int], prompt_len: int) -> Request:
    return Request(
        "r",
        tokens[:prompt_len],
        SamplingParams(max_tokens=4, temperature=0.0),
        output_token_ids=tokens[prompt_len:],
    )


@pytest.mark.parametrize("fill", [False, True])
def test_scheduler_trims_one_more_near_max_model_len(fill: bool) -> None:
    """``scheduler.py`` ``schedule``: ``num_new_tokens <= max_model_len - num_computed_tokens -
    1``, so a step verifies at most ``max_model_len - 1 - len(context)`` drafts, even under forced
    acceptance's fill. The drafter searches prompt and output together (``token_ids_cpu``)."""
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    drafter = NgramDrafter(4, 100, ngram_max=2, ngram_min=2, fill=fill, max_model_len=11)
    proposal = drafter.propose([_request(tokens, 7)], False, torch.device("cpu"))
    assert proposal.num_tokens.tolist() == [2]
    assert proposal.token_ids[0, :2].tolist() == [3, 4]
    far = NgramDrafter(4, 100, ngram_max=2, ngram_min=2, fill=fill, max_model_len=100)
    proposal = far.propose([_request(tokens, 3)], False, torch.device("cpu"))
    assert proposal.num_tokens.tolist() == [4]
    assert proposal.token_ids[0].tolist() == [3, 4, 5, 6]


def test_fill_repeats_the_last_draft_up_to_k() -> None:
    """speclens's forced acceptance (DESIGN.md): a short lookup is filled up to K with its last
    token, no lookup with the context's last token; without fill the short lookup stands."""
    short = [5, 6, 7, 5, 6]
    for fill, want in ((True, [7, 5, 6, 6]), (False, [7, 5, 6])):
        drafter = NgramDrafter(4, 100, ngram_max=2, ngram_min=2, fill=fill)
        proposal = drafter.propose([_request(short, 2)], False, torch.device("cpu"))
        assert proposal.token_ids[0, : len(want)].tolist() == want
        assert proposal.num_tokens.tolist() == [len(want)]
    drafter = NgramDrafter(3, 100, ngram_max=2, ngram_min=2, fill=True)
    proposal = drafter.propose([_request([1, 2, 3], 3)], False, torch.device("cpu"))
    assert proposal.token_ids[0].tolist() == [3, 3, 3]


@pytest.mark.parametrize(
    ("lo", "hi", "k", "vocab"),
    [
        (1, 1, 1, 2),
        (1, 3, 4, 3),
        (2, 4, 4, 3),
        (2, 4, 4, 8),
        (3, 5, 2, 2),
        (1, 6, 7, 4),
        (4, 4, 3, 2),
    ],
)
def test_matches_vllm_reference_on_random_sequences(lo: int, hi: int, k: int, vocab: int) -> None:
    """speclens's lookup equals the transcription of vLLM's KMP proposer on 3,000 random
    contexts per setting (small vocabularies so matches of every length are common), with and
    without a ``max_model_len`` that binds."""
    rng = np.random.default_rng(1000 * lo + 100 * hi + 10 * k + vocab)
    matched = 0
    for _ in range(3000):
        tokens = rng.integers(0, vocab, size=int(rng.integers(1, 48))).tolist()
        max_model_len = len(tokens) + int(rng.integers(0, k + 2))
        for limit in (None, max_model_len):
            want = vllm_find_longest_matched_ngram_and_propose_tokens(
                np.asarray(tokens, dtype=np.int32), lo, hi, limit or 1 << 30, k
            ).tolist()
            assert lookup(tokens, lo, hi, k, limit) == want, (tokens, limit)
            matched += bool(want)
    assert matched > 1000  # the comparison exercised real matches, not only empty proposals


def test_engine_drafts_right_after_prefill_from_prompt_and_output() -> None:
    """``gpu_model_runner.py``: the proposer runs after every step that sampled a token, the
    prefill included, over ``token_ids_cpu[:num_tokens_no_spec]`` (prompt + output so far). The
    engine's drafts, step by step, are the reference's on that context."""
    spec = SpeculativeConfig(num_speculative_tokens=4, method="ngram", ngram_min=2, ngram_max=4)
    engine = Engine(config(spec, max_model_len=64))
    drafter = engine.drafter
    assert isinstance(drafter, NgramDrafter)
    seen: list[tuple[list[int], list[int]]] = []
    original = drafter.propose

    def recording(requests, want_probs, device):  # type: ignore[no-untyped-def]
        proposal = original(requests, want_probs, device)
        (r,) = requests
        count = int(proposal.num_tokens[0])
        seen.append(
            (r.prompt_token_ids + r.output_token_ids, proposal.token_ids[0, :count].tolist())
        )
        return proposal

    drafter.propose = recording  # type: ignore[method-assign]
    prompt = [65, 66, 67, 68] * 8  # 32 tokens; 32 more reach max_model_len exactly
    (out,) = engine.generate([prompt], SamplingParams(max_tokens=32, temperature=0.0))
    assert seen[0][0] == prompt + out.outputs[0].token_ids[:1]
    for context, drafts in seen:
        full = vllm_find_longest_matched_ngram_and_propose_tokens(
            np.asarray(context, dtype=np.int32), 2, 4, 64, 4
        ).tolist()
        assert drafts == full[: max(0, 64 - 1 - len(context))]
    assert out.outputs[0].acceptance.num_spec_steps == sum(1 for _, d in seen if d)


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ({}, (5, 5)),
        ({"prompt_lookup_max": 4}, (4, 4)),
        ({"prompt_lookup_min": 2}, (2, 2)),
        ({"prompt_lookup_min": 2, "prompt_lookup_max": 4}, (2, 4)),
    ],
)
def test_serve_defaults_are_vllms(given: dict[str, int], want: tuple[int, int]) -> None:
    """``vllm/config/speculative.py`` (``SpeculativeConfig.__post_init__``, method ngram):
    neither length given, 5 and 5; one given, it sets the other. ``speclens serve
    --speculative-config`` reads the same keys the same way."""
    from speclens.cli.serve import _prompt_lookup

    config = SpeculativeConfig(method="ngram", num_speculative_tokens=4)
    assert _prompt_lookup(given, (config.ngram_min, config.ngram_max)) == want


def test_the_engines_own_defaults_are_vllms() -> None:
    """One default for the library and the server: ``SpeculativeConfig`` and ``NgramDrafter``
    without lookup lengths draft as vLLM does without ``prompt_lookup_min``/``max`` (5 and 5)."""
    config = SpeculativeConfig(method="ngram", num_speculative_tokens=4)
    assert (config.ngram_min, config.ngram_max) == (5, 5)
    drafter = NgramDrafter(4, 100)
    assert (drafter.ngram_min, drafter.ngram_max) == (5, 5)
