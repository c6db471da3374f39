"""Bad input and faults: OpenAI-style error bodies with the right status (400, 401, 413, 503),
and no user input ever answered with a 500."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from serverkit import FORCED, ServerProcess, idle, post, wait_until

pytestmark = pytest.mark.integration

MAX_MODEL_LEN = 512
API_KEY = "sk-speclens-test"
CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def servers(serve: Any) -> dict[str, ServerProcess]:
    """A forced server with a short context and few sequences, one behind an API key, and a
    sim server whose waiting queue holds one request."""
    names = ["plain", "auth", "queue"]
    arg_lists = [
        [
            *FORCED,
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--max-num-seqs",
            "8",
            "--per-request-spec-decode-stats",
            "summary",
        ],
        ["--api-key", API_KEY],
        [*FORCED, "--executor", "sim", "--max-queue", "1", "--max-num-seqs", "1"],
    ]
    return dict(zip(names, serve(*arg_lists), strict=True))


def check_error(r: httpx.Response, status: int, param: str | None = "<any>") -> dict[str, Any]:
    """An OpenAI-style error body: {"error": {"message", "type", "param", "code"}}."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert error["code"] == status
    if param != "<any>":
        assert error["param"] == param, error
    return dict(error)


# ---------------------------------------------------------------------------- 400

TOO_LONG = MAX_MODEL_LEN + 1
BAD_REQUESTS: list[tuple[str, str, dict[str, Any], str | None, str]] = [
    # (id, path, body, param or "<any>", a piece of the message)
    ("unknown-model", CMPL, {"model": "gpt-9", "prompt": "x"}, "model", "gpt-9"),
    ("unknown-model-chat", CHAT, {"model": "gpt-9", "messages": MSG}, "model", "gpt-9"),
    (
        "unknown-model-stream",
        CMPL,
        {"model": "gpt-9", "prompt": "x", "stream": True},
        "model",
        "does not exist",
    ),
    ("max-tokens-string", CMPL, {"prompt": "x", "max_tokens": "x"}, "max_tokens", "integer"),
    ("max-tokens-zero", CMPL, {"prompt": "x", "max_tokens": 0}, "max_tokens", "max_tokens"),
    ("max-tokens-float", CMPL, {"prompt": "x", "max_tokens": 1.5}, "max_tokens", "max_tokens"),
    ("temperature-negative", CMPL, {"prompt": "x", "temperature": -1}, "temperature", "0"),
    ("temperature-string", CHAT, {"messages": MSG, "temperature": "hot"}, "temperature", "temp"),
    ("top-p-zero", CMPL, {"prompt": "x", "top_p": 0}, "top_p", "top_p"),
    ("n-zero", CMPL, {"prompt": "x", "n": 0}, "n", "n"),
    ("n-too-large", CMPL, {"prompt": "x", "n": 17}, "n", "n must be at most"),
    ("n-above-max-num-seqs", CHAT, {"messages": MSG, "n": 9}, "n", "n must be at most 8"),
    (
        "max-tokens-beyond-max-model-len",
        CMPL,
        {"prompt": "x", "max_tokens": TOO_LONG},
        "<any>",
        "maximum context length is 512",
    ),
    (
        "max-tokens-beyond-max-model-len-chat-stream",
        CHAT,
        {"messages": MSG, "max_tokens": TOO_LONG, "stream": True},
        "<any>",
        "maximum context length is 512",
    ),
    (
        "prompt-beyond-max-model-len",
        CMPL,
        {"prompt": "a" * TOO_LONG, "max_tokens": 1},
        "<any>",
        "maximum context length",
    ),
    (
        "token-prompt-beyond-max-model-len",
        CMPL,
        {"prompt": [65] * TOO_LONG, "max_tokens": 1},
        "<any>",
        "maximum context length",
    ),
    ("empty-messages", CHAT, {"messages": []}, "messages", "at least 1"),
    ("missing-messages", CHAT, {"prompt": "x"}, "messages", "required"),
    ("missing-prompt", CMPL, {"max_tokens": 3}, "prompt", "required"),
    ("empty-prompt", CMPL, {"prompt": ""}, "prompt", "empty"),
    ("empty-token-prompt", CMPL, {"prompt": []}, "prompt", "empty"),
    ("token-out-of-vocab", CMPL, {"prompt": [10**9]}, "<any>", "token ids"),
    ("negative-token", CMPL, {"prompt": [-1]}, "<any>", "token ids"),
    ("batch-of-prompts", CMPL, {"prompt": ["a", "b"]}, "prompt", "one prompt"),
    ("echo-unsupported", CMPL, {"prompt": "x", "echo": True}, "echo", "echo"),
    ("logprobs-unsupported", CMPL, {"prompt": "x", "logprobs": 2}, "logprobs", "logprobs"),
    (
        "image-content-part",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "messages",
        "text",
    ),
    ("message-without-role", CHAT, {"messages": [{"content": "x"}]}, "<any>", "role"),
    ("messages-not-a-list", CHAT, {"messages": "hi"}, "messages", "list"),
    (
        "stream-options-bad-type",
        CHAT,
        {"messages": MSG, "stream": True, "stream_options": {"include_usage": "maybe"}},
        "<any>",
        "include_usage",
    ),
    ("seed-beyond-64-bits", CMPL, {"prompt": "x", "seed": 2**64}, "<any>", "seed"),
    (
        "seed-beyond-64-bits-stream",
        CMPL,
        {"prompt": "x", "seed": 2**70, "stream": True},
        "<any>",
        "seed",
    ),
    ("seed-negative-beyond-64-bits", CHAT, {"messages": MSG, "seed": -(2**64)}, "<any>", "seed"),
]


