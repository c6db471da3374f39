"""The FastAPI application: OpenAI-compatible routes, SSE streaming, ``/debug/mtp_stats``,
``/metrics``. User input never yields a 500: every refusal is an OpenAI-style error body."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from speclens import __version__
from speclens.engine import RequestOutput, SamplingError, SamplingParams
from speclens.server.metrics import ServerMetrics
from speclens.server.prompts import PromptEncoder
from speclens.server.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    StatsLevel,
    choice_stats,
    error_body,
    root_metrics,
)
from speclens.server.runner import EngineDead, EngineRunner, Item, QueueFull


@dataclass
class ServerSettings:
    served_model_name: str
    api_key: str | None = None
    stats_level: StatsLevel = "none"
    default_max_tokens: int = 16
    max_body_bytes: int = 8 * 1024 * 1024
    max_n: int = 16
    #: Seconds a client may take to send a request's headers, or stall within its body.
    idle_timeout_s: float = 30.0
    #: What /version reports about acceptance (settings, and a resolution's provenance).
    acceptance: dict[str, Any] = field(default_factory=dict)
    #: vLLM's ``--enable-force-include-usage``: every stream ends with the usage chunk (and root
    #: ``metrics``) and every chunk carries usage, whatever the request's ``stream_options``.
    force_include_usage: bool = False


class _Guard:
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
            await _reply(send, 413, f"request body of {length} bytes exceeds {self.max_body}")
            return
        if (
            self.api_key
            and scope["path"].startswith("/v1/")
            and headers.get("authorization") != f"Bearer {self.api_key}"
        ):
            await _reply(send, 401, "invalid or missing API key")
            return
        if length is None and scope["method"] in ("POST", "PUT", "PATCH"):
            body, more = b"", True
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                body += message.get("body", b"")
                more = message.get("more_body", False)
                if len(body) > self.max_body:
                    await _reply(send, 413, f"request body exceeds {self.max_body} bytes")
                    return
            replayed = False

            async def replay() -> Message:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self.app(scope, replay, send)
            return
        await self.app(scope, receive, send)


async def _reply(send: Send, status: int, message: str) -> None:
    body = orjson.dumps(error_body(message, status))
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})


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


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _sse(data: Any) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def create_app(runner: EngineRunner, settings: ServerSettings) -> FastAPI:
    """The app around a runner; the runner's engine thread starts and stops with the app."""

    prompts = PromptEncoder(runner.engine.tokenizer, runner.engine.config.max_model_len)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runner.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            prompts.close()
            runner.stop()

    app = FastAPI(title="speclens", version=__version__, lifespan=lifespan)
    metrics = ServerMetrics(runner, settings.served_model_name)
    engine = runner.engine

    # ------------------------------------------------------------------ errors and guards
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> Response:
        return _json(error_body(exc.message, exc.status, exc.param), exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        message = "; ".join(_located(e) for e in exc.errors())
        return _json(error_body(message or "invalid request", 400, ".".join(loc) or None), 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> Response:
        return _json(error_body(str(exc.detail), exc.status_code), exc.status_code)

    app.add_middleware(_Guard, api_key=settings.api_key, max_body=settings.max_body_bytes)

    def _check_ready() -> None:
        if runner.error is not None:
            raise ApiError(503, f"{runner.error}; the server is shutting down")
        if not runner.ready:
            raise ApiError(503, "the engine is not ready")

    def _check_model(name: str | None) -> None:
        if name is not None and name != settings.served_model_name:
            raise ApiError(
                400, f"the model {name!r} does not exist; this server serves "
                f"{settings.served_model_name!r}", "model",
            )  # fmt: skip

    # ------------------------------------------------------------------ plain routes
    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if runner.ready else 503)

    @app.get("/version")
    async def version() -> Response:
        return _json(
            {
                "version": __version__,
                "engine": "speclens",
                "model": settings.served_model_name,
                "executor": engine.config.executor,
                "hardware": _hardware(engine.config.device),
                "acceptance": settings.acceptance,
            }
        )

    @app.get("/v1/models")
    async def models() -> Response:
        return _json(
            {
                "object": "list",
                "data": [
                    {
                        "id": settings.served_model_name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "speclens",
                        "root": engine.config.model,
                        "max_model_len": engine.config.max_model_len,
                    }
                ],
            }
        )

    @app.get("/debug/mtp_stats")
    async def mtp_stats() -> Response:
        _check_ready()
        return _json(runner.snapshot().stats.mtp_stats())

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # ------------------------------------------------------------------ generation
    async def _start(
        prompt: list[int], params: SamplingParams, request_id: str
    ) -> asyncio.Queue[Item]:
        _check_ready()
        if params.n > settings.max_n:
            raise ApiError(400, f"n must be at most {settings.max_n}, got {params.n}", "n")
        try:
            return await runner.submit(prompt, params, request_id)
        except QueueFull as exc:
            raise ApiError(503, str(exc)) from None
        except EngineDead as exc:
            raise ApiError(503, f"{exc}; the server is shutting down") from None
        except SamplingError as exc:
            raise ApiError(400, str(exc)) from None

    def _sampling(body: CompletionRequest | ChatCompletionRequest) -> SamplingParams:
        try:
            return body.sampling_params(settings.default_max_tokens)
        except SamplingError as exc:
            raise ApiError(400, str(exc)) from None

    async def _final(
        request: Request, q: asyncio.Queue[Item], request_id: str
    ) -> RequestOutput | None:
        """Wait for the finished output, aborting the request if the client goes away."""

        async def collect() -> RequestOutput | None:
            last = None
            while True:
                item = await q.get()
                if isinstance(item, EngineDead):
                    raise ApiError(500, str(item))
                if item is None or item.finished:
                    return item or last
                last = item

        async def watch() -> None:
            while not await request.is_disconnected():
                await asyncio.sleep(0.25)

        result = asyncio.ensure_future(collect())
        watcher = asyncio.ensure_future(watch())
        try:
            await asyncio.wait({result, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            runner.abort(request_id)
            raise
        finally:
            watcher.cancel()
        if not result.done():
            result.cancel()
            runner.abort(request_id)
            return None
        return result.result()

    def _stats_fields(out: RequestOutput, index: int) -> dict[str, Any]:
        if settings.stats_level == "none":
            return {}
        if len(out.outputs) != 1:  # one sequence's acceptance never stands for n of them
            return {"speculative_decoding_stats": None}
        return {
            "speculative_decoding_stats": choice_stats(
                out.outputs[index].acceptance, settings.stats_level
            )
        }

    def _root(out: RequestOutput) -> dict[str, Any]:
        if settings.stats_level == "none":
            return {}
        if len(out.outputs) != 1:
            return {"metrics": None}
        return {"metrics": root_metrics(out.outputs[0].acceptance, settings.stats_level)}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        _check_model(body.model)
        if body.echo or body.logprobs is not None:
            raise ApiError(
                400, "echo and logprobs are not supported", "echo" if body.echo else "logprobs"
            )
        prompt = body.prompt if isinstance(body.prompt, list) else await prompts.encode(body.prompt)
        if not prompt:
            raise ApiError(400, "the prompt is empty", "prompt")
        if not all(isinstance(t, int) for t in prompt):
            raise ApiError(400, "a token-id prompt must be a list of integers", "prompt")
        return await _generate(request, body, prompt, chat=False)  # type: ignore[arg-type]

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        _check_model(body.model)
        try:
            messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        except ValueError as exc:
            raise ApiError(400, str(exc), "messages") from None
        return await _generate(request, body, await prompts.encode_chat(messages), chat=True)

    async def _generate(
        request: Request,
        body: CompletionRequest | ChatCompletionRequest,
        prompt: list[int],
        chat: bool,
    ) -> Response:
        """Run one request: an SSE stream, or one body once it finishes (both endpoints)."""
        params = _sampling(body)
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        q = await _start(prompt, params, request_id)
        created = int(time.time())
        if body.stream:
            kind = "chat.completion.chunk" if chat else "text_completion"
            return StreamingResponse(
                _stream(request, q, request_id, body, created, kind, len(prompt)),
                media_type="text/event-stream",
            )
        out = await _final(request, q, request_id)
        if out is None:
            return Response(status_code=499)
        # vLLM's ``return_token_ids``: the generated ids, so a client can compare tokens.
        with_ids = (body.model_extra or {}).get("return_token_ids") is True
        choices = [
            {
                "index": c.index,
                **(
                    {"message": {"role": "assistant", "content": c.text}}
                    if chat
                    else {"text": c.text}
                ),
                "logprobs": None,
                "finish_reason": c.finish_reason,
                **({"token_ids": list(c.token_ids)} if with_ids else {}),
                **_stats_fields(out, c.index),
            }
            for c in out.outputs
        ]
        return _json(
            {
                "id": request_id,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": settings.served_model_name,
                "choices": choices,
                "usage": out.usage,
                **_root(out),
            }
        )

    async def _stream(
        request: Request,
        q: asyncio.Queue[Item],
        request_id: str,
        body: CompletionRequest | ChatCompletionRequest,
        created: int,
        kind: str,
        prompt_tokens: int,
    ) -> AsyncIterator[bytes]:
        chat = kind == "chat.completion.chunk"
        base = {
            "id": request_id,
            "object": kind,
            "created": created,
            "model": settings.served_model_name,
        }
        finished = False
        # vLLM's rule (``should_include_usage``): continuous usage only with include_usage; the
        # server flag forces both. Root ``metrics`` ride only the final usage chunk, as in vLLM.
        include_usage = settings.force_include_usage or body.include_usage
        continuous = settings.force_include_usage or (include_usage and body.continuous_usage)
        try:
            if chat:
                first: dict[str, Any] = {**base, "choices": [
                    {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                    for i in range(body.n)
                ]}  # fmt: skip
                if continuous:  # as vLLM: the role chunk counts the prompt, nothing generated
                    first["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": 0,
                                      "total_tokens": prompt_tokens}  # fmt: skip
                yield _sse(first)
            last: RequestOutput | None = None
            while True:
                out = await q.get()
                if isinstance(out, EngineDead):  # an error event, and no [DONE]: not a success
                    finished = True
                    yield _sse(error_body(str(out), 500))
                    return
                if out is None:
                    break
                last = out
                for choice in out.outputs:
                    text = out.new_text[choice.index]
                    done = choice.finish_reason is not None and out.finished
                    if not text and not done and not out.new_token_ids[choice.index]:
                        continue
                    piece: dict[str, Any] = {"delta": {"content": text}} if chat else {"text": text}
                    entry = {"index": choice.index, **piece, "logprobs": None,
                             "finish_reason": choice.finish_reason if out.finished else None}  # fmt: skip
                    if out.finished:
                        entry.update(_stats_fields(out, choice.index))
                    chunk: dict[str, Any] = {**base, "choices": [entry]}
                    if continuous:
                        chunk["usage"] = out.usage
                    yield _sse(chunk)
                if out.finished:
                    finished = True
                    break
            if finished and last is not None and include_usage:
                yield _sse({**base, "choices": [], "usage": last.usage, **_root(last)})
            yield b"data: [DONE]\n\n"
        finally:
            if not finished:  # the client went away, or the server is stopping
                runner.abort(request_id)

    return app
