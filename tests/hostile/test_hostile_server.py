"""The HTTP server under bad input and faults: a dead engine fails every request at once and the
process exits non-zero; text no tokenizer can encode, booleans for numbers and unknown roles are
400s; 4xx bodies say ``invalid_request_error``; stalled connections are closed; a port in use is
one line and exit 1, with no "serving" line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

import launch
from childtime import within
from serverkit import FORCED, ServerProcess, child_env, serve_command
from speclens.engine import Engine, EngineConfig, SpeculativeConfig, StepCost
from speclens.server import EngineRunner, ServerSettings, create_app

SIM = [*FORCED, "--executor", "sim"]
CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"


def sim_engine(base: float = 2e-3) -> Engine:
    spec = SpeculativeConfig(method="draft_model", num_speculative_tokens=7, acceptance_length=3.78)
    return Engine(
        EngineConfig(
            speculative=spec,
            executor="sim",
            kv_cache_tokens=8192,
            max_model_len=1024,
            max_num_batched_tokens=4096,
            step_cost=StepCost(base=base),
        )
    )


def check_error(r: httpx.Response, status: int, kind: str) -> str:
    """An OpenAI-style JSON error; returns its message."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    error = r.json()["error"]
    assert error["type"] == kind, error
    assert error["code"] == status
    return str(error["message"])


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    app = create_app(EngineRunner(sim_engine()), ServerSettings(served_model_name="dummy"))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


# ---------------------------------------------------------------------------- bad input: 400

SURROGATE = "x\\ud800y"  # JSON's spelling of a lone surrogate, which UTF-8 cannot encode
SURROGATES = {
    "completion": ('{"prompt": "%s", "max_tokens": 2}', "prompt"),
    "completion-stream": ('{"prompt": "%s", "max_tokens": 2, "stream": true}', "prompt"),
    "chat": ('{"messages": [{"role": "user", "content": "%s"}], "max_tokens": 2}', "messages"),
    "chat-stream": (
        '{"messages": [{"role": "user", "content": "%s"}], "max_tokens": 2, "stream": true}',
        "messages",
    ),
    "chat-part": (
        '{"messages": [{"role": "user", "content": [{"type": "text", "text": "%s"}]}]}',
        "messages",
    ),
    "stop": ('{"prompt": "ok", "max_tokens": 2, "stop": ["%s"]}', "stop"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", list(SURROGATES))
def test_lone_surrogate_is_400(client: TestClient, name: str) -> None:
    template, field = SURROGATES[name]
    path = CHAT if "messages" in template else CMPL
    r = client.post(
        path, content=template % SURROGATE, headers={"content-type": "application/json"}
    )
    message = check_error(r, 400, "invalid_request_error")
    assert message.startswith(field) and "not valid UTF-8 text" in message, message


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": "x", "max_tokens": True}, "max_tokens"),
        ({"prompt": "x", "n": True}, "n"),
        ({"prompt": [True, 5]}, "prompt"),
        ({"prompt": "x", "temperature": False}, "temperature"),
    ],
    ids=["max_tokens", "n", "token-ids", "temperature"],
)
def test_boolean_for_a_number_is_400(client: TestClient, body: dict[str, Any], field: str) -> None:
    message = check_error(client.post(CMPL, json=body), 400, "invalid_request_error")
    assert message.startswith(field) and "expected a number, got" in message, message


@pytest.mark.timeout(60)
def test_unknown_chat_role_is_400(client: TestClient) -> None:
    body = {"messages": [{"role": "wizard", "content": "hi"}], "max_tokens": 2}
    message = check_error(client.post(CHAT, json=body), 400, "invalid_request_error")
    assert message.startswith("messages.0.role"), message
    for role in ("system", "user", "assistant", "developer", "tool"):
        assert f"'{role}'" in message, message


