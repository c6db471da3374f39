"""What one request and one run leave behind: ``RequestRecord`` (as the client saw it, every
response kept raw) and ``RunResult``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_ANOMALIES = 10  # notes kept per request


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
    #: Of its prompt tokens, those the server took from its prefix cache (OpenAI's
    #: ``usage.prompt_tokens_details.cached_tokens``), where it says.
    cached_tokens: int | None = None
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
