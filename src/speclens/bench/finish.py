"""A request's accounting: ``Tally`` counts tokens and gaps as events arrive, and
``finish_record`` fills the request-level fields from its responses and judges it.

The server is untrusted: every value read from a response is type-checked where it is read, and
a bad one is dropped with a note on the record (``anomalies``), never passed on. Token counts come
from ``usage``: the client asks for ``include_usage`` and ``continuous_usage_stats``, so a chunk
that carries several tokens (normal under speculation) is counted right; without per-chunk usage
each content chunk counts one token.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from speclens.bench.adapters import detect
from speclens.bench.wire import MAX_TOKENS, OPENAI, Seen, Wire, count_problem, token_bound
from speclens.runs.request import RequestRecord


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
    #: What a raw payload (JSON bytes) is kept as on the record: ``orjson.Fragment``, written
    #: into records.jsonl as it is, never parsed again; ``bytes`` where records are pickled.
    keep: Callable[[bytes], Any] = orjson.Fragment
    bound: int = 0

    def __post_init__(self) -> None:
        self.bound = token_bound(self.max_tokens)

    @property
    def ended(self) -> bool:
        """The stream ended as its wire ends: ``[DONE]``, or llama.cpp's native final chunk."""
        return self.done or self.seen.stopped

    def event(self, data: str | bytes, now: float) -> None:
        """One SSE event's data (the bytes as read, or text). The client's per-token path: a
        chunk whose usage count is believed and grew is counted inline."""
        scanned = self.parse(data)
        if scanned is None:
            return
        chunk, content, text, usage = scanned
        reported = None if usage is None else usage.get("completion_tokens")
        if type(reported) is int and "error" not in chunk:
            tokens = reported - self.tokens
            if tokens > 0 and self.usage_peak <= reported <= self.bound:
                self.content_chunks += content
                self.tokens = self.usage_peak = reported
                record = self.record
                record.chunk_times.append(now)
                last, self.last_time = self.last_time, now
                if record.ttft is None:
                    record.ttft = now - record.start
                elif last is not None:
                    record.itl_runs.append(((now - last) / tokens, tokens))
                return
        self.count(now, chunk, content, text, usage)

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
        """The event kept raw on the record (``keep``: as the bytes it came as where those are
        plain JSON) and scanned: (chunk, content, text, usage); None for ``[DONE]`` (``done``) or
        an unparsable event."""
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            chunk = self._unusual(data)
            if chunk is _SKIP:
                return None
            raw = orjson.dumps(chunk)
        else:
            # Bytes that parsed are kept as they came unless a line break or an escape is in
            # them: records.jsonl is a line a record, and credentials are redacted in the forms
            # orjson writes (a server's own escapes could hide one).
            if (
                type(data) is bytes
                and b"\\" not in data
                and b"\n" not in data
                and b"\r" not in data
            ):
                raw = data
            else:
                raw = orjson.dumps(chunk)
        self.events += 1
        record = self.record
        record.responses.append(self.keep(raw))
        problem, content, text, usage = self.seen.add(chunk)
        if problem is not None:
            record.unparsable_events += 1
            self.problem = problem
            return None
        return chunk, content, text, usage  # Seen.add found it an object

    def _unusual(self, data: str | bytes) -> Any:
        """An event orjson refused: ``[DONE]`` (``_SKIP``), text whose invalid UTF-8 became
        U+FFFD (the value), or not JSON (kept as ``{"unparsed": ...}``, counted; ``_SKIP``)."""
        text = data if isinstance(data, str) else data.decode("utf-8", "replace")
        if text.strip() == "[DONE]":
            self.done = True
            return _SKIP
        if not isinstance(data, str):
            with contextlib.suppress(orjson.JSONDecodeError):
                return orjson.loads(text)
        self.events += 1
        # Text passed in (not read) may hold a lone surrogate, which no JSON line can.
        unparsed = {"unparsed": text[:1000].encode("utf-8", "replace").decode()}
        self.record.responses.append(self.keep(orjson.dumps(unparsed)))
        self.seen.add(unparsed)
        self.record.unparsable_events += 1
        self.problem = "not JSON"
        return _SKIP

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


def payloads(record: RequestRecord) -> list[Any]:
    """The record's raw payloads as JSON values (the client keeps them as bytes: ``Tally.keep``;
    a record read back from records.jsonl holds them parsed already)."""
    return list(orjson.loads(orjson.dumps(record.responses)))


#: Stands for "no value" where JSON null is one.
_SKIP: Any = object()


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
        record.cached_tokens = _cached(record, usage)
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


def _cached(record: RequestRecord, usage: dict[str, Any]) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens``: a count no larger than the prompt."""
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, dict):
        return None
    bound = record.prompt_tokens if record.prompt_tokens is not None else MAX_TOKENS
    return _count(record, details.get("cached_tokens"), bound,
                  "usage.prompt_tokens_details.cached_tokens")  # fmt: skip


def _checked(
    record: RequestRecord, usage: dict[str, Any], key: str, bound: int, wire: Wire = OPENAI
) -> int | None:
    return _count(record, usage.get(key), bound, wire.label(key))


def _count(record: RequestRecord, value: Any, bound: int, label: str) -> int | None:
    """``value`` as a count within ``bound``, or None (noted under ``label`` when it is there
    and wrong)."""
    if value is None:
        return None
    problem = count_problem(value, bound)
    if problem is not None:
        record.note(f"{label}: {problem}")
        return None
    return int(value)
