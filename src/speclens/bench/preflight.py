"""The check before a bench run: is the server there, and does it serve the model?

``GET /v1/models`` first (bounded by ``CONNECT_TIMEOUT_S``: an unreachable URL fails fast), then,
when the server lists its models there, one tiny request (``max_tokens`` 1) to the run's route,
neither counted nor written. The tiny request is the referee: llama.cpp lists a file name and
ignores the model a request names, so a name missing from the list is refused only when the
server also refuses the request. A server without ``/v1/models`` (a plain stand-in) is taken as
reachable and the run goes on; what it answers is the run's to report.
"""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

from speclens.bench import transport

#: Seconds ``GET /v1/models`` may take, connection included: an unreachable URL fails within it.
CONNECT_TIMEOUT_S = 4.0
#: The most bytes read of a preflight answer.
PREFLIGHT_BODY_BYTES = 1 * 2**20
#: The most served names a message lists.
MAX_NAMES = 10
#: Paths a ``--url`` must not end in: the client adds them itself.
ENDPOINT_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/completion",
                  "/generate")  # fmt: skip


class PreflightError(Exception):
    """The server cannot be measured; the message is one line naming the URL."""


def endpoint_suffix(path: str) -> str | None:
    """The endpoint path a ``--url`` path ends in (``/v1/completions`` ...), or None."""
    path = path.rstrip("/")
    return next((p for p in ENDPOINT_PATHS if path.endswith(p)), None)


def served_names(body: object) -> list[str] | None:
    """The model ids of an OpenAI ``/v1/models`` answer (``{"data": [{"id": ...}]}``), or None
    when the body is not that shape."""
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        return None
    return [m["id"] for m in body["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)]


def _listed(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:MAX_NAMES])
    more = f" and {len(names) - MAX_NAMES} more" if len(names) > MAX_NAMES else ""
    return (shown + more) if names else "none"


def tiny_request(endpoint: str, model: str) -> tuple[str, bytes]:
    """The route and body of the one-token request for ``endpoint`` (completions, chat)."""
    if endpoint == "chat":
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
        return "/v1/chat/completions", orjson.dumps(body)
    body2 = {"model": model, "prompt": "Hi", "max_tokens": 1}
    return "/v1/completions", orjson.dumps(body2)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return "no answer"
    if isinstance(exc, aiohttp.ClientConnectorError):
        if isinstance(exc.os_error, ConnectionRefusedError):
            return "cannot connect (connection refused)"
        return f"cannot connect ({exc.os_error.strerror or exc.os_error})"
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


async def preflight(
    url: str,
    model: str,
    endpoint: str,
    api_key: str | None = None,
    timeout: float = 60.0,
    connect_timeout: float = CONNECT_TIMEOUT_S,
) -> str | None:
    """Check ``url`` before a run; raises ``PreflightError`` (one line naming the URL) when it
    cannot be measured. Returns a note (the served names did not include ``model`` but the
    server answered it, as llama.cpp does) or None. ``timeout`` bounds the tiny request."""
    shown = transport.redact(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    base = url.rstrip("/")
    try:
        async with (
            transport.session(connect_timeout, headers=headers) as session,
            session.get(base + "/v1/models", allow_redirects=False) as resp,
        ):
            status = resp.status
            raw, _ = await transport.read_at_most(resp, PREFLIGHT_BODY_BYTES)
    except (aiohttp.ClientError, transport.BodyError, TimeoutError, OSError) as exc:
        waited = f" within {connect_timeout:g} s" if isinstance(exc, TimeoutError) else ""
        raise PreflightError(
            f"bench: {shown}: {_reason(exc)}{waited}; is the server running?"
        ) from None
    if status != 200:
        return None  # no model list (a plain stand-in): the run reports what it answers
    try:
        names = served_names(orjson.loads(raw))
    except orjson.JSONDecodeError:
        names = None
    if names is None or endpoint == "native":
        return None
    route, body = tiny_request(endpoint, model)
    try:
        async with transport.session(timeout, headers=headers) as session:
            resp = await transport.post(
                session, base + route, body, {"Content-Type": "application/json"}
            )
            async with resp:
                answer = resp.status
                text, _ = await transport.read_at_most(resp, PREFLIGHT_BODY_BYTES)
    except (aiohttp.ClientError, transport.BodyError, TimeoutError, OSError) as exc:
        waited = f" within {timeout:g} s" if isinstance(exc, TimeoutError) else ""
        raise PreflightError(
            f"bench: {shown}: a 1-token request to {route} failed: {_reason(exc)}{waited}"
        ) from None
    if answer == 200:
        if model in names:
            return None
        return (
            f"bench: {shown} lists {_listed(names)}, not {model!r}, and answers it "
            "(a server that ignores the model name)"
        )
    if model not in names:
        raise PreflightError(
            f"bench: --model: {shown} does not serve {model!r}; it serves {_listed(names)}"
        )
    snippet = text.decode("utf-8", "replace").strip().replace("\n", " ")[:200]
    raise PreflightError(
        f"bench: {shown}: a 1-token request to {route} for {model!r} got HTTP {answer}: {snippet}"
    )


async def preflight_all(
    urls: list[str], model: str, endpoint: str, api_key: str | None, timeout: float
) -> list[str]:
    """``preflight`` of every replica, concurrently; the notes, or the first failure raised."""
    found = await asyncio.gather(
        *(preflight(u, model, endpoint, api_key, timeout) for u in urls), return_exceptions=True
    )
    for item in found:
        if isinstance(item, BaseException):
            raise item
    return [n for n in found if isinstance(n, str)]
