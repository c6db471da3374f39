"""The ASGI guard in front of the app: the API key on /v1/*, and the body limit."""

from __future__ import annotations

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from speclens.server.protocol import error_body


class Guard:
    """Pure ASGI (so ``Request.is_disconnected`` still sees the client): the API key on /v1/*,
    and the body limit, by Content-Length or, for a chunked upload, by counting."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_body: int) -> None:
        self.app, self.api_key, self.max_body = app, api_key, max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            await reply(send, 413, f"request body of {length} bytes exceeds {self.max_body}")
            return
        if (
            self.api_key
            and scope["path"].startswith("/v1/")
            and headers.get("authorization") != f"Bearer {self.api_key}"
        ):
            await reply(send, 401, "invalid or missing API key")
            return
        if length is None and scope["method"] in ("POST", "PUT", "PATCH"):
            await self._counted(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _counted(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A body without Content-Length: read it whole, counting, then replay it to the app."""
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body:
                await reply(send, 413, f"request body exceeds {self.max_body} bytes")
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def reply(send: Send, status: int, message: str) -> None:
    """An OpenAI-style JSON error, sent straight on the ASGI channel."""
    body = orjson.dumps(error_body(message, status))
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})
