"""Stop strings that cost the engine thread (issue 29, item 19).

One request with 650,000 stop strings (7.3 MiB, under the body limit) cost the engine thread 0.3 s
per token, every stop string searched for after every token, and a 32-token neighbour went from
0.23 s to 10.7 s. Now ``stop`` is bounded (128 strings, 8,192 characters in all) and
``stop_token_ids`` too (1,024 ids), each refused with a 400 naming the field before anything is
built from it; and the stop strings are matched by one automaton per request, in work that grows
with the new text alone, whatever the number of strings.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import httpx
import pytest
from starlette.testclient import TestClient

from speclens.engine import Engine, EngineConfig, SamplingError, SamplingParams, StepCost
from speclens.engine.request import (
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    StopMatcher,
)
from speclens.server import EngineRunner, ServerSettings, create_app

CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"


def sim_engine() -> Engine:
    return Engine(
        EngineConfig(
            executor="sim",
            kv_cache_tokens=8192,
            max_model_len=1024,
            max_num_batched_tokens=4096,
            step_cost=StepCost(base=1e-4),
        )
    )


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    app = create_app(EngineRunner(sim_engine()), ServerSettings(served_model_name="dummy"))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def refused(r: httpx.Response, param: str) -> str:
    assert r.status_code == 400, (r.status_code, r.text[:500])
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert error["message"].startswith(f"{param}: "), error
    return str(error["message"])


# ---------------------------------------------------------------------------- the bounds


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", [CMPL, CHAT])
def test_650000_stop_strings_are_refused_naming_stop(client: TestClient, path: str) -> None:
    stop = [f"s{i:06d}" for i in range(650_000)]  # the reproduction: 7.3 MiB of stop strings
    body = {"prompt": "x"} if path == CMPL else {"messages": [{"role": "user", "content": "x"}]}
    message = refused(client.post(path, json={**body, "stop": stop, "max_tokens": 4}), "stop")
    assert message == f"stop: 650000 strings, expected at most {MAX_STOP_STRINGS}"


@pytest.mark.timeout(60)
def test_stop_bounds_are_exact(client: TestClient) -> None:
    at = {"prompt": "x", "max_tokens": 2, "stop": ["\x01" * 64] * MAX_STOP_STRINGS}
    assert client.post(CMPL, json=at).status_code == 200
    over = {**at, "stop": ["\x01"] * (MAX_STOP_STRINGS + 1)}
    assert refused(client.post(CMPL, json=over), "stop").startswith(
        f"stop: {MAX_STOP_STRINGS + 1} strings"
    )
    one = {**at, "stop": "\x01" * MAX_STOP_CHARS}
    assert client.post(CMPL, json=one).status_code == 200
    message = refused(client.post(CMPL, json={**at, "stop": "\x01" * (MAX_STOP_CHARS + 1)}), "stop")
    assert message == f"stop: {MAX_STOP_CHARS + 1} characters in all, expected at most 8192"
    spread = ["\x01" * 100] * 82  # 8,200 characters in 82 strings
    assert "8200 characters in all" in refused(
        client.post(CMPL, json={**at, "stop": spread}), "stop"
    )
    ids = {"prompt": "x", "max_tokens": 2, "stop_token_ids": [300] * MAX_STOP_TOKEN_IDS}
    assert client.post(CMPL, json=ids).status_code == 200
    ids["stop_token_ids"] = [300] * (MAX_STOP_TOKEN_IDS + 1)
    message = refused(client.post(CMPL, json=ids), "stop_token_ids")
    assert message == "stop_token_ids: 1025 token ids, expected at most 1024"


def test_sampling_params_refuse_the_same_bounds() -> None:
    """The engine's own check (a library caller, or a rank rebuilding rank 0's parameters)."""
    with pytest.raises(SamplingError, match=r"^stop: 129 strings, expected at most 128$") as err:
        SamplingParams(stop=["a"] * 129)
    assert err.value.field == "stop"
    with pytest.raises(SamplingError, match="stop: 8193 characters in all") as err:
        SamplingParams(stop="a" * 8193)
    with pytest.raises(SamplingError, match="stop_token_ids: 1025 token ids") as err:
        SamplingParams(stop_token_ids=list(range(1025)))
    assert err.value.field == "stop_token_ids"
    SamplingParams(stop=["a" * 64] * 128, stop_token_ids=list(range(1024)))


# ---------------------------------------------------------------------------- the matcher


def first_stop(text: str, old: int, stops: list[str]) -> int | None:
    """By brute force: where the earliest-starting stop string that ends after ``old``
    characters of ``text`` begins (none ended before: the text would have been cut)."""
    starts = [
        i
        for s in stops
        if s
        for i in range(len(text) - len(s) + 1)
        if i + len(s) > old and text.startswith(s, i)
    ]
    return min(starts, default=None)


def test_the_matcher_finds_what_brute_force_finds() -> None:
    rng = random.Random(7)
    for _ in range(1500):
        stops = ["".join(rng.choice("abc") for _ in range(rng.randint(0, 5))) for _ in range(4)]
        stops += rng.sample(stops, 1)  # a duplicate
        matcher = StopMatcher(stops)
        assert matcher.longest == max(len(s) for s in stops)
        state, text = 0, ""
        for _ in range(12):
            new = "".join(rng.choice("abcd") for _ in range(rng.randint(0, 3)))
            old = len(text)
            text += new
            state, first = matcher.feed(state, new)
            expected = first_stop(text, old, stops)
            assert (None if first is None else old + first) == expected, (stops, text)
            if expected is not None:
                break


def test_matching_work_does_not_grow_with_the_number_of_strings() -> None:
    """At the bounds (128 strings of 64 characters, all sharing prefixes with the text, the
    worst case for failure links), the automaton does at most 2 steps per character fed; the
    strings searched one by one did 128 searches of a 64-character window per character."""
    rng = random.Random(3)
    text = "".join(rng.choice("ab") for _ in range(5000))
    many = ["".join(rng.choice("ab") for _ in range(63)) + "c" for _ in range(MAX_STOP_STRINGS)]
    for stops in (["ab" * 31 + "c"], many):
        matcher = StopMatcher(stops)
        state = 0
        for i in range(0, len(text), 3):  # a token of 3 characters at a time
            state, first = matcher.feed(state, text[i : i + 3])
            assert first is None
        assert matcher.work <= 2 * len(text), (len(stops), matcher.work)


@pytest.mark.timeout(60)
def test_a_request_at_the_bounds_costs_the_engine_work_in_its_text_alone() -> None:
    """Through the engine: a request with 128 stop strings of 64 characters that never match,
    beside a neighbour with none; its matcher's work is at most 2 steps per character of its
    text (every character of which it saw), and the neighbour finishes with all its tokens."""
    engine = sim_engine()
    stops = [f"{i:03d}" + "\x02" * 61 for i in range(MAX_STOP_STRINGS)]
    heavy = SamplingParams(max_tokens=300, ignore_eos=True, stop=stops, seed=1)
    heavy_id = engine.add_request("the cat sat on the mat", heavy)
    (sequence,) = engine._groups[heavy_id]
    matcher = sequence.stop_matcher
    assert matcher is not None
    light_id = engine.add_request("the dog", SamplingParams(max_tokens=32, ignore_eos=True))
    finished = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    assert finished[light_id].completion_tokens == 32
    assert finished[heavy_id].outputs[0].finish_reason == "length"
    chars = len(finished[heavy_id].outputs[0].text)
    assert chars > 0
    assert chars <= matcher.work <= 2 * chars, (matcher.work, chars)  # it saw every character