@pytest.mark.timeout(60)
def test_client_errors_are_invalid_request_error(client: TestClient) -> None:
    check_error(client.get(CMPL), 405, "invalid_request_error")
    check_error(client.get("/v1/nope"), 404, "invalid_request_error")
    check_error(
        client.post(CMPL, json={"prompt": "x", "max_tokens": 0}), 400, "invalid_request_error"
    )


# ---------------------------------------------------------------------------- the engine dies


@contextlib.asynccontextmanager
async def dying_app() -> AsyncIterator[tuple[httpx.AsyncClient, EngineRunner, dict[str, Any]]]:
    """An app whose engine's step, once ``kill`` is set, blocks until ``release`` and raises."""
    engine = sim_engine(base=0.02)
    ctl: dict[str, Any] = {
        "kill": threading.Event(),
        "entered": threading.Event(),
        "release": threading.Event(),
        "dead": [],
        "steps": 0,
    }
    step = engine.step

    def failing_step() -> Any:
        if ctl["kill"].is_set():
            ctl["entered"].set()
            ctl["release"].wait(10)
            raise RuntimeError("boom in step")
        ctl["steps"] += 1
        return step()

    engine.step = failing_step  # type: ignore[method-assign]
    runner = EngineRunner(engine)
    runner.on_dead = ctl["dead"].append  # type: ignore[attr-defined]
    app = create_app(runner, ServerSettings(served_model_name="dummy"))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://t") as c,
    ):
        yield c, runner, ctl


async def until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.mark.timeout(60)
@pytest.mark.asyncio
async def test_engine_death_fails_every_request_at_once() -> None:
    long = {"prompt": "go", "max_tokens": 900, "ignore_eos": True}
    async with dying_app() as (c, runner, ctl):
        plain = asyncio.ensure_future(c.post(CMPL, json=long))
        stream = asyncio.ensure_future(c.post(CMPL, json={**long, "stream": True}))
        await until(lambda: len(runner._queues) == 2)  # both running in the engine
        # Two more steps (their prefill, then a decode step): the stream has a token to send
        # before the engine dies, however slowly a loaded machine ran up to here.
        done = ctl["steps"]
        await until(lambda: ctl["steps"] >= done + 2)
        ctl["kill"].set()
        await until(ctl["entered"].is_set)  # the engine thread is inside the failing step
        queued = asyncio.ensure_future(c.post(CMPL, json=long))
        await until(lambda: runner._pending == 1)  # waiting in the inbox for the engine thread
        started = time.monotonic()
        ctl["release"].set()
        plain_r, stream_r, queued_r = await asyncio.wait_for(
            asyncio.gather(plain, stream, queued), timeout=10
        )
        assert time.monotonic() - started < 5
        message = check_error(plain_r, 500, "server_error")
        assert message == "the engine failed: RuntimeError: boom in step", message
        assert "boom in step" in check_error(queued_r, 503, "service_unavailable")
        # The stream had started: it ends with an error event and no [DONE].
        assert stream_r.status_code == 200
        events = [e for e in stream_r.text.split("\n\n") if e]
        assert len(events) >= 2 and "[DONE]" not in stream_r.text, events[-2:]
        last = json.loads(events[-1].removeprefix("data: "))
        assert last["error"]["message"] == "the engine failed: RuntimeError: boom in step"
        assert "choices" in json.loads(events[0].removeprefix("data: "))
        # Health and new requests say so at once; the server was told to shut down.
        assert (await c.get("/health")).status_code == 503
        new = await asyncio.wait_for(c.post(CMPL, json=long), timeout=5)
        assert "boom in step" in check_error(new, 503, "service_unavailable")
        assert len(ctl["dead"]) == 1


# ---------------------------------------------------------------------------- real processes

