"""Sampling parameters through the engine, with speculation on where it matters: max_tokens, stop
strings, stop token ids, EOS and ignore_eos, n > 1, seeds, top_k = 1, and the refusals (too long,
empty, duplicate id, bad parameters)."""

from __future__ import annotations

import pytest

from enginekit import config
from speclens.engine import Engine, SamplingError, SamplingParams, SpeculativeConfig

EOS = 257  # the byte tokenizer's EOS id
PROMPT = "Hello world"


def ngram(k: int = 7) -> SpeculativeConfig:
    return SpeculativeConfig(method="ngram", num_speculative_tokens=k)


def layers(k: int = 3) -> SpeculativeConfig:
    return SpeculativeConfig(method="draft_model", draft_model="layers:2", num_speculative_tokens=k)


@pytest.fixture(scope="module")
def plain() -> Engine:
    return Engine(config())


@pytest.fixture(scope="module")
def spec_engine() -> Engine:
    """Prompt lookup with K = 7: long accepted runs, so stops land inside a verify step."""
    return Engine(config(ngram()))


@pytest.fixture(scope="module")
def greedy_reference(plain: Engine) -> list[int]:
    (out,) = plain.generate([PROMPT], SamplingParams(max_tokens=60, temperature=0.0))
    return out.outputs[0].token_ids


def one(engine: Engine, params: SamplingParams, prompt: str | list[int] = PROMPT):
    (out,) = engine.generate([prompt], params)
    return out


