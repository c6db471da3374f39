"""The client's HTTP: bounded, decoded body reads, a POST sent again when the server never
received it, redirects refused, and credentials kept out of what is written.

Bodies are bounded in decoded bytes and in time, so no response (a gzip bomb included) can make
the client hold memory in proportion to what it sends or run past ``--timeout``: the client
decodes ``Content-Encoding`` itself, a slice at a time, checking both bounds between slices.
"""

from __future__ import annotations

import contextlib
import errno
import time
import zlib
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import aiohttp
import orjson

#: What a response can make the client hold or believe (decoded bytes).
MAX_BODY_BYTES = 64 * 2**20  # a non-streamed body
MAX_STREAM_BYTES = 256 * 2**20  # a whole stream: far above any completion's
MAX_ERROR_BYTES = 4096  # read of an error body (500 characters are kept)
#: Decoded bytes handed on at a time, so the bounds are checked often however well a body packs.
SLICE_BYTES = 256 * 2**10
INPUT_STEP = 4 * 2**10  # encoded bytes inflated at a time
#: The encodings the client asks for and decodes; any other is a failed request.
ACCEPT_ENCODING = "gzip, deflate"
_WBITS = {"gzip": 47, "x-gzip": 47, "deflate": 47}  # 47: a gzip or zlib header, detected
#: Idle connections are closed by the client before servers close them: llama-server (httplib)
#: and uvicorn (vLLM, SGLang, speclens) close after 5 s, and a request sent on a connection the
#: server is closing fails with "server disconnected" (aiohttp's default keeps them 15 s).
KEEPALIVE_S = 2.0
#: Times a request is sent again when the server never received it: its connection died before
#: any byte of a response, or while the request body was being written.
MAX_STALE_RETRIES = 2


class BodyError(Exception):
    """A response body broke a bound or could not be decoded; the message names which."""


def session(timeout: float, **kwargs: object) -> aiohttp.ClientSession:
    """A session that leaves decoding to ``body_slices`` (bounded) instead of aiohttp."""
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=timeout),
        auto_decompress=False,
        **kwargs,  # type: ignore[arg-type]
    )


def _decoder(encoding: str) -> Callable[[bytes], Iterator[bytes]]:
    """Bytes of a body in ``encoding`` to decoded slices of at most ``SLICE_BYTES``."""
    name = encoding.strip().lower()
    if name in ("", "identity"):

        def plain(data: bytes) -> Iterator[bytes]:
            yield data

        return plain
    if name not in _WBITS:
        raise BodyError(
            f"the response's Content-Encoding {encoding[:40]!r} is not one of gzip, deflate"
        )
    inflate = zlib.decompressobj(_WBITS[name])

    def decode(data: bytes) -> Iterator[bytes]:
        view = memoryview(data)
        try:
            for start in range(0, len(view), INPUT_STEP):  # a short input: a cheap tail to copy
                tail: bytes | memoryview = view[start : start + INPUT_STEP]
                while tail and not inflate.eof:
                    piece = inflate.decompress(tail, SLICE_BYTES)
                    tail = inflate.unconsumed_tail
                    if not piece:
                        break
                    yield piece
        except zlib.error as exc:
            raise BodyError(f"the response's {name} body cannot be decoded: {exc}") from None

    return decode


async def body_slices(
    resp: aiohttp.ClientResponse,
    limit: int | None,
    deadline: float | None = None,
    timeout: float = 0.0,
    *,
    decode: bool = True,
) -> AsyncGenerator[bytes]:
    """The decoded body, a slice at a time. Raises ``BodyError`` once more than ``limit`` (None:
    no bound) decoded bytes arrived, or ``time.perf_counter()`` passed ``deadline`` (``timeout``
    seconds after the request was sent). ``decode=False``: the session decoded it already
    (aiohttp's default, unbounded)."""
    inflate = _decoder(resp.headers.get("Content-Encoding", "") if decode else "")
    size = 0
    async for raw in resp.content.iter_any():
        for piece in inflate(raw):
            now = time.perf_counter()
            size += len(piece)
            if (deadline is not None and now > deadline) or (limit is not None and size > limit):
                raise BodyError(broken_bound(now, deadline, limit, timeout))
            yield piece


def is_plain(resp: aiohttp.ClientResponse) -> bool:
    """Whether the body comes as it was sent (no ``Content-Encoding`` to decode)."""
    return resp.headers.get("Content-Encoding", "").strip().lower() in ("", "identity")


