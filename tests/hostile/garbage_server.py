"""A scripted HTTP stand-in for an OpenAI-compatible server that answers with garbage on purpose.

A raw asyncio server (not a web framework), so a reply can be anything: any status, any headers,
bytes that are not UTF-8, a stream cut off mid-chunk. It runs on 127.0.0.1, on a free port, in a
background thread with its own event loop, and stops when the ``with`` block ends::

    from garbage_server import GarbageServer, Reply, sse

    with GarbageServer(Reply(chunks=sse({"choices": "oops"}))) as server:
        ...  # point the client at server.url; server.requests holds what it received

``GarbageServer(script)`` answers every POST from ``script``: one ``Reply`` (used for every
request), a list of them (one per request, in order, the last one repeated), or a function of the
request (``Request``) returning a ``Reply``. GET requests (``/version``, ``/metrics``) get
``get.get(path)`` or a 404.

A ``Reply`` body is ``body`` (sent with a Content-Length) or ``chunks`` (sent with chunked
transfer encoding, one HTTP chunk each, ``chunk_delay`` seconds apart). ``delay`` waits before the
status line; ``close_after=N`` sends N chunks then drops the connection without the terminating
chunk (a truncated stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = ["GarbageServer", "Reply", "Request", "sse"]


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    chunks: list[bytes] | None = None
    delay: float = 0.0
    chunk_delay: float = 0.0
    close_after: int | None = None


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


def sse(*events: object, done: bool = True) -> list[bytes]:
    """SSE chunks, one per event: bytes go out as they are, a str becomes ``data: <str>``, any
    other value ``data: <its JSON>``; ``done`` appends ``data: [DONE]``."""
    out = []
    for event in events:
        if isinstance(event, bytes):
            out.append(event)
        elif isinstance(event, str):
            out.append(b"data: " + event.encode() + b"\n\n")
        else:
            out.append(b"data: " + orjson.dumps(event) + b"\n\n")
    if done:
        out.append(b"data: [DONE]\n\n")
    return out


Script = Reply | Sequence[Reply] | Callable[[Request], Reply]


class GarbageServer:
    def __init__(self, script: Script, get: dict[str, Reply] | None = None) -> None:
        self.script = script
        self.get = get or {}
        self.requests: list[Request] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> GarbageServer:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop
        )
        self._server = future.result(timeout=10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def _reply(self, request: Request) -> Reply:
        if request.method != "POST":
            return self.get.get(request.path, Reply(404, body=b"not found"))
        script = self.script
        if isinstance(script, Reply):
            return script
        if callable(script):
            return script(request)
        posts = sum(1 for r in self.requests if r.method == "POST")
        return script[min(posts, len(script)) - 1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One request, one reply, then the connection closes (subclasses serve otherwise)."""
        request = await self._read(reader)
        self.requests.append(request)
        await self._send(writer, self._reply(request))

    @staticmethod
    async def _read(reader: asyncio.StreamReader) -> Request:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        return Request(method, path, headers, body)

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, reply: Reply) -> None:
        if reply.delay:
            await asyncio.sleep(reply.delay)
        headers = {"Connection": "close", **reply.headers}
        if reply.chunks is None:
            headers.setdefault("Content-Length", str(len(reply.body or b"")))
            headers.setdefault("Content-Type", "application/json")
        else:
            headers.setdefault("Transfer-Encoding", "chunked")
            headers.setdefault("Content-Type", "text/event-stream")
        head = f"HTTP/1.1 {reply.status} X\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in headers.items()
        )
        writer.write(head.encode("latin-1") + b"\r\n")
        if reply.chunks is None:
            writer.write(reply.body or b"")
            await writer.drain()
            return
        for i, chunk in enumerate(reply.chunks):
            if reply.close_after is not None and i >= reply.close_after:
                await writer.drain()
                writer.transport.abort()
                return
            if i and reply.chunk_delay:
                await asyncio.sleep(reply.chunk_delay)
            if chunk:
                writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
