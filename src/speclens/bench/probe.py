"""``--backend auto``: which engine serves a URL, found by its own info routes before the run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import orjson

from speclens.bench import transport
from speclens.bench.wire import Backend

#: Auto-detection's bounds: all probes of one server together, and each probe's body.
PROBE_TIMEOUT_S = 10.0
PROBE_BODY_BYTES = 1 * 2**20


@dataclass(frozen=True)
class Probe:
    """What ``--backend auto`` found at a URL and why (``evidence``, for the run's settings)."""

    backend: Backend
    evidence: str


def _sglang_info(body: object) -> bool:
    """SGLang's ``GET /get_model_info`` (``model_path``, ``is_generation``, ...) or ``GET
    /get_server_info`` (its server arguments plus ``version``); entrypoints/http_server.py."""
    return (
        isinstance(body, dict)
        and "model_path" in body
        and ("is_generation" in body or "version" in body)
    )


def llamacpp_props(body: object) -> bool:
    """llama.cpp's ``GET /props`` carries ``build_info`` and ``default_generation_settings``
    (tools/server/server-context.cpp, ``get_res_props``)."""
    return isinstance(body, dict) and "build_info" in body and "default_generation_settings" in body


PROBES: tuple[tuple[str, Backend, Callable[[object], bool]], ...] = (
    ("/get_model_info", "sglang", _sglang_info),
    ("/get_server_info", "sglang", _sglang_info),
    ("/props", "llamacpp", llamacpp_props),
)


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, bytes, str | None]:
    """A probe's status and body, or why it tells nothing (never a redirect followed)."""
    async with session.get(url, allow_redirects=False) as resp:
        redirect = transport.redirect_problem(resp)
        if redirect is not None:
            return resp.status, b"", redirect
        raw, longer = await transport.read_at_most(resp, PROBE_BODY_BYTES)
        if resp.status != 200:
            return resp.status, b"", f"HTTP {resp.status}"
        return resp.status, raw, "too long" if longer else None


async def probe_backend(url: str, api_key: str | None = None) -> Probe:
    """Which engine serves ``url``: SGLang or llama.cpp by their own info routes, else openai.
    Bounded (``PROBE_TIMEOUT_S`` in all, ``PROBE_BODY_BYTES`` a body) and never raises: a
    server that answers none of the probes is an OpenAI-compatible server."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    misses: list[str] = []
    try:
        async with transport.session(PROBE_TIMEOUT_S, headers=headers) as session:
            for path, backend, matches in PROBES:
                try:
                    _, raw, miss = await _get(session, url.rstrip("/") + path)
                except (aiohttp.ClientError, transport.BodyError) as exc:
                    misses.append(f"{path}: {type(exc).__name__}")
                    continue
                if miss is not None:
                    misses.append(f"{path}: {miss}")
                    continue
                try:
                    body = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    misses.append(f"{path}: not JSON")
                    continue
                if matches(body):
                    return Probe(backend, f"GET {path} answered as {backend} does")
                misses.append(f"{path}: not {backend}'s shape")
    except TimeoutError:
        misses.append(f"the probes took over {PROBE_TIMEOUT_S:g} s")
    except Exception as exc:  # detection never takes the run down
        misses.append(f"{type(exc).__name__}: {exc}")
    return Probe("openai", "no SGLang or llama.cpp info route answered (" + "; ".join(misses) + ")")
