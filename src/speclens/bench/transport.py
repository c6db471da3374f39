"""The client's HTTP: bounded body reads and a POST that is sent again when the server dropped
the connection before answering.

Bodies are bounded, so no response can make the client hold memory in proportion to what it
sends.
"""

from __future__ import annotations

import aiohttp

#: What a response can make the client hold or believe.
MAX_BODY_BYTES = 64 * 2**20  # a non-streamed body
MAX_ERROR_BYTES = 4096  # read of an error body (500 characters are kept)
#: Idle connections are closed by the client before servers close them: llama-server (httplib)
#: and uvicorn (vLLM, SGLang, speclens) close after 5 s, and a request sent on a connection the
#: server is closing fails with "server disconnected" (aiohttp's default keeps them 15 s).
KEEPALIVE_S = 2.0
#: Times a request is sent again when its connection dies before any byte of a response.
MAX_STALE_RETRIES = 2


async def read_at_most(resp: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """The body, or its first ``limit`` bytes and True when it is longer."""
    parts: list[bytes] = []
    size = 0
    async for part in resp.content.iter_any():
        parts.append(part)
        size += len(part)
        if size > limit:
            return b"".join(parts)[:limit], True
    return b"".join(parts), False
