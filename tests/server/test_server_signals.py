"""SIGTERM and SIGINT end the server cleanly: exit code 0 within ~10 s, idle or with a stream in
flight, and the in-flight stream ends (an abort or a closed connection) instead of hanging.

Each test runs the SIGTERM and the SIGINT server side by side, so the shutdown grace periods
overlap; the assertion message names the signal that misbehaved."""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from childtime import within
from serverkit import FORCED, ServerProcess

pytestmark = pytest.mark.integration

SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT}


def exit_within() -> float:
    """10 s on a quiet machine (the 5 s grace period and the engine's stop), stretched by the
    load as the children's start-up is (``childtime``)."""
    return max(10.0, within(6.0))


def _exit_code(server: ServerProcess, sig: int) -> tuple[int | None, float]:
    sent = time.monotonic()
    server.send_signal(sig)
    try:
        code = server.wait(timeout=exit_within() + 5)
    except Exception:
        code = None
    return code, time.monotonic() - sent


def test_signal_while_idle_exits_0(serve_once: Any) -> None:
    servers = serve_once(FORCED, FORCED)
    outcome = {}
    for (name, sig), server in zip(SIGNALS.items(), servers, strict=True):
        outcome[name] = _exit_code(server, sig)
    for name, (code, seconds) in outcome.items():
        assert code == 0 and seconds < exit_within(), (name, outcome)


@dataclass
class StreamWatch:
    """Reads a long stream on a thread and records how it ended."""

    url: str
    started: threading.Event = field(default_factory=threading.Event)
    events: list[str] = field(default_factory=list)
    error: str | None = None
    ended_at: float | None = None

    def run(self) -> None:
        body = {
            "prompt": "a very long story",
            "max_tokens": 16000,
            "ignore_eos": True,
            "stream": True,
        }
        try:
            with httpx.stream(
                "POST", self.url + "/v1/completions", json=body, timeout=httpx.Timeout(30.0)
            ) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[len("data: ") :])
                        if len(self.events) >= 3:
                            self.started.set()
        except httpx.HTTPError as exc:
            self.error = repr(exc)
        finally:
            self.ended_at = time.monotonic()
            self.started.set()

    @property
    def finish_reasons(self) -> list[str]:
        return [
            c["finish_reason"]
            for e in self.events
            if e != "[DONE]"
            for c in json.loads(e)["choices"]
            if c["finish_reason"]
        ]


def test_signal_with_stream_in_flight(serve_once: Any) -> None:
    args = [*FORCED, "--executor", "sim", "--max-model-len", "16384"]
    servers = serve_once(args, args)
    watches = [StreamWatch(s.url) for s in servers]
    threads = [threading.Thread(target=w.run, daemon=True) for w in watches]
    for t in threads:
        t.start()
    for w in watches:
        assert w.started.wait(30), "the stream never started"
    sent = time.monotonic()
    for (_, sig), server in zip(SIGNALS.items(), servers, strict=True):
        server.send_signal(sig)
    outcome = {}
    for name, server, watch, thread in zip(SIGNALS, servers, watches, threads, strict=True):
        try:
            code: int | None = server.wait(timeout=exit_within() + 5)
        except Exception:
            code = None
        exited = time.monotonic() - sent
        thread.join(timeout=exit_within())
        outcome[name] = {
            "code": code,
            "exit_s": round(exited, 2),
            "stream_ended": not thread.is_alive(),
            "stream_s": None if watch.ended_at is None else round(watch.ended_at - sent, 2),
            "error": watch.error,
            "finish_reasons": watch.finish_reasons,
            "done": bool(watch.events) and watch.events[-1] == "[DONE]",
        }
    for name, o in outcome.items():
        assert o["stream_ended"], (name, outcome)
        assert o["stream_s"] is not None and o["stream_s"] < exit_within(), (name, outcome)
        # Ended by an abort or a dropped connection, never by running to its length.
        assert "length" not in o["finish_reasons"], (name, outcome)
        assert o["error"] is not None or o["finish_reasons"] == ["abort"], (name, outcome)
    for name, o in outcome.items():
        assert o["code"] == 0 and o["exit_s"] < exit_within(), (name, outcome)
