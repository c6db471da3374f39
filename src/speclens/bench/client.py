"""The load generator: one aiohttp session, a connection limit, closed-loop concurrency or open-
loop (Poisson / gamma) arrivals, per-chunk timestamps, and every response kept raw.

Token counts come from ``usage``: the client asks for ``include_usage`` and
``continuous_usage_stats``, so a chunk that carries several tokens (normal under speculation)
is counted right; without per-chunk usage each content chunk counts one token.

The server is untrusted: every value read from a response is type-checked where it is read
(``Tally``, ``finish_record``), and a bad one is dropped with a note on the record
(``anomalies``), never passed on. Bodies, SSE events and token counts are bounded, so no response
can make the client raise or hold memory in proportion to a number it claims.

A request succeeds only if its response holds at least one content chunk: a JSON object whose
``choices`` is a list holding a choice object with a string ``text`` or a ``delta`` or
``message`` object. Events that are not JSON, not an object, or whose ``choices`` is not a list of
objects are unparsable: counted on the record (``unparsable_events``), otherwise skipped.

A backend's native route (``--endpoint native``) has its own shape (``Wire``), held to the same
rule: SGLang's ``/generate`` chunk is an object with a string ``text`` (cumulative by default)
and a ``meta_info`` object whose ``completion_tokens`` is the running count; llama.cpp's
``/completion`` chunk is an object with a string ``content`` whose ``tokens_predicted`` is the
running count, and its stream ends with ``"stop": true`` and no ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import numpy as np
import orjson

from speclens.bench.adapters import detect
from speclens.bench.datasets import Prompt
from speclens.bench.sse import SSEError, SSEParser

Endpoint = Literal["completions", "chat", "native"]
Backend = Literal["openai", "sglang", "llamacpp"]
Routing = Literal["round-robin", "least-outstanding"]

#: The OpenAI routes, and each backend's own route (``--endpoint native``).
ROUTES = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
NATIVE_ROUTES = {"sglang": "/generate", "llamacpp": "/completion"}

logger = logging.getLogger(__name__)


@dataclass
class LoadConfig:
    url: str
    model: str
    endpoint: Endpoint = "completions"
    #: The engine behind the URL (``--backend``; auto-detection resolves to one of these): it
    #: decides the native route and the extra request fields that switch the stats on.
    backend: Backend = "openai"
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
    #: Every replica's base URL (empty: ``url`` alone), and how requests are spread over them.
    urls: tuple[str, ...] = ()
    routing: Routing = "round-robin"
    #: This generator's part of the run, (p, P): it sends the requests whose index is p modulo
    #: P, at the times a single generator would, with its share of the concurrency. Shards (``--shard``) and worker processes (``--workers``) are parts.
    part: tuple[int, int] = (0, 1)

    @property
    def replicas(self) -> tuple[str, ...]:
        return self.urls or (self.url,)

    def share(self, total: int) -> int:
        """This part's share of ``total`` (concurrency): the first ``total % P`` parts get one
        more."""
        p, parts = self.part
        return total // parts + (p < total % parts)


#: What a response can make the client hold or believe.
MAX_BODY_BYTES = 64 * 2**20  # a non-streamed body
MAX_ERROR_BYTES = 4096  # read of an error body (500 characters are kept)
MAX_TOKENS = 2**31  # no token count above this is believed
MAX_ANOMALIES = 10  # notes kept per request
#: Idle connections are closed by the client before servers close them: llama-server (httplib)
#: and uvicorn (vLLM, SGLang, speclens) close after 5 s, and a request sent on a connection the
#: server is closing fails with "server disconnected" (aiohttp's default keeps them 15 s).
KEEPALIVE_S = 2.0
#: Times a request is sent again when its connection dies before any byte of a response.
MAX_STALE_RETRIES = 2


@dataclass
class RequestRecord:
    """One request, as the client saw it; times in seconds from the run's start.

    ``itl_runs`` holds inter-token gaps as ``(gap, tokens)`` runs: a chunk that brings n tokens
    g seconds after the previous one is n tokens g / n apart, one entry however large n is.
    ``anomalies`` notes what the response got wrong without failing the request (a count of the
    wrong type, one that fell or is out of bounds); that value is dropped, not used.
    """

    index: int
    category: str
    warmup: bool = False
    replica: str | None = None  # the base URL it was sent to
    scheduled: float | None = None  # open loop: when the arrival was due (start is when sent)
    start: float = 0.0
    end: float | None = None
    ttft: float | None = None
    itl_runs: list[tuple[float, int]] = field(default_factory=list)
    chunk_times: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    status: int | None = None
    error: str | None = None
    responses: list[Any] = field(default_factory=list)
    spec: dict[str, Any] | None = None
    #: n > 1 with per-choice stats (TensorRT-LLM): each choice's record, keyed by choice index.
    spec_choices: dict[int, dict[str, Any]] | None = None
    spec_status: str = "absent"
    spec_adapter: str | None = None
    spec_message: str | None = None
    unparsable_events: int = 0
    anomalies: list[str] = field(default_factory=list)

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

    def note(self, anomaly: str) -> None:
        """Keep a note of what the response got wrong (the first few distinct ones)."""
        if anomaly not in self.anomalies and len(self.anomalies) < MAX_ANOMALIES:
            self.anomalies.append(anomaly)


@dataclass
class RunResult:
    records: list[RequestRecord]
    started: float  # wall clock (time.time) at the start of the measured part
    duration: float  # seconds, first send of the measured part to its last finish
    interrupted: bool = False
    #: Seconds from the measured part's start to when it stopped sending, and how many of its
    #: requests were still in flight then (awaited and recorded, not dropped).
    sending_s: float = 0.0
    in_flight_at_stop: int = 0


def route(endpoint: Endpoint, backend: Backend) -> str:
    """The request path; ``native`` exists only for SGLang and llama.cpp (the CLI refuses the
    rest before any request)."""
    if endpoint == "native":
        if backend not in NATIVE_ROUTES:
            raise ValueError(
                f"--endpoint native needs an SGLang or llama.cpp backend, not {backend}"
            )
        return NATIVE_ROUTES[backend]
    return ROUTES[endpoint]


def _native_payload(config: LoadConfig, prompt: Prompt) -> dict[str, Any]:
    """SGLang ``/generate`` (``GenerateReqInput``: ``text`` and ``sampling_params``) or llama.cpp
    ``/completion`` (``prompt``, ``n_predict``; tools/server/server-schema.cpp)."""
    max_tokens = prompt.max_tokens or config.max_tokens
    if config.backend == "sglang":
        sampling: dict[str, Any] = {"temperature": config.temperature}
        if max_tokens:
            sampling["max_new_tokens"] = max_tokens
        if config.ignore_eos:
            sampling["ignore_eos"] = True
        return {"text": prompt.text, "sampling_params": sampling, "stream": config.stream}
    body: dict[str, Any] = {
        "prompt": prompt.text,
        "temperature": config.temperature,
        "stream": config.stream,
    }
    if max_tokens:
        body["n_predict"] = max_tokens
    if config.ignore_eos:
        body["ignore_eos"] = True
    return body


def _payload(config: LoadConfig, prompt: Prompt) -> dict[str, Any]:
    if config.endpoint == "native":
        return _native_payload(config, prompt)
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
    if config.backend == "sglang":
        # Current SGLang returns the request's spec stats in ``sglext.spec_tokens_details``, also
        # when streaming; older releases only in ``choices[].meta_info``, which needs
        # ``return_meta_info`` and is refused (400) when streaming
        # (python/sglang/srt/entrypoints/openai/serving_chat.py, serving_completions.py).
        body["return_spec_tokens_details"] = True
        if not config.stream:
            body["return_meta_info"] = True
    return body


def _choices(chunk: dict[str, Any]) -> list[dict[str, Any]]:
    raw = chunk.get("choices")
    return [c for c in raw if isinstance(c, dict)] if isinstance(raw, list) else []


def is_content_chunk(chunk: object) -> bool:
    """A choice object with a string ``text`` or a ``delta`` or ``message`` object."""
    return isinstance(chunk, dict) and any(
        isinstance(c.get("text"), str)
        or isinstance(c.get("delta"), dict)
        or isinstance(c.get("message"), dict)
        for c in _choices(chunk)
    )


def chunk_problem(chunk: object) -> str | None:
    """Why a parsed event is not a completion chunk at all (None when it is one)."""
    if not isinstance(chunk, dict):
        return "not a JSON object"
    raw = chunk.get("choices")
    if raw is not None and not (isinstance(raw, list) and all(isinstance(c, dict) for c in raw)):
        return "choices is not a list of objects"
    return None


def count_problem(value: object, bound: int) -> str | None:
    """Why a token count from the wire is not believed (None when it is)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return f"not an integer: {value!r:.40}"
    if value < 0:
        return f"negative: {value}"
    if value > bound:
        return f"{value} is beyond the bound {bound}"
    return None