#: Runs ``speclens serve`` with Engine.step failing after N calls and/or a short idle timeout.
SCRIPT = """
import functools, os, sys
import speclens.cli.serve as serve_cli
from speclens.engine import Engine

fail_at = int(os.environ.get("FAIL_AT_STEP", "0"))
if fail_at:
    step, calls = Engine.step, [0]
    def failing(self):
        calls[0] += 1
        if calls[0] >= fail_at:
            raise RuntimeError("boom in step")
        return step(self)
    Engine.step = failing
if os.environ.get("IDLE_TIMEOUT"):
    serve_cli.run_server = functools.partial(
        serve_cli.run_server, idle_timeout_s=float(os.environ["IDLE_TIMEOUT"])
    )
from speclens.cli import main
sys.argv = ["speclens", *sys.argv[1:]]
main()
"""


def scripted(tmp_path: Path, env: dict[str, str], *args: str) -> ServerProcess:
    script = tmp_path / "serve_patched.py"
    script.write_text(SCRIPT)
    server = ServerProcess([*SIM, *args], tmp_path)
    server.log_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(script), *serve_command(server.args, server.port)[3:]]
    with open(server.stdout_path, "wb") as out, open(server.stderr_path, "wb") as err:
        server.proc = subprocess.Popen(command, stdout=out, stderr=err, env={**child_env(), **env})
    return server


@pytest.mark.timeout(120)
def test_engine_death_exits_non_zero(tmp_path: Path) -> None:
    server = scripted(tmp_path, {"FAIL_AT_STEP": "20"})
    try:
        server.wait_ready()
        started = time.monotonic()
        r = httpx.post(
            server.url + CMPL,
            json={"prompt": "go", "max_tokens": 900, "ignore_eos": True},
            timeout=30,
        )
        message = check_error(r, 500, "server_error")
        assert message == "the engine failed: RuntimeError: boom in step"
        code = server.wait(timeout=30)
        assert code == 1
        assert time.monotonic() - started < within(8)  # 10 s on a quiet machine
        log = server.log()
        assert log.count("Traceback") == 1, log  # logged once, with its traceback
        assert "ERROR speclens.server.runner: the engine failed" in log
        assert log.strip().splitlines()[-1] == (
            "the engine failed: RuntimeError: boom in step; the server has shut down"
        )
    finally:
        server.stop()


@pytest.fixture(scope="module")
def idle_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = scripted(tmp_path_factory.mktemp("idle"), {"IDLE_TIMEOUT": "0.5"})
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def closed_after(port: int, payload: bytes, limit: float = 5.0) -> tuple[float, bytes]:
    """Send ``payload``, then stall; how long until the server closed, and what it sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=limit) as s:
        started = time.monotonic()
        if payload:
            s.sendall(payload)
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except TimeoutError:
            pytest.fail(f"the server kept a stalled connection open for {limit} s")
        return time.monotonic() - started, got


STALLS = {
    "nothing": b"",
    "partial-headers": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty",
    "partial-body": (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        b'content-length: 100\r\n\r\n{"prompt": '
    ),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", list(STALLS))
def test_stalled_connection_is_closed(idle_server: ServerProcess, name: str) -> None:
    seconds, got = closed_after(idle_server.port, STALLS[name])
    assert 0.4 < seconds < 3.0, seconds
    if name != "partial-body":  # the request never arrived: a 408 says why
        assert got.startswith(b"HTTP/1.1 408 "), got
        assert b'"invalid_request_error"' in got
    assert httpx.get(idle_server.url + "/health", timeout=5).status_code == 200


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "payload",
    [b"GARBAGE\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: zz\r\n\r\n"],
    ids=["request-line", "content-length"],
)
def test_malformed_http_gets_json(idle_server: ServerProcess, payload: bytes) -> None:
    _, got = closed_after(idle_server.port, payload)
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), got
    assert b"content-type: application/json" in head.lower()
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400


@pytest.mark.timeout(120)
def test_port_in_use_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = launch.run(serve_command(SIM, port), timeout=90, env=child_env())
    assert proc.returncode == 1, proc.stderr
    assert "speclens serving" not in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("INFO ")]
    assert lines == [f"--port: cannot listen on 127.0.0.1:{port}: Address already in use"], lines