def broken_bound(now: float, deadline: float | None, limit: int | None, timeout: float) -> str:
    """Which bound a body read broke (the deadline first): the ``BodyError`` message."""
    if deadline is not None and now > deadline:
        return f"timed out after {timeout:g} s reading the body"
    return f"the response exceeded {limit} decoded bytes"


async def read_at_most(
    resp: aiohttp.ClientResponse,
    limit: int,
    deadline: float | None = None,
    timeout: float = 0.0,
    *,
    decode: bool = True,
) -> tuple[bytes, bool]:
    """The decoded body, or its first ``limit`` bytes and True when it is longer. Raises
    ``BodyError`` on a body that cannot be decoded or past the deadline."""
    parts: list[bytes] = []
    size = 0
    slices = body_slices(resp, None, deadline, timeout, decode=decode)
    async with contextlib.aclosing(slices):
        async for part in slices:
            parts.append(part)
            size += len(part)
            if size > limit:
                return b"".join(parts)[:limit], True
    return b"".join(parts), False


def redirect_problem(resp: aiohttp.ClientResponse) -> str | None:
    """A redirect is never followed (the prompts would go to a server the run does not name):
    it fails the request, naming where it pointed."""
    if not 300 <= resp.status < 400:
        return None
    location = resp.headers.get("Location")
    where = f"to {redact(location)[:300]!r}" if location else "without a Location"
    return f"HTTP {resp.status}: a redirect {where}, not followed"


def _unsent(exc: aiohttp.ClientError) -> bool:
    """The server answered nothing on a connection it dropped (``session.post`` returns at the
    response's status line, so anything it raises came before a byte of a response): a
    kept-alive connection it had closed (``ServerDisconnectedError``), or one it reset while
    the request was being written ("Can not write request body", or the reset read first).
    A connection that was never made is not retried."""
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return True
    if not isinstance(exc, aiohttp.ClientOSError) or isinstance(exc, aiohttp.ClientConnectorError):
        return False
    return exc.errno in _DROPPED or "Can not write request body" in str(exc)


_DROPPED = frozenset({errno.ECONNRESET, errno.EPIPE})


async def post(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> aiohttp.ClientResponse:
    """POST without following redirects, sent again (at most ``MAX_STALE_RETRIES`` times) on a
    fresh connection when the server never received it (``_unsent``): llama-server advertises
    keep-alive on a stream, then closes. Nothing was answered, so nothing was served twice; a
    failure after the response began is never retried."""
    for attempt in range(MAX_STALE_RETRIES + 1):
        try:
            return await session.post(url, data=body, headers=headers, allow_redirects=False)
        except aiohttp.ClientError as exc:
            if attempt == MAX_STALE_RETRIES or not _unsent(exc):
                raise
    raise AssertionError("unreachable")


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (``user:***@host``; a user name alone may be
    a token: ``***@host``), for what is written."""
    secret = _userinfo(url)
    return url if secret is None else url.replace(secret, _shown(secret), 1)


def _shown(userinfo: str) -> str:
    user, colon, _ = userinfo.partition(":")
    return f"{user}:***@" if colon else "***@"


def _userinfo(url: str) -> str | None:
    """The ``user:password@`` (or ``user@``) part of ``url`` as written, or None."""
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        return None
    userinfo, at, _ = netloc.rpartition("@")
    return userinfo + at if at else None


@dataclass(frozen=True)
class Redactor:
    """Replaces each run URL's ``user:password@`` with ``user:***@`` in what is written (files
    and console), wherever it appears: settings, replica names, error messages."""

    pairs: tuple[tuple[str, str], ...] = ()

    @classmethod
    def for_urls(cls, urls: Iterable[str]) -> Redactor:
        pairs: dict[str, str] = {}
        for url in urls:
            secret = _userinfo(url)
            if secret is None:
                continue
            shown = _shown(secret)
            for form in (secret, unquote(secret)):
                pairs[form] = shown
                pairs[orjson.dumps(form).decode()[1:-1]] = shown  # as a JSON string holds it
        return cls(tuple(sorted(pairs.items(), key=lambda p: -len(p[0]))))

    def text(self, text: str) -> str:
        for secret, shown in self.pairs:
            text = text.replace(secret, shown)
        return text

    def raw(self, data: bytes) -> bytes:
        for secret, shown in self.pairs:
            data = data.replace(secret.encode(), shown.encode())
        return data

    def data(self, value: Any) -> Any:
        """``value`` (JSON-shaped) with every string and key redacted."""
        if not self.pairs:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.data(k): self.data(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self.data(v) for v in value)
        return value