def token_bound(max_tokens: int | None) -> int:
    """The most completion tokens believed: twice max_tokens plus 16 (servers may overshoot a
    little), and never more than 2**31."""
    return MAX_TOKENS if not max_tokens else min(MAX_TOKENS, 2 * max_tokens + 16)


_PLAIN_ROOT = frozenset(
    {"id", "object", "created", "model", "choices", "usage", "system_fingerprint"}
)
_PLAIN_CHOICE = frozenset({"index", "text", "delta", "logprobs", "finish_reason", "stop_reason"})


@dataclass(frozen=True, slots=True)
class Wire:
    """A response shape: where its token counts live (``counts``: the object holding them,
    empty for the root) and what they are called there."""

    name: Literal["openai", "sglang", "llamacpp"]
    counts: str
    completion: str
    prompt: str

    def label(self, key: str) -> str:
        """A count's path on this wire, for notes (``key``: completion_tokens or prompt_tokens)."""
        name = self.completion if key == "completion_tokens" else self.prompt
        return f"{self.counts}.{name}" if self.counts else name


OPENAI = Wire("openai", "usage", "completion_tokens", "prompt_tokens")
#: SGLang ``/generate``: ``{"text", "output_ids", "meta_info": {"prompt_tokens",
#: "completion_tokens", "finish_reason": {"type", ...} | null, ...}}`` per chunk
#: (python/sglang/srt/managers/tokenizer_manager.py, ``_handle_batch_output``).
SGLANG_NATIVE = Wire("sglang", "meta_info", "completion_tokens", "prompt_tokens")
#: llama.cpp ``/completion``: ``{"content", "tokens", "stop", "tokens_predicted",
#: "tokens_evaluated", ...}``; the final one has ``"stop": true``, ``stop_type`` and ``timings``
#: (tools/server/server-task.cpp, ``to_json_non_oaicompat``).
LLAMACPP_NATIVE = Wire("llamacpp", "", "tokens_predicted", "tokens_evaluated")

