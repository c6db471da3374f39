"""A stand-in for an SGLang server, written from SGLang's current source, for the client's tests.

What it imitates, and where each fact comes from (sgl-project/sglang):
- ``GET /get_model_info`` (``model_path``, ``tokenizer_path``, ``is_generation``, ...) and
  ``GET /get_server_info`` (server arguments plus ``version``):
  ``python/sglang/srt/entrypoints/http_server.py``.
- ``POST /generate``: body ``{"text", "sampling_params": {"max_new_tokens", "temperature",
  "ignore_eos"}, "stream"}``; a whole body ``{"text", "output_ids", "meta_info"}``; a stream of
  ``data: {"text": <the text so far>, "output_ids": <all so far>, "meta_info": {...}}`` ending
  with ``data: [DONE]`` (``http_server.py`` ``generate_request``; the cumulative text is
  ``tokenizer_manager.py`` ``_handle_batch_output`` without ``--incremental-streaming-output``).
- ``meta_info``: ``id``, ``finish_reason`` (null, or ``{"type": "length", "length": N}``),
  ``prompt_tokens``, ``completion_tokens`` (running), ``cached_tokens``; the spec fields only on
  the finished output and only when ``spec_verify_ct`` > 0: ``spec_accept_rate``,
  ``spec_accept_length`` (completion_tokens / verify_ct), ``spec_num_correct_drafts``,
  ``spec_num_proposed_drafts`` (verify_ct x (num_draft_tokens - 1)), ``spec_verify_ct``, the
  aliases ``spec_accepted_drafts`` / ``spec_proposed_drafts``, ``spec_correct_drafts_histogram``
  (dense, as long as the largest count seen + 1) and its alias ``spec_accept_histogram``
  (``tokenizer_manager.py`` ``_calculate_spec_decoding_metrics``).
- The OpenAI routes: ``choices[].meta_info`` only with ``return_meta_info`` and never streamed:
  streaming with it is refused with 400 and SGLang's message
  (``entrypoints/openai/serving_chat.py`` ``_convert_to_internal_request``); with
  ``return_spec_tokens_details`` the same fields, defaults filled, in the root's
  ``sglext.spec_tokens_details``, streamed as a ``choices: []`` chunk after the finishing chunk
  and before the usage chunk (``serving_completions.py``, ``serving_chat.py``,
  ``entrypoints/openai/utils.py`` ``spec_tokens_details_from_meta_info``).

Speculation is scripted, not computed: request i accepts ``script(i)`` drafts at each verify
step (a seeded draw in 0..K by default). The first token comes from prefill; each verify step
then emits accepted + 1 tokens, the last one cut at the token limit. ``Standin.tally`` keeps what
it sent, so a test compares the client's totals with the server's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

#: ``speculative_num_draft_tokens`` - 1: the drafts a chain proposes per verify step.
K = 3
REFUSED = (
    "return_meta_info is not supported with streaming. "
    "Please set stream=false when using return_meta_info=true."
)
STEP_DELAY_S = 0.002


@dataclass
class Tally:
    """What the stand-in sent, summed over the requests it finished."""

    requests: int = 0
    verify_steps: int = 0
    accepted: int = 0
    proposed: int = 0
    completion_tokens: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Generation:
    """One request's scripted output: the tokens each step emitted (prefill first)."""

    steps: list[int]  # tokens per emission; steps[0] is the prefill token
    accepted: list[int]  # drafts accepted at each verify step

    @property
    def tokens(self) -> int:
        return sum(self.steps)


def generate(max_tokens: int, accepted_per_step: Callable[[int], int]) -> Generation:
    steps, accepted = [1], []
    while sum(steps) < max_tokens:
        a = accepted_per_step(len(accepted))
        room = max_tokens - sum(steps)
        steps.append(min(a + 1, room))
        accepted.append(min(a, room - 1))
    return Generation(steps, accepted)


def spec_fields(gen: Generation) -> dict[str, Any]:
    """SGLang's finished-request fields; none at all without a verify step."""
    verify = len(gen.accepted)
    if verify == 0:
        return {}
    correct = sum(gen.accepted)
    proposed = verify * K
    hist = [0] * (max(gen.accepted) + 1)
    for a in gen.accepted:
        hist[a] += 1
    return {
        "spec_accept_rate": correct / proposed,
        "spec_accept_length": gen.tokens / verify,
        "spec_num_correct_drafts": correct,
        "spec_num_proposed_drafts": proposed,
        "spec_verify_ct": verify,
        "spec_accepted_drafts": correct,
        "spec_proposed_drafts": proposed,
        "spec_correct_drafts_histogram": hist,
        "spec_accept_histogram": list(hist),
    }


