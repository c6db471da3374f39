"""The preflight's referee, the 1-token request, against a real server on loopback: a model the
server lists is still refused when that request fails (an error status, a dropped connection),
the request goes to the run's route, and nothing is measured or written when it fails."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from garbage_server import GarbageServer, Reply, Request, sse
from test_hostile_preflight import COMPLETION, models, strict

from speclens.bench.preflight import MAX_NAMES, PreflightError, preflight, preflight_all

pytestmark = pytest.mark.timeout(60)

JSON = {"Content-Type": "application/json"}


def _posts(server: GarbageServer) -> list[Request]:
    return [r for r in server.requests if r.method == "POST"]


def test_a_served_model_whose_1_token_request_fails_is_refused(
    run_cli: Any, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    reply = Reply(500, JSON, b'{"error": "CUDA out of memory"}\n')
    with GarbageServer(reply, get=models("m")) as server:
        code, stdout, stderr = run_cli(
            "bench", "--url", server.url, "--model", "m", "--num-requests", "3",
            "--output-dir", out, "--backend", "openai",
        )  # fmt: skip
        posts = _posts(server)
    assert code == 1
    assert stderr.strip().splitlines() == [
        f"bench: {server.url}: a 1-token request to /v1/completions for 'm' got HTTP 500: "
        '{"error": "CUDA out of memory"}'
    ]
    assert [p.json()["max_tokens"] for p in posts] == [1]  # the tiny request, nothing measured
    assert stdout == "" and not out.exists()


class HangUp(GarbageServer):
    """Lists its models, then drops every POST's connection before any answer."""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await self._read(reader)
        self.requests.append(request)
        if request.method == "POST":
            writer.transport.abort()
            return
        await self._send(writer, self._reply(request))


