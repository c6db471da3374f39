"""What a run's speculative decoding actually did, counted step by step.

``SpecDecodeStats`` accumulates draft tokens, accepted tokens, verify steps, the accepted-count
histogram and per-position accepted counts, and renders ``GET /debug/mtp_stats`` exactly. A
request-step that proposed no drafts is not a verify step (as in vLLM's ``num_drafts``), but it is
a decode step: ``num_decode_steps`` counts both, so ``draft_coverage`` says how often a step drafted
(an n-gram drafter often finds nothing, and AL alone then overstates tokens per target forward).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from speclens.acceptance import AcceptanceHistogram


class SpecDecodeStats:
    """Engine-wide (or per-request) speculative-decoding counters."""

    def __init__(self, num_spec_tokens: int = 0, enabled: bool = True) -> None:
        self.enabled = enabled
        self.num_spec_tokens = num_spec_tokens
        self.num_drafts = 0  # verify steps: request-steps that proposed at least one draft
        self.num_decode_steps = 0  # every request-step after prefill, drafted or not
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.histogram = AcceptanceHistogram()
        self.accepted_per_position = [0] * num_spec_tokens

    def record(self, num_drafted: Iterable[int], num_accepted: Iterable[int]) -> None:
        """Count one step: per request, the drafts it proposed and how many were accepted.

        The whole step is checked before anything is counted, so a bad entry changes nothing.
        """
        pairs = [(int(d), int(a)) for d, a in zip(num_drafted, num_accepted, strict=True)]
        for drafted, accepted in pairs:
            if drafted < 0 or not 0 <= accepted <= drafted:
                raise ValueError(f"accepted {accepted} drafts of {drafted}")
        self.num_decode_steps += len(pairs)
        for drafted, accepted in pairs:
            if drafted == 0:
                continue
            self.num_drafts += 1
            self.num_draft_tokens += drafted
            self.num_accepted_tokens += accepted
            self.histogram.add(accepted)
            if accepted > len(self.accepted_per_position):
                self.accepted_per_position += [0] * (accepted - len(self.accepted_per_position))
            for position in range(accepted):
                self.accepted_per_position[position] += 1

    def update(self, other: SpecDecodeStats) -> None:
        """Add another accumulator's counts into this one."""
        self.num_drafts += other.num_drafts
        self.num_decode_steps += other.num_decode_steps
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        self.histogram.update(other.histogram)
        extra = len(other.accepted_per_position) - len(self.accepted_per_position)
        self.accepted_per_position += [0] * max(0, extra)
        for i, n in enumerate(other.accepted_per_position):
            self.accepted_per_position[i] += n

    @property
    def acceptance_length(self) -> float:
        """Realized AL: 1 + accepted / verify steps (1.0 before any step)."""
        return self.histogram.acceptance_length

    @property
    def draft_acceptance_rate(self) -> float:
        """Accepted draft tokens over drafted tokens (0.0 before any draft)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def draft_coverage(self) -> float | None:
        """Decode steps that drafted over all decode steps (None before any decode step)."""
        return self.num_drafts / self.num_decode_steps if self.num_decode_steps else None

    def mtp_stats(self) -> dict[str, Any]:
        """The ``GET /debug/mtp_stats`` object: the seed's keys, plus ``draft_coverage``.

        Where the seed's example is silent it follows ATOM's ``LLMEngine.get_mtp_statistics``:
        floats unrounded, and a ratio over no steps reads 0.0 (``average_tokens_per_forward``
        included). ``distribution`` stays sparse, as the seed's example shows it.
        """
        fractions = self.histogram.fractions()
        ran = self.num_drafts > 0
        return {
            "enabled": self.enabled,
            "total_draft_tokens": self.num_draft_tokens,
            "total_accepted_tokens": self.num_accepted_tokens,
            "acceptance_rate": self.draft_acceptance_rate,
            "average_tokens_per_forward": self.acceptance_length if ran else 0.0,
            "distribution": {str(j): n for j, n in self.histogram.counts.items()},
            "distribution_percent": {str(j): f for j, f in fractions.items()},
            "draft_coverage": self.draft_coverage or 0.0,
        }