def spec_tokens_details(fields: dict[str, Any]) -> dict[str, Any] | None:
    """``SpecTokensDetails`` as SGLang builds it: None without any metric, else defaults filled."""
    if not fields:
        return None
    return {
        "spec_accept_rate": fields.get("spec_accept_rate") or 0.0,
        "spec_accept_length": fields.get("spec_accept_length") or 0.0,
        "spec_cap_length": 0.0,
        "spec_block_accept_length": 0.0,
        "spec_num_correct_drafts": fields.get("spec_num_correct_drafts") or 0,
        "spec_num_proposed_drafts": fields.get("spec_num_proposed_drafts") or 0,
        "spec_verify_ct": fields.get("spec_verify_ct") or 0,
        "spec_correct_drafts_histogram": fields.get("spec_correct_drafts_histogram") or [],
        "spec_cap_lens_histogram": [],
    }


def _sse(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class Standin:
    """A real aiohttp server on 127.0.0.1 in a background thread with its own event loop."""

    def __init__(
        self, script: Callable[[int], Callable[[int], int]] | None = None, *, seed: int = 0
    ) -> None:
        self.script = script or self._random_script
        self.seed = seed
        self.tally = Tally()
        self.counter = itertools.count()
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None

    def _random_script(self, index: int) -> Callable[[int], int]:
        rng = random.Random(self.seed * 1_000_003 + index)
        return lambda _step: rng.randint(0, K)

    # --- serving -------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/get_model_info", self.model_info)
        app.router.add_get("/get_server_info", self.server_info)
        app.router.add_post("/generate", self.native)
        app.router.add_post("/v1/completions", self.openai)
        app.router.add_post("/v1/chat/completions", self.openai)
        app.router.add_get("/metrics", self.metrics)
        return app

    async def metrics(self, _: web.Request) -> web.Response:
        """SGLang's acceptance is two gauges, the latest values only
        (``python/sglang/srt/metrics/collector.py``, ``spec_accept_length``/``spec_accept_rate``)."""
        t = self.tally
        length = 1 + t.accepted / t.verify_steps if t.verify_steps else 0.0
        rate = t.accepted / t.proposed if t.proposed else 0.0
        text = "".join(
            f"# HELP sglang:{name} {what}\n# TYPE sglang:{name} gauge\n"
            f'sglang:{name}{{model_name="stand-in/model"}} {value}\n'
            for name, what, value in (
                ("spec_accept_length", "The average acceptance length.", length),
                ("spec_accept_rate", "The average acceptance rate.", rate),
            )
        )
        return web.Response(text=text, content_type="text/plain")

    async def model_info(self, _: web.Request) -> web.Response:
        return web.json_response({
            "model_path": "stand-in/model", "tokenizer_path": "stand-in/model",
            "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
        })  # fmt: skip

    async def server_info(self, _: web.Request) -> web.Response:
        return web.json_response({"model_path": "stand-in/model", "version": "0.5.21"})

    def _finish(self, gen: Generation, fields: dict[str, Any], body: dict[str, Any]) -> None:
        t = self.tally
        t.requests += 1
        t.verify_steps += len(gen.accepted)
        t.accepted += sum(gen.accepted)
        t.proposed += fields.get("spec_num_proposed_drafts", 0)
        t.completion_tokens += gen.tokens
        t.bodies.append(body)

    def _meta(self, rid: str, prompt: str, done: int, finished: bool, max_tokens: int) -> dict:
        return {
            "id": rid,
            "finish_reason": {"type": "length", "length": max_tokens} if finished else None,
            "prompt_tokens": len(prompt.split()),
            "weight_version": "default",
            "completion_tokens": done,
            "cached_tokens": 0,
        }

    async def native(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        sampling = body.get("sampling_params") or {}
        max_tokens = int(sampling.get("max_new_tokens", 128))
        index = next(self.counter)
        gen = generate(max_tokens, self.script(index))
        fields = spec_fields(gen)
        rid, prompt = f"rid-{index}", str(body.get("text", ""))
        if not body.get("stream"):
            meta = self._meta(rid, prompt, gen.tokens, True, max_tokens) | fields
            self._finish(gen, fields, body)
            return web.json_response(
                {"text": "t" * gen.tokens, "output_ids": list(range(gen.tokens)), "meta_info": meta}
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        done = 0
        for i, n in enumerate(gen.steps):
            await asyncio.sleep(STEP_DELAY_S)
            done += n
            last = i == len(gen.steps) - 1
            meta = self._meta(rid, prompt, done, last, max_tokens) | (fields if last else {})
            await resp.write(
                _sse({"text": "t" * done, "output_ids": list(range(done)), "meta_info": meta})
            )
        self._finish(gen, fields, body)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def openai(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        if body.get("stream") and body.get("return_meta_info"):
            return web.json_response(
                {"object": "error", "message": REFUSED, "type": "BadRequestError",
                 "param": None, "code": 400},
                status=400,
            )  # fmt: skip
        max_tokens = int(body.get("max_tokens", 128))
        prompt = str(body.get("prompt") or body.get("messages", [{}])[-1].get("content", ""))
        index = next(self.counter)
        gen = generate(max_tokens, self.script(index))
        fields = spec_fields(gen)
        rid = f"cmpl-{index}"
        meta = self._meta(rid, prompt, gen.tokens, True, max_tokens) | fields
        details = spec_tokens_details(fields) if body.get("return_spec_tokens_details") else None
        usage = {
            "prompt_tokens": meta["prompt_tokens"], "completion_tokens": gen.tokens,
            "total_tokens": meta["prompt_tokens"] + gen.tokens,
        }  # fmt: skip
        base = {"id": rid, "created": 1, "model": body.get("model", "m")}
        if not body.get("stream"):
            text = "t" * gen.tokens
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
            choice |= (
                {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            )
            if body.get("return_meta_info"):
                choice["meta_info"] = meta
            out = base | {"object": "chat.completion" if chat else "text_completion"}
            out |= {"choices": [choice], "usage": usage}
            if details is not None:
                out["sglext"] = {"routed_experts": None, "cached_tokens_details": None,
                                 "spec_tokens_details": details}  # fmt: skip
            self._finish(gen, fields, body)
            return web.json_response(out)
        obj = "chat.completion.chunk" if chat else "text_completion"
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if chat:
            await resp.write(_sse(base | {"object": obj, "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            ]}))  # fmt: skip
        options = body.get("stream_options") or {}
        done = 0
        for n in gen.steps:
            await asyncio.sleep(STEP_DELAY_S)
            done += n
            piece = {"delta": {"content": "t" * n}} if chat else {"text": "t" * n}
            chunk = base | {
                "object": obj,
                "choices": [{"index": 0, **piece, "finish_reason": None}],
            }
            if options.get("continuous_usage_stats"):
                chunk["usage"] = usage | {"completion_tokens": done}
            await resp.write(_sse(chunk))
        end = {"delta": {}} if chat else {"text": ""}
        await resp.write(
            _sse(
                base | {"object": obj, "choices": [{"index": 0, **end, "finish_reason": "length"}]}
            )
        )
        if details is not None:
            await resp.write(_sse(base | {"object": obj, "choices": [], "sglext": {
                "routed_experts": None, "cached_tokens_details": None, "spec_tokens_details": details,
            }}))  # fmt: skip
        if options.get("include_usage"):
            await resp.write(_sse(base | {"object": obj, "choices": [], "usage": usage}))
        self._finish(gen, fields, body)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    # --- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> Standin:
        return start(self, self.app())

    def __exit__(self, *exc: object) -> None:
        stop(self)


def start(server: Any, app: web.Application) -> Any:
    """Serve ``app`` on a free loopback port from a thread; sets ``server.url``."""
    ready = threading.Event()

    async def up() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        server.url = f"http://127.0.0.1:{port}"
        server._runner = runner
        ready.set()

    def loop() -> None:
        asyncio.set_event_loop(server._loop)
        server._loop.run_until_complete(up())
        server._loop.run_forever()

    server._thread = threading.Thread(target=loop, daemon=True)
    server._thread.start()
    if not ready.wait(10):
        raise RuntimeError("the stand-in did not start within 10 s")
    return server


def stop(server: Any) -> None:
    async def down() -> None:
        if server._runner is not None:
            await server._runner.cleanup()

    asyncio.run_coroutine_threadsafe(down(), server._loop).result(10)
    server._loop.call_soon_threadsafe(server._loop.stop)
    server._thread.join(10)
    with contextlib.suppress(Exception):
        server._loop.close()


@contextlib.contextmanager
def running(**kw: Any) -> Iterator[Standin]:
    with Standin(**kw) as server:
        yield server
