"""A stand-in for ``trtllm-serve`` answering with n sequences per request (default 2), written
from TensorRT-LLM's ``tensorrt_llm/serve/``:

- ``openai_protocol.py``: every choice carries ``avg_decoded_tokens_per_iter`` (the request's,
  the same on each choice) and, per sequence, the ``speculative_decoding`` object the adapter
  reads (``acceptance_rate``, ``total_accepted_draft_tokens``, ``total_draft_tokens``,
  ``num_spec_steps``, dense ``acceptance_histogram``, ``num_spec_tokens``);
  ``postprocess_handlers.py`` builds each choice from its own sequence's output, and streams
  each choice's chunks under its index, the finishing one carrying its stats;
- ``openai_server.py``: ``GET /metrics`` returns the iteration stats queued since the last read
  (a JSON list, drained on read), each with ``specDecodingStats`` (``numDraftTokens``,
  ``numAcceptedTokens``, ``numRequestsWithDraftTokens``, ``acceptanceLength``).

The sequences of a request step together, one engine iteration per step. ``usage`` covers every
choice. The client sends no ``n``, so the stand-in's default stands in for a server-side n.
"""

from __future__ import annotations

import random
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

K = 3


@dataclass
class Sequence:
    tokens: int = 1  # the first token comes from the context phase
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    histogram: list[int] = field(default_factory=lambda: [0] * (K + 1))

    def stats(self) -> dict[str, Any]:
        return {
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "total_accepted_draft_tokens": self.accepted,
            "total_draft_tokens": self.drafted,
            "num_spec_steps": self.steps,
            "acceptance_histogram": list(self.histogram),
            "num_spec_tokens": K,
        }


class StandIn:
    def __init__(self, n: int = 2) -> None:
        self.n = n
        self.sequences: list[Sequence] = []  # every sequence served, for the tests
        self.queue: list[dict[str, Any]] = []  # iteration stats not yet read
        self.app = web.Application()
        self.app.router.add_post("/v1/completions", self.completions)
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self.app.router.add_get("/metrics", self.metrics)

    def _generate(self, prompt: str, max_tokens: int, n: int) -> list[Sequence]:
        """n sequences stepping together; each iteration's stats go on the queue."""
        rngs = [random.Random(zlib.crc32(f"{prompt}/{i}".encode())) for i in range(n)]
        seqs = [Sequence() for _ in range(n)]
        while any(s.tokens < max_tokens for s in seqs):
            drafted = accepted = requests = 0
            for seq, rng in zip(seqs, rngs, strict=True):
                room = max_tokens - seq.tokens
                if room <= 0:
                    continue
                draft = min(K, room - 1)
                if draft <= 0:
                    seq.tokens += 1
                    continue
                a = rng.randint(0, draft)
                seq.drafted += draft
                seq.accepted += a
                seq.steps += 1
                seq.histogram[a] += 1
                seq.tokens += a + 1
                drafted, accepted, requests = drafted + draft, accepted + a, requests + 1
            if requests:
                self.queue.append({
                    "iter": len(self.queue), "iterLatencyMS": 1.0,
                    "specDecodingStats": {
                        "numDraftTokens": drafted, "numAcceptedTokens": accepted,
                        "numRequestsWithDraftTokens": requests,
                        "acceptanceLength": 1.0 + accepted / requests,
                        "iterLatencyMS": 0.2, "draftOverhead": 0.1,
                    },
                })  # fmt: skip
        self.sequences += seqs
        return seqs

    @staticmethod
    def _per_iter(seqs: list[Sequence]) -> float:
        tokens = sum(s.tokens for s in seqs)
        return tokens / max(1, max(s.steps for s in seqs) + 1)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, chat=True)

    async def _answer(self, request: web.Request, chat: bool) -> web.StreamResponse:
        body = await request.json()
        prompt = orjson.dumps(body.get("messages") if chat else body.get("prompt")).decode()
        n = int(body.get("n") or self.n)
        seqs = self._generate(prompt, int(body.get("max_tokens") or 16), n)
        per_iter = self._per_iter(seqs)
        head = {"id": "cmpl-trt", "created": int(time.time()), "model": "standin",
                "object": ("chat.completion" if chat else "text_completion")
                + (".chunk" if chat and body.get("stream") else "")}  # fmt: skip
        usage = {"prompt_tokens": 4, "completion_tokens": sum(s.tokens for s in seqs),
                 "total_tokens": 4 + sum(s.tokens for s in seqs)}  # fmt: skip

        def choice(
            i: int, seq: Sequence, content: str | None, finish: str | None
        ) -> dict[str, Any]:
            out: dict[str, Any] = {"index": i, "finish_reason": finish,
                                   "avg_decoded_tokens_per_iter": per_iter}  # fmt: skip
            if chat:
                key = "delta" if body.get("stream") else "message"
                out[key] = {"role": "assistant", "content": content}
            else:
                out["text"] = content or ""
            if finish is not None:
                out["speculative_decoding"] = seq.stats()
            return out

        if not body.get("stream"):
            choices = [choice(i, s, "x" * s.tokens, "length") for i, s in enumerate(seqs)]
            return web.json_response({**head, "choices": choices, "usage": usage})
        events = []
        for i, seq in enumerate(seqs):
            events += [{**head, "choices": [choice(i, seq, "x", None)]} for _ in range(seq.tokens)]
        events += [{**head, "choices": [choice(i, s, "", "length")]} for i, s in enumerate(seqs)]
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({**head, "choices": [], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in events:
            await resp.write(b"data: " + orjson.dumps(event) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def metrics(self, _: web.Request) -> web.Response:
        drained, self.queue = self.queue, []
        return web.json_response(drained)
