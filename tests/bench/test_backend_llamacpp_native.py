"""``bench --backend llamacpp --endpoint native`` against a llama.cpp stand-in, written from
llama.cpp b11434 (ggml-org/llama.cpp): ``tools/server/server-task.cpp``
(``server_task_result_cmpl_partial/final::to_json_non_oaicompat``: ``content``, ``tokens``,
``stop``, ``tokens_predicted``, ``tokens_evaluated``; the final one ``"stop": true``,
``stop_type`` and ``timings``), ``tools/server/server-context.cpp`` (the ``/completion`` stream
ends without ``[DONE]``; ``/props`` carries ``build_info`` and ``default_generation_settings``)
and ``tools/server/server-schema.cpp`` (the body's ``n_predict``, ``temperature``,
``ignore_eos``). Text, TTFT, token counts and the cached prompt tokens (``timings.cache_n``) are
checked here; ``timings`` is kept raw. ``/props`` also carries ``total_slots``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from standin_sglang import start, stop

from speclens.bench.client import LoadConfig, RequestRecord
from speclens.bench.datasets import random_prompts
from speclens.bench.finish import payloads
from speclens.bench.run import run_bench

N, MAX_TOKENS, PROMPT_TOKENS, CACHED = 6, 20, 7, 3


class LlamaCpp:
    """One token per partial chunk (llama.cpp sends each sampled token on its own), then the
    final chunk; ``drop_final`` closes the stream before it (a server that died)."""

    def __init__(self, drop_final: bool = False) -> None:
        self.drop_final = drop_final
        self.bodies: list[dict[str, Any]] = []
        self.sent_tokens = 0
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None

    def __enter__(self) -> LlamaCpp:
        app = web.Application()
        app.router.add_get("/props", self.props)
        app.router.add_post("/completion", self.completion)
        return start(self, app)  # type: ignore[no-any-return]

    def __exit__(self, *exc: object) -> None:
        stop(self)

    async def props(self, _: web.Request) -> web.Response:
        return web.json_response({
            "default_generation_settings": {"params": {"n_predict": -1}, "n_ctx": 2048},
            "total_slots": 3, "model_path": "SmolLM2.gguf", "build_info": "b11434-0000000",
        })  # fmt: skip

    @staticmethod
    def timings(n: int) -> dict[str, Any]:
        return {
            "cache_n": CACHED, "prompt_n": PROMPT_TOKENS - CACHED, "prompt_ms": 1.0, "predicted_n": n,
            "predicted_ms": 2.0 * n, "draft_n": 2 * n, "draft_n_accepted": n,
        }  # fmt: skip

    def final(self, content: str, n: int) -> dict[str, Any]:
        return {
            "index": 0, "content": content, "tokens": [], "id_slot": 0, "stop": True,
            "model": "smollm2", "tokens_predicted": n, "tokens_evaluated": PROMPT_TOKENS,
            "generation_settings": {}, "prompt": "", "has_new_line": False, "truncated": False,
            "stop_type": "limit", "stopping_word": "", "tokens_cached": PROMPT_TOKENS + n,
            "timings": self.timings(n),
        }  # fmt: skip

    async def completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        n = int(body["n_predict"])
        self.sent_tokens += n
        if not body.get("stream"):
            return web.json_response(self.final("t" * n, n))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(1, n + 1):
            await asyncio.sleep(0.002)
            chunk = {"index": 0, "content": "t", "tokens": [100 + i], "stop": False, "id_slot": 0,
                     "tokens_predicted": i, "tokens_evaluated": PROMPT_TOKENS}  # fmt: skip
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        if not self.drop_final:
            await resp.write(b"data: " + orjson.dumps(self.final("", n)) + b"\n\n")
        return resp  # no [DONE]: the connection closes


def bench(url: str, stream: bool) -> list[RequestRecord]:
    config = LoadConfig(
        url=url, model="m", endpoint="native", backend="llamacpp", num_requests=N,
        concurrency=3, max_tokens=MAX_TOKENS, stream=stream,
    )  # fmt: skip
    return asyncio.run(run_bench(config, random_prompts(N, 8, MAX_TOKENS, seed=2))).records


@pytest.mark.parametrize("stream", [True, False])
def test_native_completion_gives_text_ttft_and_token_counts(stream: bool) -> None:
    with LlamaCpp() as server:
        records = bench(server.url, stream)
        sent, bodies = server.sent_tokens, server.bodies
    assert [r.error for r in records] == [None] * N
    assert all(b["n_predict"] == MAX_TOKENS and b["stream"] is stream for b in bodies)
    assert all("prompt" in b and "max_tokens" not in b for b in bodies)
    assert sum(r.completion_tokens or 0 for r in records) == sent == N * MAX_TOKENS
    for r in records:
        assert r.prompt_tokens == PROMPT_TOKENS
        assert r.cached_tokens == CACHED  # timings.cache_n: from its prefix cache
        assert r.finish_reason == "length"  # stop_type "limit", as llama.cpp's OpenAI route says
        assert r.ttft is not None and r.latency is not None and 0 < r.ttft <= r.latency
        raw = payloads(r)
        assert [x["timings"]["predicted_n"] for x in raw if "timings" in x] == [MAX_TOKENS]
        if stream:
            assert sum(n for _, n in r.itl_runs) == MAX_TOKENS - 1
            assert r.ttft < r.latency


def test_a_stream_cut_before_its_final_chunk_fails_as_before() -> None:
    with LlamaCpp(drop_final=True) as server:
        records = bench(server.url, True)
    assert {r.error for r in records} == {'the stream ended without its final chunk ("stop": true)'}


def test_auto_detects_llamacpp_by_props(run_cli, tmp_path: Path) -> None:
    with LlamaCpp() as server:
        code, _, err = run_cli(
            "bench", "--url", server.url, "--model", "m", "--endpoint", "native",
            "--num-requests", 2, "--max-tokens", 4, "--num-spec-tokens", 4,
            "--output-dir", tmp_path,
        )  # fmt: skip
    assert code == 0, err
    summary = json.loads((tmp_path / "summary.json").read_text())
    settings = summary["settings"]
    assert (settings["backend"], settings["endpoint"]) == ("llamacpp", "native")
    assert "/props" in settings["backend_evidence"]
    # No /version: the server block comes from /props (its slots bound a replay's batch), and
    # the K the user stated is the run's (llama-server reports none).
    assert summary["server"] == {"engine": "llama.cpp", "version": "b11434-0000000",
                                 "max_num_seqs": 3}  # fmt: skip
    assert settings["num_speculative_tokens"] == 4
