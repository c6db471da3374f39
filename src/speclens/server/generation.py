"""The two generation endpoints, ``/v1/completions`` and ``/v1/chat/completions``: a prompt to
the runner, then one body once the request finishes, or an SSE stream as it runs."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from speclens.engine import RequestOutput, SamplingError, SamplingParams
from speclens.server.prompts import PromptEncoder
from speclens.server.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    choice_stats,
    error_body,
    root_metrics,
)
from speclens.server.runner import EngineDead, EngineRunner, Item, QueueFull
from speclens.server.settings import ServerSettings

Body = CompletionRequest | ChatCompletionRequest


def json_response(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def sse(data: Any) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def check_ready(runner: EngineRunner) -> None:
    """503 while the engine is not ready, or once it has died."""
    if runner.error is not None:
        raise ApiError(503, f"{runner.error}; the server is shutting down")
    if not runner.ready:
        raise ApiError(503, "the engine is not ready")


def add_generation_routes(app: FastAPI, gen: Generation) -> None:
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await gen.completions(body, request)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        return await gen.chat(body, request)


class Generation:
    """What both endpoints share: checks, submission, waiting, and the response shapes."""

    def __init__(
        self, runner: EngineRunner, settings: ServerSettings, prompts: PromptEncoder
    ) -> None:
        self.runner, self.settings, self.prompts = runner, settings, prompts

    # ------------------------------------------------------------------ the endpoints
    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        self._check_model(body.model)
        if body.echo or body.logprobs is not None:
            raise ApiError(
                400, "echo and logprobs are not supported", "echo" if body.echo else "logprobs"
            )
        prompt = body.prompt
        if not isinstance(prompt, list):
            prompt = await self.prompts.encode(prompt)
        if not prompt:
            raise ApiError(400, "the prompt is empty", "prompt")
        if not all(isinstance(t, int) for t in prompt):
            raise ApiError(400, "a token-id prompt must be a list of integers", "prompt")
        return await self._generate(request, body, prompt, chat=False)  # type: ignore[arg-type]

    async def chat(self, body: ChatCompletionRequest, request: Request) -> Response:
        self._check_model(body.model)
        try:
            messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        except ValueError as exc:
            raise ApiError(400, str(exc), "messages") from None
        return await self._generate(
            request, body, await self.prompts.encode_chat(messages), chat=True
        )

    # ------------------------------------------------------------------ one request
    def _check_model(self, name: str | None) -> None:
        served = self.settings.served_model_name
        if name is not None and name != served:
            raise ApiError(
                400, f"the model {name!r} does not exist; this server serves {served!r}", "model"
            )

    def _sampling(self, body: Body) -> SamplingParams:
        try:
            return body.sampling_params(self.settings.default_max_tokens)
        except SamplingError as exc:
            raise ApiError(400, str(exc), exc.field) from None

    async def _start(
        self, prompt: list[int], params: SamplingParams, request_id: str
    ) -> asyncio.Queue[Item]:
        check_ready(self.runner)
        if params.n > self.settings.max_n:
            raise ApiError(400, f"n must be at most {self.settings.max_n}, got {params.n}", "n")
        try:
            return await self.runner.submit(prompt, params, request_id)
        except QueueFull as exc:
            raise ApiError(503, str(exc)) from None
        except EngineDead as exc:
            raise ApiError(503, f"{exc}; the server is shutting down") from None
        except SamplingError as exc:
            raise ApiError(400, str(exc), exc.field) from None

    async def _generate(
        self, request: Request, body: Body, prompt: list[int], chat: bool
    ) -> Response:
        """Run one request: an SSE stream, or one body once it finishes (both endpoints)."""
        params = self._sampling(body)
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        q = await self._start(prompt, params, request_id)
        created = int(time.time())
        if body.stream:
            kind = "chat.completion.chunk" if chat else "text_completion"
            return StreamingResponse(
                self._stream(q, request_id, body, created, kind, len(prompt)),
                media_type="text/event-stream",
            )
        out = await self._final(request, q, request_id)
        if out is None:
            return Response(status_code=499)
        return json_response(self._body(out, body, request_id, created, chat))

    async def _final(
        self, request: Request, q: asyncio.Queue[Item], request_id: str
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
            self.runner.abort(request_id)
            raise
        finally:
            watcher.cancel()
        if not result.done():
            result.cancel()
            self.runner.abort(request_id)
            return None
        return result.result()

    # ------------------------------------------------------------------ response shapes
    def _stats_fields(self, out: RequestOutput, index: int) -> dict[str, Any]:
        level = self.settings.stats_level
        if level == "none":
            return {}
        if len(out.outputs) != 1:  # one sequence's acceptance never stands for n of them
            return {"speculative_decoding_stats": None}
        return {"speculative_decoding_stats": choice_stats(out.outputs[index].acceptance, level)}

    def _root(self, out: RequestOutput) -> dict[str, Any]:
        level = self.settings.stats_level
        if level == "none":
            return {}
        if len(out.outputs) != 1:
            return {"metrics": None}
        return {"metrics": root_metrics(out.outputs[0].acceptance, level)}

    def _body(
        self, out: RequestOutput, body: Body, request_id: str, created: int, chat: bool
    ) -> dict[str, Any]:
        """The non-streamed response of a finished request."""
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
                **self._stats_fields(out, c.index),
            }
            for c in out.outputs
        ]
        return {
            "id": request_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": self.settings.served_model_name,
            "choices": choices,
            "usage": out.usage,
            **self._root(out),
        }

    def _role_chunk(
        self, base: dict[str, Any], n: int, prompt_tokens: int, continuous: bool
    ) -> dict[str, Any]:
        """A chat stream's first chunk: each choice's assistant role, nothing generated."""
        first: dict[str, Any] = {**base, "choices": [
            {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            for i in range(n)
        ]}  # fmt: skip
        if continuous:  # as vLLM: the role chunk counts the prompt, nothing generated
            first["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": 0,
                              "total_tokens": prompt_tokens}  # fmt: skip
        return first

    def _chunks(
        self, out: RequestOutput, base: dict[str, Any], chat: bool, continuous: bool
    ) -> list[dict[str, Any]]:
        """One output's chunks: a choice's new text, or its end (skipped when neither)."""
        chunks = []
        for choice in out.outputs:
            text = out.new_text[choice.index]
            done = choice.finish_reason is not None and out.finished
            if not text and not done and not out.new_token_ids[choice.index]:
                continue
            piece: dict[str, Any] = {"delta": {"content": text}} if chat else {"text": text}
            entry = {"index": choice.index, **piece, "logprobs": None,
                     "finish_reason": choice.finish_reason if out.finished else None}  # fmt: skip
            if out.finished:
                entry.update(self._stats_fields(out, choice.index))
            chunk: dict[str, Any] = {**base, "choices": [entry]}
            if continuous:
                chunk["usage"] = out.usage
            chunks.append(chunk)
        return chunks

    async def _stream(
        self,
        q: asyncio.Queue[Item],
        request_id: str,
        body: Body,
        created: int,
        kind: str,
        prompt_tokens: int,
    ) -> AsyncIterator[bytes]:
        chat = kind == "chat.completion.chunk"
        base = {
            "id": request_id,
            "object": kind,
            "created": created,
            "model": self.settings.served_model_name,
        }
        finished = False
        # vLLM's rule (``should_include_usage``): continuous usage only with include_usage; the
        # server flag forces both. Root ``metrics`` ride only the final usage chunk, as in vLLM.
        force = self.settings.force_include_usage
        include_usage = force or body.include_usage
        continuous = force or (include_usage and body.continuous_usage)
        try:
            if chat:
                yield sse(self._role_chunk(base, body.n, prompt_tokens, continuous))
            last: RequestOutput | None = None
            while True:
                out = await q.get()
                if isinstance(out, EngineDead):  # an error event, and no [DONE]: not a success
                    finished = True
                    yield sse(error_body(str(out), 500))
                    return
                if out is None:
                    break
                last = out
                for chunk in self._chunks(out, base, chat, continuous):
                    yield sse(chunk)
                if out.finished:
                    finished = True
                    break
            if finished and last is not None and include_usage:
                yield sse({**base, "choices": [], "usage": last.usage, **self._root(last)})
            yield b"data: [DONE]\n\n"
        finally:
            if not finished:  # the client went away, or the server is stopping
                self.runner.abort(request_id)