def test_a_1_token_request_the_server_drops_is_refused(run_cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "run"
    with HangUp(Reply(), get=models("m")) as server:
        code, stdout, stderr = run_cli(
            "bench", "--url", server.url, "--model", "m", "--num-requests", "3",
            "--output-dir", out, "--backend", "openai",
        )  # fmt: skip
        posts = _posts(server)
    assert code == 1
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(
        f"bench: {server.url}: a 1-token request to /v1/completions failed: "
    )
    # the tiny request (sent again on a dropped connection, as every request is), nothing measured
    assert posts and all(p.json() == posts[0].json() for p in posts)
    assert posts[0].json()["max_tokens"] == 1
    assert stdout == "" and not out.exists()


def test_a_1_token_request_with_no_answer_says_how_long_it_waited() -> None:
    with (
        GarbageServer(Reply(200, JSON, b"{}", delay=5), get=models("m")) as server,
        pytest.raises(PreflightError) as caught,
    ):
        asyncio.run(preflight(server.url, "m", "completions", timeout=0.5))
    assert str(caught.value) == (
        f"bench: {server.url}: a 1-token request to /v1/completions failed: no answer within 0.5 s"
    )


def test_a_slow_1_token_request_has_the_runs_timeout_not_the_connect_bound() -> None:
    """The connect bound (an unreachable URL fails fast) is not the tiny request's: a model
    that takes longer than it to answer one token is served."""
    with GarbageServer(Reply(200, JSON, orjson.dumps(COMPLETION), delay=1.5),
                       get=models("m")) as server:  # fmt: skip
        note = asyncio.run(preflight(server.url, "m", "completions", timeout=30,
                                     connect_timeout=0.5))  # fmt: skip
        assert note is None and len(_posts(server)) == 1


def test_the_error_body_is_one_line_of_at_most_200_characters() -> None:
    body = b"line one\nline two\n" + b"x" * 500
    with (
        GarbageServer(Reply(503, {}, body), get=models("m")) as server,
        pytest.raises(PreflightError) as caught,
    ):
        asyncio.run(preflight(server.url, "m", "completions"))
    prefix = f"bench: {server.url}: a 1-token request to /v1/completions for 'm' got HTTP 503: "
    line = str(caught.value)
    assert line.startswith(prefix + "line one line two xxx")
    assert len(line) == len(prefix) + 200


def test_the_1_token_request_goes_to_the_runs_route_with_the_key() -> None:
    with GarbageServer(strict("m"), get=models("m")) as server:
        assert asyncio.run(preflight(server.url, "m", "chat", api_key="sekrit")) is None
        (post,) = _posts(server)
        gets = [r for r in server.requests if r.method == "GET"]
    assert post.path == "/v1/chat/completions"
    assert post.json() == {"model": "m", "messages": [{"role": "user", "content": "Hi"}],
                           "max_tokens": 1}  # fmt: skip
    assert [g.path for g in gets] == ["/v1/models"]
    for request in (post, *gets):
        headers = {k.lower(): v for k, v in request.headers.items()}
        assert headers["authorization"] == "Bearer sekrit"


@pytest.mark.parametrize(
    ("get", "endpoint"),
    [
        ({}, "completions"),  # no /v1/models: a plain stand-in
        ({"/v1/models": Reply(200, JSON, b"not json")}, "completions"),
        ({"/v1/models": Reply(200, JSON, orjson.dumps({"models": ["m"]}))}, "completions"),
        (models("m"), "native"),  # SGLang's /generate, llama.cpp's /completion: no OpenAI route
    ],
)
def test_without_a_model_list_or_an_openai_route_no_1_token_request_is_sent(
    get: dict[str, Reply], endpoint: str
) -> None:
    with GarbageServer(Reply(500, {}, b"never asked"), get=get) as server:
        assert asyncio.run(preflight(server.url, "m", endpoint)) is None
        assert _posts(server) == []


def test_an_unserved_model_names_at_most_ten_served() -> None:
    names = [f"model-{i:02d}" for i in range(MAX_NAMES + 2)]
    with (
        GarbageServer(strict("model-00"), get=models(*names)) as server,
        pytest.raises(PreflightError) as caught,
    ):
        asyncio.run(preflight(server.url, "llama", "completions"))
    shown = ", ".join(repr(n) for n in names[:MAX_NAMES])
    assert str(caught.value) == (
        f"bench: --model: {server.url} does not serve 'llama'; it serves {shown} and 2 more"
    )


def test_every_replica_is_checked_and_every_note_kept() -> None:
    answer = Reply(chunks=sse(COMPLETION))
    with (
        GarbageServer(answer, get=models("a.gguf")) as one,
        GarbageServer(answer, get=models("b.gguf")) as two,
        GarbageServer(strict("m"), get=models("m")) as plain,
        GarbageServer(Reply(500, {}, b"down"), get=models("m")) as broken,
    ):
        notes = asyncio.run(preflight_all([one.url, plain.url, two.url], "m", "completions",
                                          None, 10))  # fmt: skip
        with pytest.raises(PreflightError) as caught:
            asyncio.run(preflight_all([one.url, broken.url], "m", "completions", None, 10))
    assert notes == [
        f"bench: {one.url} lists 'a.gguf', not 'm', and answers it (a server that ignores the "
        "model name)",
        f"bench: {two.url} lists 'b.gguf', not 'm', and answers it (a server that ignores the "
        "model name)",
    ]
    assert str(caught.value) == (
        f"bench: {broken.url}: a 1-token request to /v1/completions for 'm' got HTTP 500: down"
    )


def test_only_named_models_are_listed() -> None:
    data = [{"id": 5}, "m", {"object": "model"}, {"id": None}, {"id": "smollm2"}]
    get = {"/v1/models": Reply(200, JSON, orjson.dumps({"object": "list", "data": data}))}
    with (
        GarbageServer(strict("smollm2"), get=get) as server,
        pytest.raises(PreflightError) as caught,
    ):
        asyncio.run(preflight(server.url, "m", "completions"))
    assert (
        str(caught.value) == f"bench: --model: {server.url} does not serve 'm'; it serves 'smollm2'"
    )
