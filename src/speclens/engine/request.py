"""Requests, their sampling parameters, their per-request acceptance, and what the engine returns."""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from speclens.acceptance import AcceptanceHistogram

#: Bounds on a request's stop conditions, checked before anything is built from them: every
#: emitted token is matched against them on the engine thread, which all requests share.
MAX_STOP_STRINGS = 128
MAX_STOP_CHARS = 8192
MAX_STOP_TOKEN_IDS = 1024


class SamplingError(ValueError):
    """Invalid sampling parameters (the server answers 400, naming ``field`` when known)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def stop_problem(stop: Any, stop_token_ids: Any) -> tuple[str, str] | None:
    """The field and the message when ``stop`` or ``stop_token_ids`` is over its bound (counted
    before anything else is done with them), or None. Items of the wrong type are left to the
    caller's type checks."""
    strings = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    if len(strings) > MAX_STOP_STRINGS:
        return "stop", f"stop: {len(strings)} strings, expected at most {MAX_STOP_STRINGS}"
    chars = sum(len(s) for s in strings if isinstance(s, str))
    if chars > MAX_STOP_CHARS:
        return "stop", f"stop: {chars} characters in all, expected at most {MAX_STOP_CHARS}"
    if isinstance(stop_token_ids, list | tuple | set | frozenset) and (
        len(stop_token_ids) > MAX_STOP_TOKEN_IDS
    ):
        return "stop_token_ids", (
            f"stop_token_ids: {len(stop_token_ids)} token ids, expected at most "
            f"{MAX_STOP_TOKEN_IDS}"
        )
    return None


class StopMatcher:
    """Finds a request's stop strings in its text as the text grows, in time proportional to the
    new text whatever the number or length of the strings: an Aho-Corasick automaton (a trie of
    the strings with failure links), built once per request, whose state each sequence keeps.

    ``feed(state, new)`` returns the next state and the offset in ``new`` (negative: that many
    characters before it) where the earliest-starting stop string that ends in ``new`` begins,
    or None. Empty strings never match. ``work`` counts the automaton's transitions and failure
    hops (at most twice the characters fed, amortized), so tests can bound the cost.
    """

    __slots__ = ("_fail", "_goto", "_out", "longest", "work")

    def __init__(self, stops: Sequence[str]) -> None:
        goto: list[dict[str, int]] = [{}]
        out = [0]  # per state, the length of the longest stop string that ends there
        for text in stops:
            node = 0
            for ch in text:
                nxt = goto[node].get(ch)
                if nxt is None:
                    nxt = len(goto)
                    goto[node][ch] = nxt
                    goto.append({})
                    out.append(0)
                node = nxt
            out[node] = len(text) if text else 0
        fail = [0] * len(goto)
        queue = deque(goto[0].values())
        while queue:
            node = queue.popleft()
            for ch, nxt in goto[node].items():
                back = fail[node]
                while back and ch not in goto[back]:
                    back = fail[back]
                target = goto[back].get(ch, 0)
                fail[nxt] = target if target != nxt else 0
                out[nxt] = out[nxt] or out[fail[nxt]]
                queue.append(nxt)
        self._goto, self._fail, self._out = goto, fail, out
        self.longest = max((len(s) for s in stops), default=0)
        self.work = 0

    def feed(self, state: int, new: str) -> tuple[int, int | None]:
        goto, fail, out = self._goto, self._fail, self._out
        first: int | None = None
        work = 0
        for i, ch in enumerate(new):
            while state and ch not in goto[state]:
                state = fail[state]
                work += 1
            state = goto[state].get(ch, 0)
            work += 1
            if out[state]:
                start = i + 1 - out[state]
                first = start if first is None else min(first, start)
        self.work += work
        return state, first


@dataclass
class SamplingParams:
    """The sampling parameters users expect from vLLM and the OpenAI API."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1

    def __post_init__(self) -> None:
        problem = stop_problem(self.stop, self.stop_token_ids)
        if problem is not None:
            raise SamplingError(problem[1], problem[0])
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.max_tokens < 1:
            raise SamplingError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.temperature < 0.0:
            raise SamplingError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise SamplingError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise SamplingError(f"top_k must be -1 (off), 0 (off) or positive, got {self.top_k}")
        if self.n < 1:
            raise SamplingError(f"n must be at least 1, got {self.n}")
        if self.seed is not None and not 0 <= self.seed < 2**63 - 1024:
            raise SamplingError(f"seed must be in [0, 2**63 - 1024), got {self.seed}")

    @property
    def greedy(self) -> bool:
        """Temperature 0, or one so small that dividing by it would overflow (as vLLM)."""
        return self.temperature < 1e-5


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestAcceptance:
    """One request's speculative decoding: decode steps, verify steps, drafts, accepted, per step.

    A decode step is a target forward after the request's prefill; it is a verify step only when
    it drafted at least one token, so ``per_step_*`` list verify steps alone (vLLM's convention)
    and ``num_decode_steps`` also counts the steps that drafted nothing.
    """

    num_spec_tokens: int | None = None
    histogram: AcceptanceHistogram = field(default_factory=AcceptanceHistogram)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_decode_steps: int = 0
    per_step_accepted: list[int] = field(default_factory=list)
    per_step_drafted: list[int] = field(default_factory=list)

    def record(self, drafted: int, accepted: int) -> None:
        """Count one decode step of this request."""
        self.num_decode_steps += 1
        if drafted <= 0:
            return
        self.histogram.add(accepted)
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        self.per_step_drafted.append(drafted)
        self.per_step_accepted.append(accepted)

    @property
    def num_spec_steps(self) -> int:
        return len(self.per_step_accepted)

    @property
    def draft_coverage(self) -> float | None:
        """Verify steps over decode steps; None before the first decode step."""
        return self.num_spec_steps / self.num_decode_steps if self.num_decode_steps else None

    @property
    def mean_acceptance_length(self) -> float:
        return self.histogram.acceptance_length

    @property
    def draft_acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0


@dataclass(eq=False)  # identity: the scheduler's lists hold each request once
class Request:
    """One sequence being generated (a request with n > 1 becomes n of these)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_id: int | None = None
    #: The user's request id (a request with n > 1 has n sequences under one parent).
    parent_id: str = ""
    output_token_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    finish_reason: str | None = None
    #: KV cache blocks (shared by target and drafter pools) and how many positions are valid.
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0
    num_draft_computed: int = 0
    num_preemptions: int = 0
    acceptance: RequestAcceptance = field(default_factory=RequestAcceptance)
    generator: torch.Generator | None = None
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    #: Text emitted so far (after stop-string truncation) and the decoder state behind it.
    text: str = ""
    decoder: Any = None
    #: The stop strings' automaton (shared by a request's sequences) and this sequence's state
    #: in it; the stop token ids as a set.
    stop_matcher: StopMatcher | None = None
    stop_state: int = 0
    stop_token_ids: frozenset[int] = frozenset()

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def last_token(self) -> int:
        return (self.output_token_ids or self.prompt_token_ids)[-1]

    def token(self, position: int) -> int:
        p = len(self.prompt_token_ids)
        return (
            self.prompt_token_ids[position] if position < p else self.output_token_ids[position - p]
        )

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED


@dataclass
class CompletionOutput:
    """One generated sequence, cumulative."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    acceptance: RequestAcceptance


@dataclass
class RequestOutput:
    """What ``step``/``generate`` return for a request: its sequences so far and usage."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    new_token_ids: list[list[int]] = field(default_factory=list)
    new_text: list[str] = field(default_factory=list)
    arrival_time: float = 0.0
    first_token_time: float | None = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def completion_tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)

    @property
    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }
