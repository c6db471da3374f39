"""bench checks the server before it measures: an unreachable URL, a model the server does not
serve, or an endpoint path in --url fail in one line, and nothing is measured or written. A
server that lists another name but answers the request (llama.cpp) is measured."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from garbage_server import GarbageServer, Reply, Request, sse

COMPLETION = {"choices": [{"index": 0, "text": "a", "finish_reason": "length"}],
              "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}  # fmt: skip


def nowhere() -> str:
    """A loopback URL nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def models(*names: str) -> dict[str, Reply]:
    body = {"object": "list", "data": [{"id": n, "object": "model"} for n in names]}
    return {"/v1/models": Reply(200, {"Content-Type": "application/json"}, orjson.dumps(body))}


def strict(served: str) -> Any:
    """vLLM's way: a request for another model is a 404 naming it."""

    def reply(request: Request) -> Reply:
        model = request.json().get("model")
        if model != served:
            body = {"error": {"message": f"The model `{model}` does not exist.", "code": 404}}
            return Reply(404, {"Content-Type": "application/json"}, orjson.dumps(body))
        if request.json().get("stream"):
            return Reply(chunks=sse(COMPLETION))
        return Reply(200, {"Content-Type": "application/json"}, orjson.dumps(COMPLETION))

    return reply


@pytest.mark.timeout(60)
def test_unreachable_url_fails_in_one_line_within_5_s_and_writes_nothing(
    run_cli: Any, tmp_path: Path
) -> None:
    url = nowhere()
    out = tmp_path / "run"
    started = time.monotonic()
    code, stdout, stderr = run_cli(
        "bench", "--url", url, "--model", "m", "--num-requests", "5", "--output-dir", out
    )
    assert time.monotonic() - started < 5
    assert code == 1
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"bench: {url}: cannot connect")
    assert "agree" not in stdout and stdout == ""
    assert not out.exists()


@pytest.mark.timeout(60)
def test_unserved_model_fails_listing_the_served_names(run_cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "run"
    with GarbageServer(strict("smollm2"), get=models("smollm2")) as server:
        code, stdout, stderr = run_cli(
            "bench", "--url", server.url, "--model", "llama", "--num-requests", "5",
            "--output-dir", out,
        )  # fmt: skip
        posts = [r for r in server.requests if r.method == "POST"]
    assert code == 1
    assert stderr.strip().splitlines() == [
        f"bench: --model: {server.url} does not serve 'llama'; it serves 'smollm2'"
    ]
    assert len(posts) == 1 and posts[0].json()["max_tokens"] == 1  # the tiny request only
    assert stdout == "" and not out.exists()


@pytest.mark.timeout(60)
def test_a_server_that_ignores_the_model_name_is_measured_and_the_check_not_counted(
    run_cli: Any, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    reply = Reply(chunks=sse(COMPLETION))
    with GarbageServer(reply, get=models("smollm2-135m.gguf")) as server:
        code, _, stderr = run_cli(
            "bench", "--url", server.url, "--model", "smollm2", "--num-requests", "3",
            "--output-dir", out, "--backend", "openai",
        )  # fmt: skip
        posts = [r for r in server.requests if r.method == "POST"]
    assert code == 0, stderr
    assert "lists 'smollm2-135m.gguf', not 'smollm2', and answers it" in stderr
    assert len(posts) == 4  # the tiny request and the three measured
    records = (out / "records.jsonl").read_text().splitlines()
    assert len(records) == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["figures"]["requests"]["completed"] == 3


@pytest.mark.timeout(60)
def test_every_replica_is_checked(run_cli: Any, tmp_path: Path) -> None:
    url = nowhere()
    with GarbageServer(strict("m"), get=models("m")) as server:
        code, _, stderr = run_cli(
            "bench", "--url", server.url, "--url", url, "--model", "m", "--num-requests", "2",
            "--output-dir", tmp_path / "run",
        )  # fmt: skip
        measured = [r for r in server.requests if r.method == "POST" and r.json()["max_tokens"] > 1]
    assert code == 1
    assert stderr.strip().splitlines()[0].startswith(f"bench: {url}: cannot connect")
    assert len(stderr.strip().splitlines()) == 1
    assert measured == [] and not (tmp_path / "run").exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("path", "suffix"),
    [("/v1/completions", "/v1/completions"), ("/v1/chat/completions/", "/v1/chat/completions"),
     ("/v1/models", "/v1/models"), ("/proxy/v1/completions", "/v1/completions")],
)  # fmt: skip
def test_an_endpoint_path_in_the_url_gets_the_hint_to_drop_it(
    run_cli: Any, path: str, suffix: str
) -> None:
    url = "http://127.0.0.1:8000" + path
    base = "http://127.0.0.1:8000" + ("/proxy" if path.startswith("/proxy") else "")
    code, _, stderr = run_cli("bench", "--url", url, "--model", "m", "--num-requests", "2")
    assert code == 2
    assert stderr.strip().splitlines() == [
        f"command line: --url: {url!r} ends in the endpoint path {suffix}; drop it and give "
        f"the base URL {base!r} (the client adds the routes)"
    ]


@pytest.mark.timeout(60)
def test_no_preflight_goes_straight_to_the_run(run_cli: Any) -> None:
    code, stdout, _ = run_cli(
        "bench", "--url", nowhere(), "--model", "m", "--num-requests", "2", "--no-preflight"
    )
    assert code == 3
    assert "2 of 2 requests failed" in stdout
