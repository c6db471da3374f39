"""The load generator: one aiohttp session, a connection limit, closed-loop concurrency or open-
loop (Poisson / gamma) arrivals, per-chunk timestamps, and every response kept raw.

Token counts come from ``usage``: the client asks for ``include_usage`` and
``continuous_usage_stats``, so a chunk that carries several tokens (normal under speculation)
is counted right; without per-chunk usage each content chunk counts one token.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import numpy as np
import orjson

from speclens.bench.adapters import detect
from speclens.bench.datasets import Prompt
from speclens.bench.sse import SSEParser

Endpoint = Literal["completions", "chat"]


@dataclass
class LoadConfig:
    url: str
    model: str
    endpoint: Endpoint = "completions"
    api_key: str | None = None
    num_requests: int | None = 100
    duration: float | None = None
    concurrency: int | None = 8
    request_rate: float | None = None
    burstiness: float = 1.0
    warmup: int = 0
    max_tokens: int | None = 128
    ignore_eos: bool = False
    temperature: float = 0.0
    seed: int = 0
    stream: bool = True
    continuous_usage: bool = True
    timeout: float = 600.0
    grace: float = 5.0  # seconds in-flight requests get after Ctrl-C


@dataclass
class RequestRecord:
    """One request, as the client saw it; times in seconds from the run's start."""

    index: int
    category: str
    warmup: bool = False
    start: float = 0.0
    end: float | None = None
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    chunk_times: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    status: int | None = None
    error: str | None = None
    responses: list[Any] = field(default_factory=list)
    spec: dict[str, Any] | None = None
    spec_status: str = "absent"
    spec_adapter: str | None = None
    spec_message: str | None = None

    @property
    def success(self) -> bool:
        return self.error is None and self.end is not None

    @property
    def latency(self) -> float | None:
        return None if self.end is None else self.end - self.start

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first."""
        if self.end is None or self.ttft is None or not self.completion_tokens:
            return None
        if self.completion_tokens < 2:
            return None
        return (self.end - self.start - self.ttft) / (self.completion_tokens - 1)


@dataclass
class RunResult:
    records: list[RequestRecord]
    started: float  # wall clock (time.time) at the start of the measured part
    duration: float  # seconds, first send of the measured part to its last finish
    interrupted: bool = False


def _payload(config: LoadConfig, prompt: Prompt) -> dict[str, Any]:
    body: dict[str, Any] = {"model": config.model, "temperature": config.temperature}
    max_tokens = prompt.max_tokens or config.max_tokens
    if max_tokens:
        body["max_tokens"] = max_tokens
    if config.ignore_eos:
        body["ignore_eos"] = True
    if config.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.text
    if config.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        if config.continuous_usage:
            body["stream_options"]["continuous_usage_stats"] = True
    return body


def _content(chunk: dict[str, Any]) -> str:
    out = []
    for choice in chunk.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if isinstance(text, str):
            out.append(text)
    return "".join(out)


def _finish_reason(chunk: dict[str, Any]) -> str | None:
    for choice in chunk.get("choices") or []:
        if isinstance(choice, dict) and choice.get("finish_reason"):
            return str(choice["finish_reason"])
    return None


_PLAIN_ROOT = frozenset(
    {"id", "object", "created", "model", "choices", "usage", "system_fingerprint"}
)
_PLAIN_CHOICE = frozenset({"index", "text", "delta", "logprobs", "finish_reason", "stop_reason"})


def carriers(responses: list[Any]) -> list[dict[str, Any]]:
    """The objects that can carry speculative-decoding stats or usage, in order: any with an
    extra field, a finished choice, and the last one with usage. Plain content chunks (most of a
    stream) are skipped, so detection costs per request, not per token."""
    last_usage = max((i for i, r in enumerate(responses) if _usage(r)), default=-1)
    out = []
    for i, r in enumerate(responses):
        if not isinstance(r, dict):
            continue
        choices = r.get("choices")
        interesting = (
            i == last_usage
            or not _PLAIN_ROOT.issuperset(r)
            or not isinstance(choices, list)
            or any(
                not isinstance(c, dict) or c.get("finish_reason") or not _PLAIN_CHOICE.issuperset(c)
                for c in choices
            )
        )
        if interesting:
            out.append(r)
    return out


def _usage(chunk: Any) -> dict[str, Any] | None:
    usage = chunk.get("usage") if isinstance(chunk, dict) else None
    return usage if isinstance(usage, dict) else None


class LoadGenerator:
    def __init__(self, config: LoadConfig, prompts: list[Prompt]) -> None:
        if not prompts:
            raise ValueError("no prompts to send")
        self.config = config
        self.prompts = prompts
        self.stop = asyncio.Event()
        self.on_done: Callable[[RequestRecord], None] | None = None
        base = config.url.rstrip("/")
        path = "/v1/chat/completions" if config.endpoint == "chat" else "/v1/completions"
        self.endpoint_url = base + path
        self.headers = {"Content-Type": "application/json"}
        if config.api_key:
            self.headers["Authorization"] = f"Bearer {config.api_key}"

    async def _send(
        self, session: aiohttp.ClientSession, record: RequestRecord, prompt: Prompt, t0: float
    ) -> None:
        config = self.config
        record.start = time.perf_counter() - t0
        body = orjson.dumps(_payload(config, prompt))
        last_tokens = 0
        last_time: float | None = None
        try:
            async with session.post(self.endpoint_url, data=body, headers=self.headers) as resp:
                record.status = resp.status
                if resp.status != 200:
                    record.error = f"HTTP {resp.status}: {(await resp.text())[:500]}"
                    return
                if not config.stream:
                    data = orjson.loads(await resp.read())
                    now = time.perf_counter() - t0
                    record.responses.append(data)
                    record.ttft = now - record.start
                    record.chunk_times.append(now)
                else:
                    parser = SSEParser()
                    done = False
                    async for raw in resp.content.iter_any():
                        now = time.perf_counter() - t0
                        for event in parser.feed(raw):
                            data = event.data
                            if data == "[DONE]" or data.strip() == "[DONE]":
                                done = True
                                continue
                            try:
                                chunk = orjson.loads(data)
                            except orjson.JSONDecodeError:
                                record.responses.append({"unparsed": data[:1000]})
                                continue
                            record.responses.append(chunk)
                            usage = chunk.get("usage") if isinstance(chunk, dict) else None
                            count = (
                                usage.get("completion_tokens") if isinstance(usage, dict) else None
                            )
                            if isinstance(count, int):
                                tokens = count - last_tokens
                                last_tokens = count
                            elif isinstance(chunk, dict) and _content(chunk):
                                tokens = 1
                                last_tokens += 1
                            else:
                                continue
                            if tokens <= 0:
                                continue
                            record.chunk_times.append(now)
                            if record.ttft is None:
                                record.ttft = now - record.start
                            elif last_time is not None:
                                gap = (now - last_time) / tokens
                                record.itl.extend([gap] * tokens)
                            last_time = now
                    if not done:
                        record.error = "the stream ended without [DONE]"
                        return
                record.end = time.perf_counter() - t0
        except asyncio.CancelledError:
            record.error = "cancelled"
            raise
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._finish(record)

    def _finish(self, record: RequestRecord) -> None:
        usage = next((u for r in reversed(record.responses) if (u := _usage(r))), None)
        if usage:
            record.prompt_tokens = usage.get("prompt_tokens")
            record.completion_tokens = usage.get("completion_tokens")
        record.finish_reason = next(
            (f for r in record.responses if isinstance(r, dict) and (f := _finish_reason(r))), None
        )
        detection = detect(carriers(record.responses))
        record.spec_status = detection.status
        record.spec_adapter = detection.adapter
        record.spec_message = detection.message
        record.spec = detection.record.model_dump() if detection.record else None
        if self.on_done is not None:
            self.on_done(record)

    async def _phase(
        self,
        session: aiohttp.ClientSession,
        count: int | None,
        duration: float | None,
        warmup: bool,
        first_index: int,
    ) -> tuple[list[RequestRecord], float]:
        """Send one phase (warm-up or measured); returns its records and its duration."""
        config = self.config
        records: list[RequestRecord] = []
        tasks: set[asyncio.Task[None]] = set()
        rng = np.random.default_rng(config.seed + (1 if warmup else 0))
        order = random.Random(config.seed)
        limit = asyncio.Semaphore(config.concurrency) if config.concurrency else None
        t0 = time.perf_counter()

        async def one(record: RequestRecord, prompt: Prompt) -> None:
            if limit is None:
                await self._send(session, record, prompt, t0)
                return
            async with limit:
                if self.stop.is_set():
                    record.error = "not sent (stopped)"
                    self._finish(record)
                    return
                await self._send(session, record, prompt, t0)

        index = 0
        while not self.stop.is_set():
            if count is not None and index >= count:
                break
            if duration is not None and time.perf_counter() - t0 >= duration:
                break
            if limit is not None and config.request_rate is None:
                await limit.acquire()  # closed loop: wait for a free slot before creating work
                limit.release()
            prompt = (
                self.prompts[order.randrange(len(self.prompts))]
                if duration
                else self.prompts[(first_index + index) % len(self.prompts)]
            )
            record = RequestRecord(first_index + index, prompt.category, warmup)
            records.append(record)
            task = asyncio.create_task(one(record, prompt))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            index += 1
            if config.request_rate:
                shape = config.burstiness
                gap = rng.gamma(shape, 1.0 / (config.request_rate * shape))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), timeout=float(gap))
            else:
                await asyncio.sleep(0)
        if tasks:
            if self.stop.is_set():
                _, pending = await asyncio.wait(tasks, timeout=config.grace)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
            else:
                await asyncio.gather(*tasks, return_exceptions=True)
        ends = [r.end for r in records if r.end is not None]
        return records, (max(ends) if ends else time.perf_counter() - t0)

    async def run(self, before_measure: Callable[[], Any] | None = None) -> RunResult:
        """Warm up, call ``before_measure`` (e.g. scrape server counters), then measure."""
        config = self.config
        timeout = aiohttp.ClientTimeout(total=config.timeout)
        connector = aiohttp.TCPConnector(limit=max(config.concurrency or 0, 256), force_close=False)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            warm: list[RequestRecord] = []
            if config.warmup:
                warm, _ = await self._phase(session, config.warmup, None, True, 0)
            if before_measure is not None:
                result = before_measure()
                if asyncio.iscoroutine(result):
                    await result
            started = time.time()
            count = None if config.duration else config.num_requests
            records, duration = await self._phase(
                session, count, config.duration, False, config.warmup
            )
        return RunResult(warm + records, started, duration, self.stop.is_set())
