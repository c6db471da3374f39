"""A trivially fast OpenAI-style server for load-shape tests: every completion is one streamed
content chunk with usage, then ``[DONE]``. It runs in its own process (``python canned_server.py
PORT``), so its work never delays the client's event loop; ``running_canned`` starts it on a free
loopback port, waits for ``/health`` and always stops it.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

CHUNK = (
    b'data: {"id":"c","object":"text_completion","model":"canned","choices":[{"index":0,'
    b'"text":"a","finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,'
    b'"total_tokens":2}}\n\ndata: [DONE]\n\n'
)


def main(port: int) -> None:
    from aiohttp import web

    async def completions(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=CHUNK, content_type="text/event-stream")

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


@contextlib.contextmanager
def running_canned(port: int) -> Iterator[str]:
    """The server's base URL while it runs."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__)), str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"canned server exited: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("canned server not healthy after 30 s")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


if __name__ == "__main__":
    main(int(sys.argv[1]))