@pytest.mark.parametrize(
    ("name", "path", "body", "param", "message"), BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS]
)
def test_bad_request_is_400(
    servers: dict[str, ServerProcess],
    name: str,
    path: str,
    body: dict[str, Any],
    param: str | None,
    message: str,
) -> None:
    r = post(servers["plain"].url + path, body)
    error = check_error(r, 400, param)
    assert error["type"] == "invalid_request_error"
    assert message.lower() in error["message"].lower(), error


MALFORMED: list[tuple[str, bytes | str]] = [
    ("not-json", b"this is not json"),
    ("truncated-json", b'{"prompt": "x", '),
    ("json-list", b'[{"prompt": "x"}]'),
    ("json-string", b'"prompt"'),
    ("json-number", b"42"),
    ("json-null", b"null"),
    ("empty-body", b""),
    ("invalid-utf8", b'{"prompt": "\xff\xfe"}'),
    ("nan-literal", b'{"prompt": "x", "temperature": NaN}'),
    ("huge-exponent", b'{"prompt": "x", "max_tokens": 1e400}'),
    ("nested-prompt", b'{"prompt": [[1, 2], [3]]}'),
    ("prompt-object", b'{"prompt": {"text": "x"}}'),
    ("prompt-mixed-list", b'{"prompt": [1, "a"]}'),
    ("stop-number", b'{"prompt": "x", "stop": 5}'),
    ("stop-token-ids-strings", b'{"prompt": "x", "stop_token_ids": ["a"]}'),
    ("stream-options-list", b'{"prompt": "x", "stream_options": [1]}'),
    ("deep-nesting", b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
]


@pytest.mark.parametrize(("name", "raw"), MALFORMED, ids=[m[0] for m in MALFORMED])
@pytest.mark.parametrize("path", [CMPL, CHAT])
def test_malformed_body_is_400(
    servers: dict[str, ServerProcess], path: str, name: str, raw: bytes
) -> None:
    r = post(servers["plain"].url + path, raw)
    check_error(r, 400)


ODD_BUT_VALID: list[tuple[str, dict[str, Any]]] = [
    ("empty-stop-string", {"prompt": "x", "stop": [""], "max_tokens": 3}),
    ("huge-stop-token-id", {"prompt": "x", "stop_token_ids": [10**30], "max_tokens": 3}),
    ("odd-code-points", {"prompt": "\u0000\ud7ff\U0010ffff", "max_tokens": 3}),
    (
        "extreme-sampling",
        {"prompt": "x", "temperature": 2, "top_p": 1e-9, "top_k": 10**9, "max_tokens": 3},
    ),
    ("tiny-temperature", {"prompt": "x", "temperature": 1e-30, "max_tokens": 3}),
    ("negative-seed", {"prompt": "x", "seed": -1, "max_tokens": 3}),
    ("max-seed-n2", {"prompt": "x", "seed": 2**64 - 1, "n": 2, "max_tokens": 3}),
    ("one-token-prompt-batch", {"prompt": [[65, 66]], "max_tokens": 3}),
    (
        "unknown-fields",
        {"prompt": "x", "max_tokens": 3, "unknown_field": {"a": [1]}, "logit_bias": {"1": 5}},
    ),
    (
        "null-stream-options",
        {"prompt": "x", "max_tokens": 3, "stream": True, "stream_options": None},
    ),
    ("null-model", {"prompt": "x", "max_tokens": 3, "user": "u", "model": None}),
]


@pytest.mark.parametrize(("name", "body"), ODD_BUT_VALID, ids=[o[0] for o in ODD_BUT_VALID])
def test_odd_input_never_500(
    servers: dict[str, ServerProcess], name: str, body: dict[str, Any]
) -> None:
    r = post(servers["plain"].url + CMPL, body)
    assert r.status_code < 500, r.text
    if r.status_code != 200:
        check_error(r, r.status_code)


def test_no_500_in_the_server_log(servers: dict[str, ServerProcess]) -> None:
    """After all the bad input above, the server never logged an unhandled exception."""
    log = servers["plain"].log()
    assert "Traceback" not in log, log[-3000:]
    assert "Exception in ASGI application" not in log


def test_unknown_route_is_404_json(servers: dict[str, ServerProcess]) -> None:
    r = httpx.get(servers["plain"].url + "/v1/nope", timeout=10)
    check_error(r, 404)
    r = httpx.get(servers["plain"].url + CMPL, timeout=10)  # wrong method
    assert r.status_code == 405


# ---------------------------------------------------------------------------- 401


@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer wrong"}, {"authorization": API_KEY}, {"x-api-key": API_KEY}],
    ids=["missing", "wrong", "no-bearer-prefix", "other-header"],
)
@pytest.mark.parametrize("path", [CMPL, CHAT, "/v1/models"])
def test_api_key_refused(servers: dict[str, ServerProcess], path: str, headers: dict) -> None:
    url = servers["auth"].url + path
    if path == "/v1/models":
        r = httpx.get(url, headers=headers, timeout=10)
    else:
        body = {"prompt": "x"} if path == CMPL else {"messages": MSG}
        r = httpx.post(url, json=body, headers=headers, timeout=10)
    error = check_error(r, 401)
    assert error["type"] == "authentication_error"