# --------------------------------------------------------------------------- max_tokens


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 17, 33])
def test_max_tokens_exact(
    spec_engine: Engine, greedy_reference: list[int], max_tokens: int
) -> None:
    out = one(spec_engine, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    (completion,) = out.outputs
    assert completion.finish_reason == "length"
    assert completion.token_ids == greedy_reference[:max_tokens]
    assert out.finished
    assert out.usage == {
        "prompt_tokens": len(PROMPT),
        "completion_tokens": max_tokens,
        "total_tokens": len(PROMPT) + max_tokens,
    }


# --------------------------------------------------------------------------- stops


def test_stop_string_truncates_text(
    plain: Engine, spec_engine: Engine, greedy_reference: list[int]
) -> None:
    tokenizer = plain.tokenizer
    stop = "}X"
    full = tokenizer.decode(greedy_reference)
    assert stop in full  # precondition: the dummy target's greedy text contains it
    # the token that completes the first occurrence
    j = next(
        i
        for i in range(1, len(greedy_reference) + 1)
        if stop in tokenizer.decode(greedy_reference[:i])
    )
    prefix = tokenizer.decode(greedy_reference[:j])
    expected_text = prefix[: prefix.find(stop)]
    for engine in (plain, spec_engine):
        for stops in ([stop], [stop, "never appears"], ["never appears", stop]):
            params = SamplingParams(max_tokens=60, temperature=0.0, stop=stops)
            (completion,) = one(engine, params).outputs
            assert completion.finish_reason == "stop"
            assert completion.text == expected_text
            assert stop not in completion.text
            assert completion.token_ids == greedy_reference[:j]


def test_stop_string_given_as_a_str(spec_engine: Engine) -> None:
    params = SamplingParams(max_tokens=60, temperature=0.0, stop="}X")
    assert params.stop == ["}X"]
    (completion,) = one(spec_engine, params).outputs
    assert completion.finish_reason == "stop"
    assert "}X" not in completion.text


def test_stop_token_ids(plain: Engine, spec_engine: Engine, greedy_reference: list[int]) -> None:
    stop_token = greedy_reference[3]
    j = greedy_reference.index(stop_token) + 1
    assert 2 < j < 40
    # precondition: the text before the stop token ends on a complete character (a held-back
    # partial character at the end is test_final_text_is_the_decoded_tokens's business)
    assert not plain.tokenizer.decode(greedy_reference[: j - 1]).endswith("\ufffd")
    for engine in (plain, spec_engine):
        params = SamplingParams(max_tokens=60, temperature=0.0, stop_token_ids=[999, stop_token])
        (completion,) = one(engine, params).outputs
        assert completion.finish_reason == "stop"
        # the stop token is the last id (as in vLLM), and its text is not emitted
        assert completion.token_ids == greedy_reference[:j]
        assert completion.text == engine.tokenizer.decode(greedy_reference[: j - 1])


@pytest.fixture(scope="module")
def eos_seed(plain: Engine) -> tuple[int, int]:
    """A seed whose sampled continuation of PROMPT emits EOS early, and where. The dummy target's
    distribution is near uniform over 320 ids, so P(EOS) is about 1/320 per token: a seed stops
    within 100 tokens with probability ~0.27, and one of 24 seeds does with probability > 0.999
    (and the seeds are fixed, so this is deterministic)."""
    params = [SamplingParams(max_tokens=100, temperature=1.0, seed=s) for s in range(24)]
    outs = plain.generate([PROMPT] * len(params), params)
    for seed, out in enumerate(outs):
        completion = out.outputs[0]
        if completion.finish_reason == "stop":
            return seed, len(completion.token_ids)
    raise AssertionError("no seed emitted EOS")


def test_eos_stops_and_ignore_eos_continues(plain: Engine, eos_seed: tuple[int, int]) -> None:
    seed, length = eos_seed
    stopped = one(plain, SamplingParams(max_tokens=100, temperature=1.0, seed=seed)).outputs[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids[-1] == EOS == plain.tokenizer.eos_token_id
    assert EOS not in stopped.token_ids[:-1]
    assert len(stopped.token_ids) == length < 100
    params = SamplingParams(max_tokens=100, temperature=1.0, seed=seed, ignore_eos=True)
    ignored = one(plain, params).outputs[0]
    assert ignored.finish_reason == "length"
    assert len(ignored.token_ids) == 100
    assert ignored.token_ids[:length] == stopped.token_ids


def test_eos_inside_an_accepted_run_stops_there(greedy_reference: list[int]) -> None:
    """The stop checks run on every emitted token, so a stop inside an accepted speculative run
    drops the rest of the run: use a stop token id that prompt lookup drafts."""
    engine = Engine(config(ngram()))
    # a token that repeats in the greedy output, so it is drafted and accepted
    repeated = max(set(greedy_reference), key=greedy_reference.count)
    j = greedy_reference.index(repeated) + 1
    params = SamplingParams(max_tokens=60, temperature=0.0, stop_token_ids=[repeated])
    (completion,) = one(engine, params).outputs
    assert completion.token_ids == greedy_reference[:j]
    assert completion.finish_reason == "stop"


# --------------------------------------------------------------------------- final text


@pytest.mark.parametrize("prompt", ["abcabcabcabcabcabc", list(range(1, 13)), PROMPT])
def test_final_text_is_the_decoded_tokens(plain: Engine, prompt: str | list[int]) -> None:
    """A request that finished on length with no stop strings returns the text of all its tokens.
    (The dummy target emits bytes that are not valid UTF-8 on their own: the incremental decoder
    holds them back while a character may still complete, and the end of the request must release
    them, as U+FFFD, like the tokenizer's own decode.)"""
    (completion,) = one(plain, SamplingParams(max_tokens=40, temperature=0.0), prompt).outputs
    assert completion.finish_reason == "length"
    assert completion.text == plain.tokenizer.decode(completion.token_ids)


def test_final_text_before_a_stop_token(plain: Engine, greedy_reference: list[int]) -> None:
    """Finishing on a stop token (or EOS) also releases the held-back bytes before it: the text is
    the decode of every token but the stop token."""
    # greedy_reference starts [271, 254, 88, ...]: byte 0xFE, which never completes, then 'X'
    stop_token = greedy_reference[2]
    j = greedy_reference.index(stop_token) + 1
    assert plain.tokenizer.decode(greedy_reference[: j - 1]).endswith("\ufffd")  # precondition
    params = SamplingParams(max_tokens=40, temperature=0.0, stop_token_ids=[stop_token])
    (completion,) = one(plain, params).outputs
    assert completion.finish_reason == "stop"
    assert completion.token_ids == greedy_reference[:j]
    assert completion.text == plain.tokenizer.decode(greedy_reference[: j - 1])


# --------------------------------------------------------------------------- n, seeds, top_k


def test_n_outputs_distinct_when_sampling() -> None:
    engine = Engine(config(layers()))
    (out,) = engine.generate([PROMPT], SamplingParams(max_tokens=20, temperature=0.8, n=3))
    assert out.request_id
    assert [c.index for c in out.outputs] == [0, 1, 2]
    ids = [tuple(c.token_ids) for c in out.outputs]
    assert all(
        len(i) == 20 or c.finish_reason == "stop" for i, c in zip(ids, out.outputs, strict=True)
    )
    assert len(set(ids)) == 3
    assert out.usage["completion_tokens"] == sum(len(i) for i in ids)
    assert out.usage["prompt_tokens"] == len(PROMPT)
    # each sequence keeps its own acceptance record
    assert len({id(c.acceptance) for c in out.outputs}) == 3


def test_n_greedy_outputs_identical(spec_engine: Engine, greedy_reference: list[int]) -> None:
    (out,) = spec_engine.generate([PROMPT], SamplingParams(max_tokens=20, temperature=0.0, n=2))
    assert [c.token_ids for c in out.outputs] == [greedy_reference[:20]] * 2


def test_seed_reproducible_across_fresh_engines() -> None:
    prompts = [PROMPT, "abcabcabc", [5, 6, 7, 8]]
    params = [SamplingParams(max_tokens=40, temperature=0.8, seed=1234 + i) for i in range(3)]
    first = Engine(config(layers())).generate(prompts, params)
    second = Engine(config(layers())).generate(prompts, params)
    assert [o.outputs[0].token_ids for o in first] == [o.outputs[0].token_ids for o in second]
    # and a different seed gives a different sample
    other = [SamplingParams(max_tokens=40, temperature=0.8, seed=99 + i) for i in range(3)]
    third = Engine(config(layers())).generate(prompts, other)
    assert [o.outputs[0].token_ids for o in third] != [o.outputs[0].token_ids for o in first]


def test_seeded_request_does_not_depend_on_its_batchmates() -> None:
    """A per-request seed makes the request's sample its own: with speculation off the engine
    already gives the same tokens alone or in a batch (each request draws from its own
    generator), and turning speculation on must not change that. (The accept/reject uniforms and
    the residual draw of the probabilistic sampler must come from the seeded request's generator,
    not from one engine-wide stream shared by whoever is in the batch.)"""
    params = SamplingParams(max_tokens=40, temperature=0.8, seed=1234)
    others = [SamplingParams(max_tokens=40, temperature=0.8, seed=s) for s in (5, 6)]
    for speculative in (None, layers()):
        alone = Engine(config(speculative)).generate([PROMPT], [params])
        batched = Engine(config(speculative)).generate(
            [PROMPT, "abcabcabc", "zzz"], [params, *others]
        )
        assert batched[0].outputs[0].token_ids == alone[0].outputs[0].token_ids, (
            f"speculation {'on' if speculative else 'off'}"
        )


@pytest.mark.parametrize("speculative", [None, "ngram", "layers"])
def test_top_k_1_is_greedy(greedy_reference: list[int], speculative: str | None) -> None:
    spec = {None: None, "ngram": ngram(3), "layers": layers()}[speculative]
    engine = Engine(config(spec))
    params = SamplingParams(max_tokens=40, temperature=0.8, top_k=1, seed=3)
    (completion,) = one(engine, params).outputs
    assert completion.token_ids == greedy_reference[:40]
    # a vanishing top_p keeps only the top token too
    params = SamplingParams(max_tokens=40, temperature=0.8, top_p=1e-6, seed=3)
    (completion,) = one(engine, params).outputs
    assert completion.token_ids == greedy_reference[:40]


# --------------------------------------------------------------------------- refusals


def test_prompt_longer_than_max_model_len_refused() -> None:
    engine = Engine(config(ngram(3), max_model_len=64, max_num_batched_tokens=64))
    with pytest.raises(SamplingError, match="maximum context length is 64"):
        engine.add_request(list(range(65)), SamplingParams(max_tokens=1))
    with pytest.raises(SamplingError, match="maximum context length"):
        engine.add_request("a" * 100)
    # prompt + max_tokens must fit too
    with pytest.raises(SamplingError, match="max_tokens"):
        engine.add_request(list(range(60)), SamplingParams(max_tokens=5))
    assert not engine.has_unfinished()
    # exactly max_model_len is fine, and generates
    (out,) = engine.generate([list(range(59))], SamplingParams(max_tokens=5, ignore_eos=True))
    assert len(out.outputs[0].token_ids) == 5


@pytest.mark.parametrize("prompt", ["", []])
def test_empty_prompt_refused(plain: Engine, prompt: str | list[int]) -> None:
    with pytest.raises(SamplingError, match="empty"):
        plain.add_request(prompt)
    assert not plain.has_unfinished()


@pytest.mark.parametrize("prompt", [[-1], [320], [1, 2, 10_000]])
def test_out_of_vocabulary_prompt_refused(plain: Engine, prompt: list[int]) -> None:
    with pytest.raises(SamplingError, match="prompt token ids"):
        plain.add_request(prompt)
    assert not plain.has_unfinished()


def test_duplicate_request_id_refused() -> None:
    engine = Engine(config(ngram(3)))
    assert engine.add_request(PROMPT, request_id="req") == "req"
    with pytest.raises(SamplingError, match="already in use"):
        engine.add_request("other", request_id="req")
    outs = engine.generate(["third"])
    assert outs[0].request_id != "req"
    assert not engine.has_unfinished()
    # the rejected duplicate did not disturb the first request
    assert engine.num_running == engine.num_waiting == 0


def test_request_id_colliding_with_a_sequence_id() -> None:
    """A request with n = 2 and id 'x' runs sequences 'x-0' and 'x-1'. A later request with the
    user id 'x-0' is either refused as a duplicate or runs alongside without disturbing it."""
    engine = Engine(config())
    engine.add_request(PROMPT, SamplingParams(max_tokens=10, n=2, temperature=0.8), "x")
    second = True
    try:
        engine.add_request("World", SamplingParams(max_tokens=5, temperature=0.0), "x-0")
    except SamplingError:
        second = False
    final = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    assert [len(c.token_ids) for c in final["x"].outputs] == [10, 10]
    if second:
        assert len(final["x-0"].outputs[0].token_ids) == 5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": 0},
        {"temperature": -0.1},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -2},
        {"n": 0},
    ],
)
def test_bad_sampling_params_refused(kwargs: dict) -> None:
    with pytest.raises(SamplingError):
        SamplingParams(**kwargs)