#: llama.cpp's stop types as its own OpenAI routes name them (server-task.cpp).
_LLAMACPP_FINISH = {"limit": "length", "eos": "stop", "word": "stop"}


def wire_for(endpoint: Endpoint, backend: Backend) -> Wire:
    if endpoint != "native":
        return OPENAI
    return SGLANG_NATIVE if backend == "sglang" else LLAMACPP_NATIVE


class Seen:
    """What a request's responses hold, gathered in one pass as each arrives, so finishing the
    record never walks the stream again: the last usage object, the first finish reason, and
    the responses that can carry speculative-decoding stats (``carriers``)."""

    __slots__ = (
        "count", "finish_reason", "flagged", "last_text", "stopped", "usage", "usage_at", "wire",
    )  # fmt: skip

    def __init__(self, wire: Wire = OPENAI) -> None:
        self.wire = wire
        self.count = 0
        self.flagged: list[tuple[int, dict[str, Any]]] = []
        self.usage: dict[str, Any] | None = None
        self.usage_at: tuple[int, dict[str, Any]] | None = None
        self.finish_reason: object = None
        self.last_text = ""  # SGLang native: the text so far (cumulative by default)
        self.stopped = False  # llama.cpp native: the final chunk ("stop": true) arrived

    def add(self, response: object) -> tuple[str | None, bool, bool, dict[str, Any] | None]:
        """Note one response; returns (why it is not a completion chunk, whether it is a content
        chunk, whether its content text is non-empty, its usage object: for a native wire, its
        counts under the OpenAI names, values unchecked)."""
        index = self.count
        self.count += 1
        if not isinstance(response, dict):
            return "not a JSON object", False, False, None
        if self.wire is not OPENAI:
            return self._add_native(index, response)
        usage = response.get("usage")
        if not isinstance(usage, dict):
            usage = None
        elif usage:
            self.usage, self.usage_at = usage, (index, response)
        choices = response.get("choices")
        flagged = not _PLAIN_ROOT.issuperset(response)
        problem = None
        content = text = False
        finish: object = None
        if isinstance(choices, list):
            for c in choices:
                if not isinstance(c, dict):
                    problem, flagged = "choices is not a list of objects", True
                    continue
                reason = c.get("finish_reason")
                if reason is not None:
                    flagged = flagged or bool(reason)
                    if finish is None:
                        finish = reason
                if not flagged and not _PLAIN_CHOICE.issuperset(c):
                    flagged = True
                delta = c.get("delta")
                if isinstance(delta, dict):
                    content = True
                    piece = delta.get("content")
                else:
                    piece = c.get("text")
                    content = (
                        content or isinstance(piece, str) or isinstance(c.get("message"), dict)
                    )
                text = text or (isinstance(piece, str) and piece != "")
        else:
            flagged = True
            if choices is not None:
                problem = "choices is not a list of objects"
        if finish and self.finish_reason is None:
            self.finish_reason = finish
        if flagged:
            self.flagged.append((index, response))
        return problem, content, text, usage

    def _add_native(
        self, index: int, response: dict[str, Any]
    ) -> tuple[str | None, bool, bool, dict[str, Any] | None]:
        """One chunk of a native wire, held to the content-chunk rule of the OpenAI shape."""
        problem = None
        finish: object = None
        final = False
        if self.wire.name == "sglang":
            counts = response.get("meta_info")
            piece = response.get("text")
            if counts is not None and not isinstance(counts, dict):
                problem, counts = "meta_info is not an object", None
            if piece is not None and not isinstance(piece, str):
                problem = "text is not a string"
            content = isinstance(piece, str) and problem is None
            text = content and self._new_text(str(piece))
            reason = counts.get("finish_reason") if counts else None
            if reason is not None:
                final = True
                finish = reason.get("type") if isinstance(reason, dict) else reason
        else:
            counts = response
            piece = response.get("content")
            if piece is not None and not isinstance(piece, str):
                problem = "content is not a string"
            content = isinstance(piece, str)
            tokens = response.get("tokens")
            text = content and (piece != "" or (isinstance(tokens, list) and bool(tokens)))
            if response.get("stop") is True:
                final = self.stopped = True
                stop_type = response.get("stop_type")
                finish = (
                    _LLAMACPP_FINISH.get(stop_type, stop_type)
                    if isinstance(stop_type, str)
                    else stop_type
                )
        usage = None
        wire = self.wire
        if counts is not None and (wire.completion in counts or wire.prompt in counts):
            usage = {
                "completion_tokens": counts.get(wire.completion),
                "prompt_tokens": counts.get(wire.prompt),
            }
            self.usage, self.usage_at = usage, (index, response)
        if finish is not None and self.finish_reason is None:
            self.finish_reason = finish
        if problem is not None or not content or final or "error" in response:
            self.flagged.append((index, response))
        return problem, content and problem is None, text, usage

    def _new_text(self, piece: str) -> bool:
        """Whether SGLang's ``text`` brought new text: by default each chunk re-sends the whole
        text so far (new = what lies past the previous one); with
        ``--incremental-streaming-output`` each chunk is only the new piece."""
        last, self.last_text = self.last_text, piece
        if piece.startswith(last):
            return len(piece) > len(last)
        return piece != ""

    def carriers(self) -> list[dict[str, Any]]:
        """The flagged responses and the last one with usage, in arrival order."""
        out = self.flagged
        at = self.usage_at
        if at is not None and at[0] not in {i for i, _ in out}:
            out = sorted([*out, at], key=lambda pair: pair[0])
        return [r for _, r in out]


