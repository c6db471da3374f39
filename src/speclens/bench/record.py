"""The engine-neutral per-request speculative-decoding acceptance record.

One record per request, filled by an engine adapter from that engine's wire payload, so the
metrics layer reasons about acceptance without knowing which engine produced it. It is
tree-agnostic (a histogram, not per-position arrays) and adaptive-safe (no fixed K assumed).

Every invariant is checked at construction: a record that exists is self-consistent, so an
adapter can hand the raw numbers over and let a contradicting payload fail here.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from speclens.acceptance.histogram import AcceptanceHistogram

#: Absolute tolerance for the reported mean acceptance length and draft acceptance rate.
TOLERANCE = 1e-6

#: Counts are bounded to int64, what any engine can put on the wire; it also keeps every
#: derived ratio a finite float.
MAX_COUNT = 2**63 - 1

Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
StepCounts = tuple[StrictInt, ...]


class SpecDecodeAcceptanceRecord(BaseModel):
    """One request's speculative-decoding acceptance, as its engine reported it.

    Strict types: a count given as a string or a float is refused, not coerced, because a wire
    payload of the wrong type is malformed. The per-step arrays accept any sequence of ints and
    are stored as tuples so the record is immutable all the way down (save the histogram dict).
    """

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid", allow_inf_nan=False)

    engine: str = Field(min_length=1, description="Serving engine that produced the stats.")
    mean_acceptance_length: float = Field(
        description="Tokens per verify step including the bonus token: 1 + accepted / steps."
    )
    draft_acceptance_rate: float = Field(
        description="num_accepted_draft_tokens / num_draft_tokens (0.0 when nothing drafted)."
    )
    acceptance_histogram: dict[int, int] = Field(
        description="{accepted drafts: verify steps}, sparse, zero buckets omitted, bonus excluded."
    )
    num_accepted_draft_tokens: Count
    num_draft_tokens: Count
    num_spec_steps: Count
    num_spec_tokens: Annotated[int, Field(ge=1, le=MAX_COUNT)] | None = Field(
        default=None, description="K, the per-step draft bound; None when the engine has none."
    )
    num_decode_steps: Count | None = Field(
        default=None,
        description="Decode steps, drafted or not (verify steps included); None when not reported.",
    )
    completion_tokens: Count | None = Field(
        default=None, description="From the response usage only; None when it carried none."
    )
    per_step_accepted: StepCounts | None = Field(default=None, strict=False)
    per_step_drafted: StepCounts | None = Field(default=None, strict=False)

    @field_validator("acceptance_histogram")
    @classmethod
    def _sparse(cls, value: dict[int, int]) -> dict[int, int]:
        """Keys and counts are non-negative; zero buckets are dropped and keys sorted so two
        records of the same histogram compare equal however the engine spelled it."""
        bad = [
            f"{j}: {n}"
            for j, n in value.items()
            if not (0 <= j <= MAX_COUNT and 0 <= n <= MAX_COUNT)
        ]
        if bad:
            raise ValueError(f"keys and counts must be integers in [0, 2**63 - 1], got {bad}")
        return {j: n for j, n in sorted(value.items()) if n}

    @model_validator(mode="after")
    def _consistent(self) -> SpecDecodeAcceptanceRecord:
        problems = self._problems()
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _problems(self) -> list[str]:
        hist = self.histogram
        steps, accepted, drafted = (
            self.num_spec_steps,
            self.num_accepted_draft_tokens,
            self.num_draft_tokens,
        )
        k = self.num_spec_tokens
        out: list[str] = []
        if hist.num_steps != steps:
            out.append(f"acceptance_histogram sums to {hist.num_steps} steps, not {steps}")
        if hist.num_accepted != accepted:
            out.append(
                f"acceptance_histogram counts {hist.num_accepted} accepted drafts, not {accepted}"
            )
        if accepted > drafted:
            out.append(f"{accepted} accepted draft tokens exceed {drafted} drafted")
        if self.num_decode_steps is not None and self.num_decode_steps < steps:
            out.append(f"num_decode_steps {self.num_decode_steps} is below num_spec_steps {steps}")
        if k is not None and hist.max_accepted > k:
            out.append(f"acceptance_histogram has a count at {hist.max_accepted} > K = {k}")
        out += self._per_step_problems()
        # AL is derived by the histogram alone; once its totals match, it is 1 + accepted / steps.
        expected_al = hist.acceptance_length
        al = self.mean_acceptance_length
        if not math.isclose(al, expected_al, rel_tol=0.0, abs_tol=TOLERANCE):
            out.append(
                f"mean_acceptance_length {al!r} is not 1 + accepted / steps ({expected_al!r})"
            )
        if al < 1.0 or (k is not None and al > k + 1):
            bound = f"[1, {k + 1}]" if k is not None else "[1, inf)"
            out.append(f"mean_acceptance_length {al!r} lies outside {bound}")
        expected_rate = accepted / drafted if drafted else 0.0
        rate = self.draft_acceptance_rate
        if not math.isclose(rate, expected_rate, rel_tol=0.0, abs_tol=TOLERANCE):
            out.append(
                f"draft_acceptance_rate {rate!r} is not accepted / drafted ({expected_rate!r})"
            )
        return out

    def _per_step_problems(self) -> list[str]:
        acc, dra = self.per_step_accepted, self.per_step_drafted
        if acc is None and dra is None:
            return []
        if acc is None or dra is None:
            return ["per_step_accepted and per_step_drafted must be given together"]
        out: list[str] = []
        steps = self.num_spec_steps
        if len(acc) != steps or len(dra) != steps:
            out.append(
                f"per-step arrays have {len(acc)} and {len(dra)} entries, not num_spec_steps {steps}"
            )
        if any(not 0 <= v <= MAX_COUNT for v in (*acc, *dra)):
            out.append(f"per-step counts must lie in [0, {MAX_COUNT}]")
            return out
        if sum(acc) != self.num_accepted_draft_tokens:
            out.append(
                f"per_step_accepted sums to {sum(acc)}, not {self.num_accepted_draft_tokens}"
            )
        if sum(dra) != self.num_draft_tokens:
            out.append(f"per_step_drafted sums to {sum(dra)}, not {self.num_draft_tokens}")
        over = [i for i, (a, d) in enumerate(zip(acc, dra, strict=False)) if a > d]
        if over:
            out.append(f"per-step accepted exceeds drafted at step {over[0]}")
        if {j: n for j, n in sorted(Counter(acc).items())} != self.acceptance_histogram:
            out.append("acceptance_histogram is not the count of per_step_accepted")
        return out

    @property
    def draft_coverage(self) -> float | None:
        """Verify steps over decode steps; None when decode steps are not reported or zero."""
        decode = self.num_decode_steps
        return self.num_spec_steps / decode if decode else None

    @property
    def histogram(self) -> AcceptanceHistogram:
        """The histogram as the shared type, for AL, rates and pooling across requests (a copy)."""
        return AcceptanceHistogram(self.acceptance_histogram)

    def same_measurement(self, other: SpecDecodeAcceptanceRecord) -> bool:
        """True when ``other`` reports the same acceptance, whatever engine label it carries.

        Two wire shapes of one response (our server emits both) must agree on every count; the
        two floats may differ by rounding only, as each is held within TOLERANCE of the counts.
        """
        mine, theirs = self._comparable(), other._comparable()
        for name, value in mine.items():
            if isinstance(value, float):
                if not math.isclose(value, theirs[name], rel_tol=0.0, abs_tol=2 * TOLERANCE):
                    return False
            elif value != theirs[name]:
                return False
        return True

    def differences(self, other: SpecDecodeAcceptanceRecord) -> list[str]:
        """The fields (engine aside) on which ``other`` reports something else, for messages."""
        mine, theirs = self._comparable(), other._comparable()
        out = []
        for name, value in mine.items():
            if isinstance(value, float):
                same = math.isclose(value, theirs[name], rel_tol=0.0, abs_tol=2 * TOLERANCE)
            else:
                same = value == theirs[name]
            if not same:
                out.append(f"{name} ({value!r} vs {theirs[name]!r})")
        return out

    def _comparable(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in type(self).model_fields if name != "engine"}