def test_api_key_accepted(servers: dict[str, ServerProcess]) -> None:
    url = servers["auth"].url
    auth = {"authorization": f"Bearer {API_KEY}"}
    r = httpx.post(url + CMPL, json={"prompt": "x", "max_tokens": 3}, headers=auth, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert httpx.get(url + "/v1/models", headers=auth, timeout=10).status_code == 200
    # Health, version and metrics stay open (probes and scrapers carry no key).
    for path in ("/health", "/version", "/metrics", "/debug/mtp_stats"):
        assert httpx.get(url + path, timeout=10).status_code == 200, path


def test_api_key_with_the_sdk(servers: dict[str, ServerProcess]) -> None:
    base = servers["auth"].url + "/v1"
    good = openai.OpenAI(base_url=base, api_key=API_KEY, max_retries=0)
    out = good.chat.completions.create(model="dummy", messages=MSG, max_tokens=4)  # type: ignore[arg-type]
    assert out.choices[0].finish_reason in {"length", "stop"}
    bad = openai.OpenAI(base_url=base, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.completions.create(model="dummy", prompt="x", max_tokens=4)
    assert info.value.status_code == 401


def test_sdk_bad_request_error(servers: dict[str, ServerProcess]) -> None:
    c = openai.OpenAI(base_url=servers["plain"].url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        c.completions.create(model="gpt-9", prompt="x")
    assert info.value.status_code == 400
    assert info.value.param == "model"  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------- 413


def test_oversized_body_is_413(servers: dict[str, ServerProcess]) -> None:
    body = json.dumps({"prompt": "a" * (8 * 1024 * 1024 + 1)}).encode()
    r = post(servers["plain"].url + CMPL, body)
    error = check_error(r, 413)
    assert "exceeds 8388608" in error["message"]
    # Before authentication too: a huge body is refused without being read.
    r = post(servers["auth"].url + CMPL, body)
    check_error(r, 413)


def test_oversized_chunked_body_is_413(servers: dict[str, ServerProcess]) -> None:
    """The limit is on the body, not on a header: a chunked upload (no Content-Length) of more
    than 8 MiB must be refused as well."""
    body = json.dumps({"prompt": "a" * (9 * 1024 * 1024)}).encode()

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 1 << 16):
            yield body[i : i + (1 << 16)]

    r = httpx.post(
        servers["plain"].url + CMPL,
        content=chunks(),
        headers={"content-type": "application/json"},
        timeout=60,
    )
    check_error(r, 413)


def test_body_just_under_the_limit_is_read(servers: dict[str, ServerProcess]) -> None:
    body = json.dumps({"prompt": "a" * (8 * 1024 * 1024 - 64)}).encode()
    assert len(body) <= 8 * 1024 * 1024
    r = post(servers["plain"].url + CMPL, body)
    error = check_error(r, 400)  # read, then refused for its length, not its size
    assert "maximum context length" in error["message"]


# ---------------------------------------------------------------------------- 503


async def _fire(base: str, count: int) -> list[httpx.Response]:
    body = {"prompt": "queue", "max_tokens": 1200, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=60) as client:
        return await asyncio.gather(*(client.post(base + CMPL, json=body) for _ in range(count)))


def test_queue_full_is_503(servers: dict[str, ServerProcess]) -> None:
    """One running (max-num-seqs 1), one waiting (max-queue 1): the rest are turned away."""
    base = servers["queue"].url
    responses = asyncio.run(_fire(base, 8))
    codes = sorted(r.status_code for r in responses)
    assert set(codes) <= {200, 503}, codes
    assert 1 <= codes.count(200) <= 2, codes
    assert codes.count(503) >= 6
    for r in responses:
        if r.status_code == 503:
            error = check_error(r, 503)
            assert "queue is full" in error["message"]
        else:
            assert r.json()["usage"]["completion_tokens"] == 1200
    # Nothing stays behind, and the server takes requests again.
    assert wait_until(lambda: idle(base), 10)
    r = post(base + CMPL, {"prompt": "again", "max_tokens": 5})
    assert r.status_code == 200
