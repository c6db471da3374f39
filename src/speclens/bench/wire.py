"""The response shapes the client reads (``Wire``), the routes and payload predicates, and
``Seen``: one pass over a request's responses that keeps what finishing its record needs.

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

from dataclasses import dataclass
from typing import Any, Literal

Endpoint = Literal["completions", "chat", "native"]
Backend = Literal["openai", "sglang", "llamacpp"]
Routing = Literal["round-robin", "least-outstanding"]

#: The OpenAI routes, and each backend's own route (``--endpoint native``).
ROUTES = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
NATIVE_ROUTES = {"sglang": "/generate", "llamacpp": "/completion"}

MAX_TOKENS = 2**31  # no token count above this is believed


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


def _plain(response: dict[str, Any]) -> bool | None:
    """For a chunk of exactly the commonest shape (plain root, one unfinished choice of plain
    keys with a ``delta`` object or ``text`` string), whether its text is non-empty; None for
    any other, which ``Seen.add`` walks in full."""
    choices = response.get("choices")
    if type(choices) is not list or len(choices) != 1 or not _PLAIN_ROOT.issuperset(response):
        return None
    choice = choices[0]
    if (
        type(choice) is not dict
        or choice.get("finish_reason") is not None
        or not _PLAIN_CHOICE.issuperset(choice)
    ):
        return None
    delta = choice.get("delta")
    if type(delta) is dict:
        piece = delta.get("content")
        return type(piece) is str and piece != ""
    piece = choice.get("text")
    if delta is None and type(piece) is str:
        return piece != ""
    return None


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


def _native_cached(wire: Wire, counts: dict[str, Any]) -> object:
    """The prompt tokens a native wire says came from the prefix cache: SGLang's
    ``meta_info.cached_tokens``, llama.cpp's ``timings.cache_n`` (unchecked; None if absent)."""
    if wire.name == "sglang":
        return counts.get("cached_tokens")
    timings = counts.get("timings")
    return timings.get("cache_n") if isinstance(timings, dict) else None


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
        if type(response) is dict and self.wire is OPENAI:
            plain = _plain(response)
            if plain is not None:  # most of a stream: one unfinished choice, no extra field
                usage = response.get("usage")
                if type(usage) is not dict:
                    usage = None
                elif usage:
                    self.usage, self.usage_at = usage, (index, response)
                return None, True, plain, usage
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
                "prompt_tokens_details": {"cached_tokens": _native_cached(wire, counts)},
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