def carriers(responses: list[Any]) -> list[dict[str, Any]]:
    """The objects that can carry speculative-decoding stats or usage, in order: any with an
    extra field, a finished choice, and the last one with usage. Plain content chunks (most of a
    stream) are skipped, so detection costs per request, not per token."""
    seen = Seen()
    for r in responses:
        seen.add(r)
    return seen.carriers()


@dataclass(slots=True)
class Tally:
    """One request's accounting as its events arrive: parsing, token counts, ITL runs.

    Kept apart from the HTTP code so it can be fed any sequence of events in a test; it never
    raises, whatever the events hold. Each event is looked at once (``Seen.add``): this is the
    client's per-token cost.
    """

    record: RequestRecord
    max_tokens: int | None = None
    stream: bool = True
    tokens: int = 0  # completion tokens counted so far
    usage_peak: int = 0  # the highest believed usage.completion_tokens
    content_chunks: int = 0
    events: int = 0
    done: bool = False
    last_time: float | None = None
    problem: str = "no choice holds text, delta or message"  # the last event's, for messages
    seen: Seen = field(default_factory=Seen)
    bound: int = 0

    def __post_init__(self) -> None:
        self.bound = token_bound(self.max_tokens)

    @property
    def ended(self) -> bool:
        """The stream ended as its wire ends: ``[DONE]``, or llama.cpp's native final chunk."""
        return self.done or self.seen.stopped

    def event(self, data: str, now: float) -> None:
        """One SSE event's data."""
        if data.strip() == "[DONE]":
            self.done = True
            return
        scanned = self.parse(data)
        if scanned is not None:
            self.count(now, *scanned)

    def body(self, data: bytes, now: float) -> None:
        """A whole non-streamed body."""
        record = self.record
        record.ttft = now - record.start
        record.chunk_times.append(now)
        scanned = self.parse(data)
        if scanned is not None:
            self.count(None, *scanned)

    def parse(
        self, data: str | bytes
    ) -> tuple[dict[str, Any], bool, bool, dict[str, Any] | None] | None:
        """The event kept raw on the record and scanned: (chunk, content, text, usage), or None
        if it is unparsable."""
        self.events += 1
        record = self.record
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            raw = data if isinstance(data, str) else data[:1000].decode("utf-8", "replace")
            unparsed = {"unparsed": raw[:1000]}
            record.responses.append(unparsed)
            self.seen.add(unparsed)
            record.unparsable_events += 1
            self.problem = "not JSON"
            return None
        record.responses.append(chunk)
        problem, content, text, usage = self.seen.add(chunk)
        if problem is not None:
            record.unparsable_events += 1
            self.problem = problem
            return None
        return chunk, content, text, usage  # Seen.add found it an object

    def count(
        self,
        now: float | None,
        chunk: dict[str, Any],
        content: bool,
        text: bool,
        usage: dict[str, Any] | None,
    ) -> None:
        """Count the chunk's tokens and, streaming (``now`` given), its gaps."""
        record = self.record
        if chunk.get("error") is not None and record.error is None:
            record.error = f"the server sent an error: {chunk['error']!r:.300}"
        self.content_chunks += content
        if now is None:  # a whole body: finish_record reads its usage
            return
        reported = None if usage is None else usage.get("completion_tokens")
        if type(reported) is int and self.usage_peak <= reported <= self.bound:
            pass  # the common case, believed without building a message
        elif reported is not None:
            problem = count_problem(reported, self.bound)
            if problem is None and reported < self.usage_peak:
                problem = f"fell from {self.usage_peak} to {reported}"
            if problem is not None:
                record.note(f"{self.seen.wire.label('completion_tokens')}: {problem}")
                reported = None
        if reported is not None:
            tokens = reported - self.tokens
            self.tokens = self.usage_peak = reported
        elif content and text:
            tokens = 1
            self.tokens += 1
        else:
            return
        if tokens <= 0:
            return
        record.chunk_times.append(now)
        if record.ttft is None:
            record.ttft = now - record.start
        elif self.last_time is not None:
            record.itl_runs.append(((now - self.last_time) / tokens, tokens))
        self.last_time = now


