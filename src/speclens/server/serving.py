"""The app under uvicorn, with the guarantees a long benchmark run needs from its server.

- The caller binds the port first (``bind``), so "address in use" is its one-line refusal, and
  "serving" is logged only once the socket listens.
- A request must arrive in time: its headers within ``idle_timeout`` of their first byte, its
  body with no gap longer than ``idle_timeout``; a stalled connection is closed (headers: with a
  408). uvicorn's own keep-alive timeout covers idle connections between requests.
- A malformed request (bad request line, bad Content-Length) is answered with an OpenAI-style
  JSON 400 rather than uvicorn's plain text.
- When the engine dies, the server stops accepting work and shuts down; the caller reads
  ``runner.error`` and exits non-zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from typing import Any

import h11
import orjson
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from speclens.server.protocol import error_body
from speclens.server.runner import EngineRunner


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port``, not yet listening; raises ``OSError``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _raw_json(status: int, reason: str, message: str) -> bytes:
    body = orjson.dumps(error_body(message, status))
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class _Connection(H11Protocol):
    """uvicorn's h11 connection with request timeouts and JSON framing errors."""

    idle_timeout: float = 30.0
    _timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request already buffered
        if self.conn.their_state is not h11.IDLE:  # (idle: uvicorn's keep-alive timer)
            self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)

    def _watch(self) -> None:
        """Arm or disarm the timer for what the client owes us now."""
        if self.transport.is_closing():
            self._cancel()
        elif self.conn.their_state is h11.SEND_BODY:  # the body: restart on every piece
            self._arm()
        elif self.conn.their_state is h11.IDLE:  # the headers: one deadline, not reset
            if self._timer is None:
                self._arm()
        else:  # the request is in: the app has it
            self._cancel()

    def _arm(self) -> None:
        self._cancel()
        self._timer = self.loop.call_later(self.idle_timeout, self._timed_out)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE:
            message = f"the request did not arrive within {self.idle_timeout:g} s"
            self.transport.write(_raw_json(408, "Request Timeout", message))
        self.transport.close()  # a stalled body: the app sees the client disconnect

    def send_400_response(self, msg: str) -> None:
        self.transport.write(_raw_json(400, "Bad Request", f"malformed HTTP request: {msg}"))
        self.transport.close()


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_listening: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_listening = on_listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._on_listening()


def serve(
    app: Any,
    runner: EngineRunner,
    sock: socket.socket,
    idle_timeout: float,
    on_listening: Callable[[], None],
) -> None:
    """Serve ``app`` on the bound ``sock`` until a signal, or until the runner's engine dies."""
    connection = type("Connection", (_Connection,), {"idle_timeout": idle_timeout})
    config = uvicorn.Config(app, http=connection, log_level="warning", timeout_graceful_shutdown=5)
    server = _Server(config, on_listening)
    runner.on_dead = lambda _: setattr(server, "should_exit", True)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises SIGINT once it has stopped
        server.run(sockets=[sock])
