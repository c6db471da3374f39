"""The FastAPI application: OpenAI-compatible routes, SSE streaming, ``/debug/mtp_stats``,
``/metrics``. User input never yields a 500: every refusal is an OpenAI-style error body.

The parts: ``guard`` (API key, body limit), ``generation`` (the two generation endpoints),
``prompts`` (tokenizing off the event loop), the informational routes and error handlers here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from speclens import __version__
from speclens.server.generation import Generation, add_generation_routes, check_ready
from speclens.server.generation import json_response as _json
from speclens.server.guard import Guard
from speclens.server.metrics import ServerMetrics
from speclens.server.prompts import PromptEncoder
from speclens.server.protocol import ApiError, error_body
from speclens.server.runner import EngineRunner
from speclens.server.settings import ServerSettings

__all__ = ["ApiError", "ServerSettings", "create_app"]


def create_app(runner: EngineRunner, settings: ServerSettings) -> FastAPI:
    """The app around a runner; the runner's engine thread starts and stops with the app."""
    engine = runner.engine
    prompts = PromptEncoder(engine.tokenizer, engine.config.max_model_len)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runner.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            prompts.close()
            runner.stop()

    app = FastAPI(title="speclens", version=__version__, lifespan=lifespan)
    _add_error_handlers(app)
    app.add_middleware(Guard, api_key=settings.api_key, max_body=settings.max_body_bytes)
    _add_info_routes(app, runner, settings, ServerMetrics(runner, settings.served_model_name))
    add_generation_routes(app, Generation(runner, settings, prompts))
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error, ours, pydantic's and Starlette's, as an OpenAI-style body."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> Response:
        return _json(error_body(exc.message, exc.status, exc.param), exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        param = ".".join(loc) or (first.get("ctx") or {}).get("field")
        message = "; ".join(_located(e) for e in exc.errors())
        return _json(error_body(message or "invalid request", 400, param or None), 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> Response:
        return _json(error_body(str(exc.detail), exc.status_code), exc.status_code)


def _add_info_routes(
    app: FastAPI, runner: EngineRunner, settings: ServerSettings, metrics: ServerMetrics
) -> None:
    """/health, /version, /v1/models, /debug/mtp_stats and /metrics."""
    config = runner.engine.config

    @app.get("/health")
    async def health() -> Response:
        """200 while the engine serves; 503 before it starts, once it has failed, and as soon
        as a tensor-parallel rank has ended or stopped answering."""
        healthy = runner.ready and runner.engine.failure is None
        return Response(status_code=200 if healthy else 503)

    @app.get("/version")
    async def version() -> Response:
        return _json(
            {
                "version": __version__,
                "engine": "speclens",
                "model": settings.served_model_name,
                "executor": config.executor,
                "dtype": config.dtype,
                "hardware": _hardware(config.device),
                "acceptance": settings.acceptance,
                "max_num_seqs": config.max_num_seqs,
            }
        )

    @app.get("/v1/models")
    async def models() -> Response:
        model = {
            "id": settings.served_model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "speclens",
            "root": config.model,
            "max_model_len": config.max_model_len,
        }
        return _json({"object": "list", "data": [model]})

    @app.get("/debug/mtp_stats")
    async def mtp_stats() -> Response:
        """ATOM's counters, plus ``request_spread``: the realized spread between finished
        requests (``server.spread``)."""
        check_ready(runner)
        snap = runner.snapshot()
        return _json(snap.stats.mtp_stats() | {"request_spread": snap.request_spread})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _hardware(device: str) -> str:
    """The chip this server computes on, as a catalog-style name (cpu-x86_64, or the GPU's)."""
    import platform

    if device.startswith("cuda"):
        import torch

        return str(torch.cuda.get_device_name(torch.device(device)))
    return f"cpu-{platform.machine()}"


def _located(error: Any) -> str:
    """One pydantic error as ``field.path: message`` (just the message for the whole body)."""
    loc = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
    return f"{loc}: {error.get('msg')}" if loc else str(error.get("msg"))