def finish_record(record: RequestRecord, tally: Tally | None = None) -> None:
    """Fill the request-level fields from its responses, each type-checked, and judge it: a
    response without a content chunk fails the request. Never raises."""
    if tally is not None:
        seen = tally.seen
    else:
        seen = Seen()
        for r in record.responses:
            seen.add(r)
    usage, wire = seen.usage, seen.wire
    if usage:
        bound = token_bound(tally.max_tokens if tally else None)
        record.prompt_tokens = _checked(record, usage, "prompt_tokens", MAX_TOKENS, wire)
        tokens = _checked(record, usage, "completion_tokens", bound, wire)
        if tokens is not None and tally is not None and tokens < tally.usage_peak:
            label = wire.label("completion_tokens")
            record.note(f"{label}: fell from {tally.usage_peak} to {tokens}")
            tokens = None
        record.completion_tokens = tokens
    reason = seen.finish_reason
    if reason is not None and not isinstance(reason, str):
        record.note(f"finish_reason: not a string: {reason!r:.40}")
        reason = None
    record.finish_reason = reason
    if tally is not None and record.success and not tally.content_chunks:
        record.error = (
            f"no parseable content chunk: {record.unparsable_events} unparsable of "
            f"{tally.events} SSE events"
            if tally.stream
            else f"no parseable content chunk in the response body ({tally.problem})"
        )
    detection = detect(seen.carriers())
    record.spec_status = detection.status
    record.spec_adapter = detection.adapter
    record.spec_message = detection.message
    record.spec = detection.record.model_dump() if detection.record else None
    if detection.choices:
        record.spec_choices = {i: r.model_dump() for i, r in sorted(detection.choices.items())}


