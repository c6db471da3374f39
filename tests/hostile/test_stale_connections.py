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
import json
from pathlib import Path

from garbage_server import GarbageServer, Reply, sse

CHUNK = {"choices": [{"index": 0, "text": "a", "finish_reason": None}]}


class OneRequestPerConnection(GarbageServer):
    """Answers the first request of a connection (saying keep-alive), then reads the next request
    on it and closes without a byte of response."""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await super()._serve(reader, writer)
        await self._read(reader)  # the request on the kept-alive connection: no response

    @property
    def posts(self) -> int:
        return sum(1 for r in self.requests if r.method == "POST")


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
