"""A server that advertises keep-alive but drops the connection after one response.

llama-server (b11434, cpp-httplib) answers a stream with ``Keep-Alive: timeout=5, max=100`` and
then closes the connection; the next request the client sends on it gets no response at all
(curl retries such a request on a new connection; aiohttp raises ``ServerDisconnectedError``).
Seen against the real server: every second request of a ``concurrency 1`` run failed. A request
whose connection dies before any byte of a response is sent again on a fresh connection (at most
``MAX_STALE_RETRIES`` times); one that fails after the response began is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

from garbage_server import GarbageServer, Reply, sse

CHUNK = {"choices": [{"index": 0, "text": "a", "finish_reason": None}]}


class OneRequestPerConnection(GarbageServer):
    """Answers the first request of a connection (saying keep-alive), then reads the next request
    on it and closes without a byte of response."""

    posts = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            for served in range(2):
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode("latin-1").split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                await reader.readexactly(length)
                if served == 1:
                    return  # the request on the kept-alive connection: no response
                if not head.startswith(b"POST "):  # the server checks (/version, /metrics)
                    await self._send(writer, Reply(404, body=b"not found"))
                    return
                self.posts += 1
                await self._send(writer, self._reply_for_post())
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _reply_for_post(self) -> Reply:
        assert isinstance(self.script, Reply)
        return self.script


def test_a_connection_dropped_before_the_response_is_retried_not_failed(
    run_cli, tmp_path: Path
) -> None:
    reply = Reply(headers={"Connection": "keep-alive"}, chunks=sse(CHUNK, CHUNK))
    with OneRequestPerConnection(reply) as server:
        code, stdout, stderr = run_cli(
            "bench", "--url", server.url, "--model", "m", "--num-requests", "6",
            "--concurrency", "1", "--max-tokens", "2", "--warmup", "0",
            "--output-dir", tmp_path,
        )  # fmt: skip
        answered = server.posts
    rows = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert [row["error"] for row in rows] == [None] * 6, stdout + stderr
    assert code == 0
    assert answered == 6  # each request answered once: the dropped attempts got nothing