def _checked(
    record: RequestRecord, usage: dict[str, Any], key: str, bound: int, wire: Wire = OPENAI
) -> int | None:
    value = usage.get(key)
    if value is None:
        return None
    problem = count_problem(value, bound)
    if problem is not None:
        record.note(f"{wire.label(key)}: {problem}")
        return None
    return int(value)


async def _read_at_most(resp: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """The body, or its first ``limit`` bytes and True when it is longer."""
    parts: list[bytes] = []
    size = 0
    async for part in resp.content.iter_any():
        parts.append(part)
        size += len(part)
        if size > limit:
            return b"".join(parts)[:limit], True
    return b"".join(parts), False


class LoadGenerator:
    def __init__(self, config: LoadConfig, prompts: list[Prompt]) -> None:
        if not prompts:
            raise ValueError("no prompts to send")
        self.config = config
        self.prompts = prompts
        self.stop = asyncio.Event()
        self.on_done: Callable[[RequestRecord], None] | None = None
        path = route(config.endpoint, config.backend)
        self.wire = wire_for(config.endpoint, config.backend)
        self.replicas = config.replicas
        self.endpoint_urls = [base.rstrip("/") + path for base in self.replicas]
        self.outstanding = [0] * len(self.replicas)  # requests in flight per replica
        self.headers = {"Content-Type": "application/json"}
        if config.api_key:
            self.headers["Authorization"] = f"Bearer {config.api_key}"

    async def _send(
        self, session: aiohttp.ClientSession, record: RequestRecord, prompt: Prompt, t0: float
    ) -> None:
        config = self.config
        replica = self._route(record.index)
        record.replica = self.replicas[replica]
        self.outstanding[replica] += 1
        record.start = time.perf_counter() - t0
        body = orjson.dumps(_payload(config, prompt))
        tally = Tally(
            record, prompt.max_tokens or config.max_tokens, config.stream, seen=Seen(self.wire)
        )
        try:
            url = self.endpoint_urls[replica]
            async with await self._post(session, url, body) as resp:
                record.status = resp.status
                if resp.status != 200:
                    raw, _ = await _read_at_most(resp, MAX_ERROR_BYTES)
                    text = raw.decode("utf-8", errors="replace")
                    record.error = f"HTTP {resp.status}: {text[:500]}"
                    return
                if not config.stream:
                    raw, longer = await _read_at_most(resp, MAX_BODY_BYTES)
                    if longer:
                        record.error = f"the response body exceeds {MAX_BODY_BYTES} bytes"
                        return
                    tally.body(raw, time.perf_counter() - t0)
                else:
                    parser = SSEParser()
                    async for chunk in resp.content.iter_any():
                        now = time.perf_counter() - t0
                        for event in parser.feed(chunk):
                            tally.event(event.data, now)
                    if not tally.ended:
                        record.error = (
                            'the stream ended without its final chunk ("stop": true)'
                            if self.wire is LLAMACPP_NATIVE
                            else "the stream ended without [DONE]"
                        )
                        return
                record.end = time.perf_counter() - t0
        except asyncio.CancelledError:
            record.error = "cancelled"
            raise
        except (aiohttp.ClientError, TimeoutError, SSEError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # one bad response must not take the run down
            logger.debug("request %d failed", record.index, exc_info=True)
            record.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.outstanding[replica] -= 1
            self._finish(record, tally)

    async def _post(
        self, session: aiohttp.ClientSession, url: str, body: bytes
    ) -> aiohttp.ClientResponse:
        """POST, sending again on a fresh connection when the server dropped the connection
        before any byte of a response: a kept-alive connection it had closed (llama-server
        advertises keep-alive on a stream, then closes). Nothing was answered, so nothing was
        served twice; a failure after the response began is never retried."""
        for attempt in range(MAX_STALE_RETRIES + 1):
            try:
                return await session.post(url, data=body, headers=self.headers)
            except aiohttp.ServerDisconnectedError:
                if attempt == MAX_STALE_RETRIES:
                    raise
        raise AssertionError("unreachable")

    def _route(self, index: int) -> int:
        """The replica for request ``index``: round robin by index (the same spread whatever
        the parts), or the one with the fewest requests in flight from this generator (ties go
        round robin)."""
        n = len(self.replicas)
        if n == 1:
            return 0
        if self.config.routing == "round-robin":
            return index % n
        return min(range(n), key=lambda j: (self.outstanding[j], (j - index) % n))

    def _finish(self, record: RequestRecord, tally: Tally | None = None) -> None:
        try:
            finish_record(record, tally)
        except Exception as exc:  # a last resort: the record is kept, with why it is incomplete
            logger.debug("request %d: finishing its record failed", record.index, exc_info=True)
            record.error = record.error or f"{type(exc).__name__}: {exc}"
        if self.on_done is not None:
            self.on_done(record)

    def _arrivals(
        self, count: int | None, random_order: bool, warmup: bool, first_index: int
    ) -> Iterator[tuple[int, Prompt, float]]:
        """Every arrival of a phase, as a single generator draws them: (index within the phase,
        prompt, when it is due in seconds from the phase's start; 0 in a closed loop). A part
        takes every P-th, so the parts of a run together send exactly what one would."""
        config = self.config
        rng = np.random.default_rng(config.seed + (1 if warmup else 0))
        order = random.Random(config.seed)
        rate, shape = config.request_rate, config.burstiness
        prompts = self.prompts
        due, i = 0.0, 0
        while count is None or i < count:
            n = len(prompts)
            yield i, prompts[order.randrange(n) if random_order else (first_index + i) % n], due
            if rate:
                due += float(rng.gamma(shape, 1.0 / (rate * shape)))
            i += 1

    async def _phase(
        self,
        session: aiohttp.ClientSession,
        count: int | None,
        duration: float | None,
        warmup: bool,
        first_index: int,
        t0: float | None = None,
    ) -> tuple[list[RequestRecord], float, float, int]:
        """Send this part of one phase (warm-up or measured); returns its records, its
        duration, when it stopped sending and how many requests were in flight then.

        Times count from ``t0`` (a ``time.perf_counter`` value, shared by the parts of a run on
        one machine; default now). Open-loop arrivals are scheduled at absolute times (``t0``
        plus the summed gaps), so the loop's own work between sends does not lengthen every gap;
        a send is never started at or after ``duration``, and no wait runs past it."""
        config = self.config
        part, parts = config.part
        records: list[RequestRecord] = []
        tasks: set[asyncio.Task[None]] = set()
        concurrency = config.share(config.concurrency) if config.concurrency else None
        limit = asyncio.Semaphore(concurrency) if concurrency else None
        t0 = time.perf_counter() if t0 is None else t0
        open_loop = bool(config.request_rate)

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

        arrivals = self._arrivals(count, bool(duration), warmup, first_index)
        while not self.stop.is_set():
            arrival = next(arrivals, None)
            while arrival is not None and (first_index + arrival[0]) % parts != part:
                arrival = next(arrivals, None)
            if arrival is None:
                break
            index, prompt, due = arrival
            if limit is not None and not open_loop:
                # Closed loop: wait for a free slot before creating work, never past the end.
                left = None if duration is None else duration - (time.perf_counter() - t0)
                if left is not None and left <= 0:
                    break
                try:
                    await asyncio.wait_for(limit.acquire(), timeout=left)
                except TimeoutError:
                    break
                limit.release()
            wait = (due if duration is None else min(due, duration)) - (time.perf_counter() - t0)
            if wait > 0:  # open loop (or a start time ahead): sleep until due, never past the end
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), timeout=wait)
                if self.stop.is_set():
                    break
            if duration is not None and time.perf_counter() - t0 >= duration:
                break  # checked after the wait for a slot, which may end past the duration
            record = RequestRecord(first_index + index, prompt.category, warmup)
            if open_loop:
                record.scheduled = due
            records.append(record)
            task = asyncio.create_task(one(record, prompt))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(0)  # let the new task start its send
        sending = time.perf_counter() - t0
        in_flight = sum(1 for r in records if r.end is None and r.error is None)
        if tasks:
            if self.stop.is_set():
                _, pending = await asyncio.wait(tasks, timeout=config.grace)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
            else:
                await asyncio.gather(*tasks, return_exceptions=True)
        ends = [r.end for r in records if r.end is not None]
        return records, (max(ends) if ends else time.perf_counter() - t0), sending, in_flight

    async def run(self, before_measure: Callable[[], Any] | None = None) -> RunResult:
        """Warm up, call ``before_measure`` (e.g. scrape server counters), then measure.

        ``before_measure`` may return (or its coroutine resolve to) a ``time.perf_counter``
        value: the measured phase then starts at that time, shared with other parts."""
        config = self.config
        timeout = aiohttp.ClientTimeout(total=config.timeout)
        connector = aiohttp.TCPConnector(
            limit=max(config.concurrency or 0, 256),
            force_close=False,
            keepalive_timeout=KEEPALIVE_S,
        )
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            warm: list[RequestRecord] = []
            if config.warmup:
                warm, *_ = await self._phase(session, config.warmup, None, True, 0)
            t0 = None
            if before_measure is not None:
                result = before_measure()
                if asyncio.iscoroutine(result):
                    result = await result
                t0 = result if isinstance(result, float) else None
            started = time.time() + (0.0 if t0 is None else t0 - time.perf_counter())
            count = None if config.duration else config.num_requests
            records, duration, sending, in_flight = await self._phase(
                session, count, config.duration, False, config.warmup, t0
            )
        return RunResult(warm + records, started, duration, self.stop.is_set(), sending, in_flight)


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


