"""One request of the step-exact loop: its arrival and lengths, then what the engine did with it.

Its own module so that both the loop (``simulate``) and the run's files (``run_output``) read it
without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads only for the step-exact loop
    from speclens.engine.request import RequestAcceptance


@dataclass
class SimRequest:
    index: int
    arrival: float
    input_tokens: int
    output_tokens: int
    first_token: float | None = None
    finish: float | None = None
    token_times: list[tuple[float, int]] = field(default_factory=list)
    #: The engine's count of its speculation, set when it finishes.
    acceptance: RequestAcceptance | None = None
