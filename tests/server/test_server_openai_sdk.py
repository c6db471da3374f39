"""The official ``openai`` SDK against a live ``speclens serve``, and the per-request
speculative-decoding stats on the wire in both shapes (per choice, and vLLM's response root)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import httpx
import openai
import pytest

from serverkit import (
    FORCED,
    K,
    ServerProcess,
    check_choice_stats,
    check_root_metrics,
    check_token_count,
    sse_json,
)

pytestmark = pytest.mark.integration

PROMPT = "Speculative decoding drafts tokens and the target verifies them."
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a prime number."},
]


@pytest.fixture(scope="module")
def servers(serve: Any) -> dict[str, ServerProcess]:
    """Three servers started together: detailed, summary and none (the default)."""
    levels = ["detailed", "summary", "none"]
    arg_lists = [
        [*FORCED, "--per-request-spec-decode-stats", level]
        if level != "none"
        else list(FORCED)  # no flag: the default is none
        for level in levels
    ]
    return dict(zip(levels, serve(*arg_lists), strict=True))


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def extra(model: Any) -> dict[str, Any]:
    """The fields an SDK model carries beyond the OpenAI schema."""
    return dict(model.model_extra or {})


# ---------------------------------------------------------------------------- non-streaming


@pytest.mark.parametrize("max_tokens", [1, 2, 40])
def test_sdk_completion_detailed(servers: dict[str, ServerProcess], max_tokens: int) -> None:
    c = client(servers["detailed"])
    raw = c.completions.with_raw_response.create(
        model="dummy",
        prompt=PROMPT,
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert raw.status_code == 200
    body = json.loads(raw.text)
    parsed = raw.parse()
    assert parsed.object == "text_completion"
    assert len(parsed.choices) == 1
    choice = parsed.choices[0]
    assert choice.finish_reason == "length"
    assert parsed.usage is not None
    assert parsed.usage.completion_tokens == max_tokens
    assert parsed.usage.total_tokens == parsed.usage.prompt_tokens + max_tokens
    # The SDK keeps the unknown fields; they are the raw JSON's.
    wire = body["choices"][0]["speculative_decoding_stats"]
    assert extra(choice)["speculative_decoding_stats"] == wire
    assert extra(parsed)["metrics"] == body["metrics"]
    if max_tokens == 1:
        # Only the prefill ran: no verify step, so there is nothing to report per step.
        assert wire["num_spec_steps"] == 0
        assert wire["acceptance_histogram"] == {}
        assert wire["mean_acceptance_length"] == 1.0
        assert body["metrics"]["speculative_decoding"]["acceptance_histogram"] == [0] * (K + 1)
        return
    stats = check_choice_stats(wire, "detailed")
    check_root_metrics(body["metrics"], stats, "detailed")
    check_token_count(stats, parsed.usage.completion_tokens, max_tokens)


def test_sdk_chat_detailed(servers: dict[str, ServerProcess]) -> None:
    c = client(servers["detailed"])
    raw = c.chat.completions.with_raw_response.create(
        model="dummy",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=33,
        extra_body={"ignore_eos": True},
    )
    body = json.loads(raw.text)
    parsed = raw.parse()
    assert parsed.object == "chat.completion"
    choice = parsed.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert parsed.usage is not None and parsed.usage.completion_tokens == 33
    stats = check_choice_stats(extra(choice)["speculative_decoding_stats"], "detailed")
    assert stats == body["choices"][0]["speculative_decoding_stats"]
    check_root_metrics(extra(parsed)["metrics"], stats, "detailed")
    check_token_count(stats, parsed.usage.completion_tokens, 33)


def test_sdk_max_completion_tokens(servers: dict[str, ServerProcess]) -> None:
    """The newer chat spelling of the cap is honoured too."""
    parsed = client(servers["detailed"]).chat.completions.create(
        model="dummy",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_completion_tokens=21,
        extra_body={"ignore_eos": True},
    )
    assert parsed.choices[0].finish_reason == "length"
    assert parsed.usage is not None and parsed.usage.completion_tokens == 21


def test_sdk_models(servers: dict[str, ServerProcess]) -> None:
    models = client(servers["detailed"]).models.list()
    assert [m.id for m in models.data] == ["dummy"]


# ---------------------------------------------------------------------------- streaming


def _consume(stream: Any) -> list[Any]:
    return list(stream)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_sdk_stream_include_usage(servers: dict[str, ServerProcess], endpoint: str) -> None:
    """Per-choice stats ride the finishing chunk; root metrics ride the final usage chunk."""
    c = client(servers["detailed"])
    common: dict[str, Any] = {
        "model": "dummy",
        "max_tokens": 50,
        "stream": True,
        "stream_options": {"include_usage": True},
        "extra_body": {"ignore_eos": True},
    }
    if endpoint == "chat":
        chunks = _consume(c.chat.completions.create(messages=MESSAGES, **common))  # type: ignore[call-overload]
    else:
        chunks = _consume(c.completions.create(prompt=PROMPT, **common))  # type: ignore[call-overload]
    assert len({ch.id for ch in chunks}) == 1
    *body, last = chunks
    # The usage chunk: no choices, the usage, and the root metrics.
    assert last.choices == []
    assert last.usage is not None and last.usage.completion_tokens == 50
    assert all(ch.usage is None for ch in body)
    finishing = [ch for ch in body if ch.choices and ch.choices[0].finish_reason is not None]
    assert len(finishing) == 1 and finishing[0] is body[-1]
    assert finishing[0].choices[0].finish_reason == "length"
    stats = check_choice_stats(
        extra(finishing[0].choices[0])["speculative_decoding_stats"], "detailed"
    )
    check_root_metrics(extra(last)["metrics"], stats, "detailed")
    check_token_count(stats, last.usage.completion_tokens, 50)
    # Nothing else carries either object.
    for ch in body[:-1]:
        assert "metrics" not in extra(ch)
        for choice in ch.choices:
            assert "speculative_decoding_stats" not in extra(choice)
    assert "metrics" not in extra(finishing[0])
    if endpoint == "chat":
        assert body[0].choices[0].delta.role == "assistant"


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_sdk_stream_without_usage(servers: dict[str, ServerProcess], endpoint: str) -> None:
    """Without include_usage there is no usage chunk and, as in vLLM 0.32 (root metrics ride only
    its final usage chunk), no root ``metrics``; the per-choice object is on the finishing chunk."""
    c = client(servers["detailed"])
    common: dict[str, Any] = {
        "model": "dummy",
        "max_tokens": 24,
        "stream": True,
        "extra_body": {"ignore_eos": True},
    }
    if endpoint == "chat":
        chunks = _consume(c.chat.completions.create(messages=MESSAGES, **common))  # type: ignore[call-overload]
    else:
        chunks = _consume(c.completions.create(prompt=PROMPT, **common))  # type: ignore[call-overload]
    assert all(ch.usage is None for ch in chunks)
    assert all(ch.choices for ch in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
    with_stats = [ch for ch in chunks if "speculative_decoding_stats" in extra(ch.choices[0])]
    with_root = [ch for ch in chunks if "metrics" in extra(ch)]
    assert with_stats == [chunks[-1]]
    assert with_root == []
    stats = check_choice_stats(
        extra(chunks[-1].choices[0])["speculative_decoding_stats"], "detailed"
    )
    assert 1 + stats["num_spec_steps"] + stats["num_accepted_draft_tokens"] >= 24


# ---------------------------------------------------------------------------- raw SSE


@pytest.mark.asyncio
async def test_raw_sse_aiohttp_completions(servers: dict[str, ServerProcess]) -> None:
    url = servers["detailed"].url + "/v1/completions"
    body = {
        "prompt": PROMPT,
        "max_tokens": 30,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        assert resp.status == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = await resp.read()
    chunks = sse_json(raw)
    assert all(ch["object"] == "text_completion" for ch in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 30
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    stats = check_choice_stats(chunks[-2]["choices"][0]["speculative_decoding_stats"], "detailed")
    check_root_metrics(chunks[-1]["metrics"], stats, "detailed")


def test_raw_sse_httpx_chat(servers: dict[str, ServerProcess]) -> None:
    url = servers["detailed"].url + "/v1/chat/completions"
    body = {
        "messages": MESSAGES,
        "max_tokens": 30,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    lines: list[str] = []
    with httpx.stream("POST", url, json=body, timeout=60) as resp:
        assert resp.status_code == 200
        lines.extend(resp.iter_lines())
    raw = "\n".join(lines) + "\n"
    chunks = sse_json(raw.encode())
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    assert lines[-2:] == ["data: [DONE]", ""]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])
    assert isinstance(text, str)
    assert chunks[-1]["usage"]["completion_tokens"] == 30


# ---------------------------------------------------------------------------- levels and n


@pytest.mark.parametrize("stream", [False, True])
def test_summary_level_has_no_per_step_arrays(
    servers: dict[str, ServerProcess], stream: bool
) -> None:
    url = servers["summary"].url + "/v1/completions"
    body = {
        "prompt": PROMPT,
        "max_tokens": 40,
        "ignore_eos": True,
        "stream": stream,
        "stream_options": {"include_usage": True} if stream else None,
    }
    r = httpx.post(url, json=body, timeout=60)
    assert r.status_code == 200
    if stream:
        chunks = sse_json(r.content)
        choice, root = chunks[-2]["choices"][0], chunks[-1]["metrics"]
    else:
        data = r.json()
        choice, root = data["choices"][0], data["metrics"]
    stats = check_choice_stats(choice["speculative_decoding_stats"], "summary")
    assert "per_step_accepted" not in stats and "per_step_drafted" not in stats
    check_root_metrics(root, stats, "summary")
    assert "per_step_accepted" not in root["speculative_decoding"]


def test_summary_level_via_sdk(servers: dict[str, ServerProcess]) -> None:
    parsed = client(servers["summary"]).chat.completions.create(
        model="dummy",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=20,
        extra_body={"ignore_eos": True},
    )
    stats = check_choice_stats(extra(parsed.choices[0])["speculative_decoding_stats"], "summary")
    check_root_metrics(extra(parsed)["metrics"], stats, "summary")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_none_level_has_neither_object(
    servers: dict[str, ServerProcess], endpoint: str, stream: bool
) -> None:
    server = servers["none"]
    body: dict[str, Any] = {"max_tokens": 20, "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if endpoint == "chat":
        body["messages"] = MESSAGES
        url = server.url + "/v1/chat/completions"
    else:
        body["prompt"] = PROMPT
        url = server.url + "/v1/completions"
    r = httpx.post(url, json=body, timeout=60)
    assert r.status_code == 200
    objects = sse_json(r.content) if stream else [r.json()]
    assert objects[-1]["usage"]["completion_tokens"] == 20
    for obj in objects:
        assert "metrics" not in obj
        for choice in obj["choices"]:
            assert "speculative_decoding_stats" not in choice
    # The engine still speculates (and counts) with the stats off.
    stats = httpx.get(server.url + "/debug/mtp_stats").json()
    assert stats["enabled"] is True and stats["total_draft_tokens"] > 0


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_n2_stats_are_null(servers: dict[str, ServerProcess], endpoint: str) -> None:
    """Two sequences in one response: both stats objects are null (present, not dropped)."""
    server = servers["detailed"]
    body: dict[str, Any] = {"max_tokens": 12, "ignore_eos": True, "n": 2}
    if endpoint == "chat":
        body["messages"] = MESSAGES
        url = server.url + "/v1/chat/completions"
    else:
        body["prompt"] = PROMPT
        url = server.url + "/v1/completions"
    r = httpx.post(url, json=body, timeout=60)
    assert r.status_code == 200
    data = r.json()
    assert [c["index"] for c in data["choices"]] == [0, 1]
    assert all(c["finish_reason"] == "length" for c in data["choices"])
    assert data["usage"]["completion_tokens"] == 24
    assert "metrics" in data and data["metrics"] is None
    for choice in data["choices"]:
        assert "speculative_decoding_stats" in choice, choice
        assert choice["speculative_decoding_stats"] is None


def test_n2_stream_stats_absent_or_null(servers: dict[str, ServerProcess]) -> None:
    body = {
        "prompt": PROMPT,
        "max_tokens": 12,
        "ignore_eos": True,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = httpx.post(servers["detailed"].url + "/v1/completions", json=body, timeout=60)
    chunks = sse_json(r.content)
    finishes = {
        c["index"]: c["finish_reason"] for ch in chunks for c in ch["choices"] if c["finish_reason"]
    }
    assert finishes == {0: "length", 1: "length"}
    for ch in chunks:
        for c in ch["choices"]:
            assert c.get("speculative_decoding_stats") is None
    assert chunks[-1]["usage"]["completion_tokens"] == 24
    assert chunks[-1]["metrics"] is None


def test_sdk_n2(servers: dict[str, ServerProcess]) -> None:
    parsed = client(servers["detailed"]).completions.create(
        model="dummy", prompt=PROMPT, max_tokens=8, n=2, extra_body={"ignore_eos": True}
    )
    assert len(parsed.choices) == 2
    assert extra(parsed).get("metrics") is None
    assert all(extra(c).get("speculative_decoding_stats") is None for c in parsed.choices)