def _llamacpp_props(body: object) -> bool:
    """llama.cpp's ``GET /props`` carries ``build_info`` and ``default_generation_settings``
    (tools/server/server-context.cpp, ``get_res_props``)."""
    return isinstance(body, dict) and "build_info" in body and "default_generation_settings" in body


PROBES: tuple[tuple[str, Backend, Callable[[object], bool]], ...] = (
    ("/get_model_info", "sglang", _sglang_info),
    ("/get_server_info", "sglang", _sglang_info),
    ("/props", "llamacpp", _llamacpp_props),
)


async def probe_backend(url: str, api_key: str | None = None) -> Probe:
    """Which engine serves ``url``: SGLang or llama.cpp by their own info routes, else openai.
    Bounded (``PROBE_TIMEOUT_S`` in all, ``PROBE_BODY_BYTES`` a body) and never raises: a
    server that answers none of the probes is an OpenAI-compatible server."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    misses: list[str] = []
    try:
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
            for path, backend, matches in PROBES:
                try:
                    async with session.get(url.rstrip("/") + path) as resp:
                        raw, longer = await _read_at_most(resp, PROBE_BODY_BYTES)
                        status = resp.status
                except aiohttp.ClientError as exc:
                    misses.append(f"{path}: {type(exc).__name__}")
                    continue
                if status != 200 or longer:
                    misses.append(
                        f"{path}: HTTP {status}" if status != 200 else f"{path}: too long"
                    )
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
