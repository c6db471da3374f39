"""The engine-neutral per-request speculative-decoding acceptance record.

One record per request, filled by an engine adapter from that engine's wire payload, so the
metrics layer reasons about acceptance without knowing which engine produced it. It is
tree-agnostic (a histogram, not per-position arrays) and adaptive-safe (no fixed K assumed).

Every invariant is checked at construction: a record that exists is self-consistent, so an
adapter can hand the raw numbers over and let a contradicting payload fail here.

A record is full (histogram, verify steps, counts, AL) or **counts only** (llama.cpp: drafted and
accepted tokens, nothing else): then ``num_spec_steps``, ``acceptance_histogram`` and
``mean_acceptance_length`` are None, AL is not derivable from the request and the draft
acceptance rate is. Nothing is ever estimated to fill the gaps.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeGuard

import orjson
import pydantic
from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from speclens.acceptance.histogram import AcceptanceHistogram
from speclens.acceptance.quantity import acceptance_length

#: Positions read from ``VLLM_PER_POSITION``; a label outside 0..MAX_POSITIONS-1 is ignored.
MAX_POSITIONS = 64

#: Absolute tolerance for the reported mean acceptance length and draft acceptance rate.
TOLERANCE = 1e-6

#: Counts are bounded to int64, what any engine can put on the wire; it also keeps every
#: derived ratio a finite float.
MAX_COUNT = 2**63 - 1

Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
StepCounts = tuple[StrictInt, ...]

#: What ``num_draft_tokens`` counts, which differs between engines, so draft acceptance rates
#: of different units are never pooled or compared (AL is): ``tokens`` draft tokens sent to
#: verification (vLLM after grammar invalidation, llama.cpp, speclens), ``tree-nodes`` SGLang's
#: tree nodes x steps, ``paths`` TensorRT-LLM's draft paths, ``slots`` ATOM's mtp_k x steps
#: whether or not drafts were proposed.
DraftUnit = Literal["tokens", "tree-nodes", "paths", "slots"]

#: Each engine's unit, for adapters that do not set one.
DRAFT_UNITS: dict[str, DraftUnit] = {
    "vllm": "tokens",
    "llama.cpp": "tokens",
    "sglang": "tree-nodes",
    "trtllm": "paths",
    "atom": "slots",
}


class SpecDecodeAcceptanceRecord(BaseModel):
    """One request's speculative-decoding acceptance, as its engine reported it.

    Strict types: a count given as a string or a float is refused, not coerced, because a wire
    payload of the wrong type is malformed. The per-step arrays accept any sequence of ints and
    are stored as tuples so the record is immutable all the way down (save the histogram dict).
    """

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid", allow_inf_nan=False)

    engine: str = Field(min_length=1, description="Serving engine that produced the stats.")
    mean_acceptance_length: float | None = Field(
        description="Tokens per verify step including the bonus token: 1 + accepted / steps; "
        "None when steps are unknown (counts only)."
    )
    draft_acceptance_rate: float = Field(
        description="num_accepted_draft_tokens / num_draft_tokens (0.0 when nothing drafted)."
    )
    acceptance_histogram: dict[int, int] | None = Field(
        description="{accepted drafts: verify steps}, sparse, zero buckets omitted, bonus "
        "excluded; None when the engine reports none."
    )
    num_accepted_draft_tokens: Count
    num_draft_tokens: Count
    num_spec_steps: Count | None = Field(description="Verify steps; None when not reported.")
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
    draft_unit: DraftUnit | None = Field(
        default=None, description="What num_draft_tokens counts; None when unknown."
    )
    acceptance_histogram_by_draft_length: dict[int, dict[int, int]] | None = Field(
        default=None,
        description="{draft length: {accepted drafts: verify steps}} (vLLM, variable-length "
        "drafting); its buckets sum to acceptance_histogram.",
    )

    @field_validator("acceptance_histogram")
    @classmethod
    def _sparse(cls, value: dict[int, int] | None) -> dict[int, int] | None:
        """Keys and counts are non-negative; zero buckets are dropped and keys sorted so two
        records of the same histogram compare equal however the engine spelled it."""
        return None if value is None else _sparse(value)

    @field_validator("acceptance_histogram_by_draft_length")
    @classmethod
    def _sparse_by_length(
        cls, value: dict[int, dict[int, int]] | None
    ) -> dict[int, dict[int, int]] | None:
        if value is None:
            return None
        if any(not 1 <= d <= MAX_COUNT for d in value):
            raise ValueError("draft lengths must be integers in [1, 2**63 - 1]")
        return {d: h for d, row in sorted(value.items()) if (h := _sparse(row))}

    @model_validator(mode="after")
    def _consistent(self) -> SpecDecodeAcceptanceRecord:
        problems = self._problems()
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _problems(self) -> list[str]:
        accepted, drafted = self.num_accepted_draft_tokens, self.num_draft_tokens
        out: list[str] = []
        if accepted > drafted:
            out.append(f"{accepted} accepted draft tokens exceed {drafted} drafted")
        expected_rate = accepted / drafted if drafted else 0.0
        rate = self.draft_acceptance_rate
        if not math.isclose(rate, expected_rate, rel_tol=0.0, abs_tol=TOLERANCE):
            out.append(
                f"draft_acceptance_rate {rate!r} is not accepted / drafted ({expected_rate!r})"
            )
        if self.num_spec_steps is None:
            unknown = ("acceptance_histogram", "mean_acceptance_length", "per_step_accepted",
                       "per_step_drafted", "num_decode_steps",
                       "acceptance_histogram_by_draft_length")  # fmt: skip
            given = [name for name in unknown if getattr(self, name) is not None]
            if given:
                out.append(f"{', '.join(given)} given without num_spec_steps (counts only)")
            return out
        return out + self._step_problems(self.num_spec_steps)

    def _step_problems(self, steps: int) -> list[str]:
        accepted, drafted = self.num_accepted_draft_tokens, self.num_draft_tokens
        k = self.num_spec_tokens
        out: list[str] = []
        raw = self.acceptance_histogram
        if raw is not None:
            hist = AcceptanceHistogram(raw)
            if hist.num_steps != steps:
                out.append(f"acceptance_histogram sums to {hist.num_steps} steps, not {steps}")
            if hist.num_accepted != accepted:
                out.append(
                    f"acceptance_histogram counts {hist.num_accepted} accepted drafts, "
                    f"not {accepted}"
                )
            if k is not None and hist.max_accepted > k:
                out.append(f"acceptance_histogram has a count at {hist.max_accepted} > K = {k}")
        if self.num_decode_steps is not None and self.num_decode_steps < steps:
            out.append(f"num_decode_steps {self.num_decode_steps} is below num_spec_steps {steps}")
        out += self._per_step_problems()
        out += self._by_length_problems(drafted)
        expected_al = acceptance_length(accepted, steps)
        al = self.mean_acceptance_length
        if al is None:
            out.append("mean_acceptance_length is missing though num_spec_steps is given")
            return out
        if not math.isclose(al, expected_al, rel_tol=0.0, abs_tol=TOLERANCE):
            out.append(
                f"mean_acceptance_length {al!r} is not 1 + accepted / steps ({expected_al!r})"
            )
        if al < 1.0 or (k is not None and al > k + 1):
            bound = f"[1, {k + 1}]" if k is not None else "[1, inf)"
            out.append(f"mean_acceptance_length {al!r} lies outside {bound}")
        return out

    def _by_length_problems(self, drafted: int) -> list[str]:
        """Each draft length's steps accept at most that many; the rows add up to the
        histogram, and length x steps to the drafted tokens."""
        rows = self.acceptance_histogram_by_draft_length
        if rows is None:
            return []
        if self.acceptance_histogram is None:
            return ["acceptance_histogram_by_draft_length given without acceptance_histogram"]
        out = []
        total = AcceptanceHistogram()
        for d, row in rows.items():
            h = AcceptanceHistogram(row)
            if h.max_accepted > d:
                out.append(
                    f"acceptance_histogram_by_draft_length[{d}] has a count at "
                    f"{h.max_accepted} > {d}"
                )
            total.update(h)
        if total.counts != self.acceptance_histogram:
            out.append(
                "acceptance_histogram_by_draft_length does not add up to acceptance_histogram"
            )
        drafted_by_length = sum(d * sum(row.values()) for d, row in rows.items())
        if drafted_by_length != drafted:
            out.append(
                f"acceptance_histogram_by_draft_length drafts {drafted_by_length} tokens, "
                f"not num_draft_tokens {drafted}"
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
        if self.acceptance_histogram is None:
            return ["per-step arrays given without acceptance_histogram"]
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
    def counts_only(self) -> bool:
        """Drafted and accepted tokens only: steps, histogram and AL unknown (llama.cpp)."""
        return self.num_spec_steps is None

    @property
    def draft_coverage(self) -> float | None:
        """Verify steps over decode steps; None when either is not reported or zero."""
        decode, steps = self.num_decode_steps, self.num_spec_steps
        return steps / decode if decode and steps is not None else None

    @property
    def histogram(self) -> AcceptanceHistogram | None:
        """The histogram as the shared type, for AL, rates and pooling across requests (a copy);
        None when the engine reports none."""
        raw = self.acceptance_histogram
        return None if raw is None else AcceptanceHistogram(raw)

    def same_measurement(self, other: SpecDecodeAcceptanceRecord) -> bool:
        """True when ``other`` reports the same acceptance, whatever engine label it carries.

        Two wire shapes of one response (our server emits both) must agree on every count; the
        two floats may differ by rounding only, as each is held within TOLERANCE of the counts.
        """
        mine, theirs = self._comparable(), other._comparable()
        for name, value in mine.items():
            if name == _BY_LENGTH and (value is None or theirs[name] is None):
                continue
            if isinstance(value, float) and isinstance(theirs[name], float):
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
            if name == _BY_LENGTH and (value is None or theirs[name] is None):
                continue
            if isinstance(value, float) and isinstance(theirs[name], float):
                same = math.isclose(value, theirs[name], rel_tol=0.0, abs_tol=2 * TOLERANCE)
            else:
                same = value == theirs[name]
            if not same:
                out.append(f"{name} ({value!r} vs {theirs[name]!r})")
        return out

    def _comparable(self) -> dict[str, Any]:
        """Every field but the engine; the by-draft-length rows only when both shapes carry them
        (vLLM's per-choice object has none)."""
        return {name: getattr(self, name) for name in type(self).model_fields if name != "engine"}


_BY_LENGTH = "acceptance_histogram_by_draft_length"


def _sparse(value: dict[int, int]) -> dict[int, int]:
    bad = [
        f"{j}: {n}" for j, n in value.items() if not (0 <= j <= MAX_COUNT and 0 <= n <= MAX_COUNT)
    ]
    if bad:
        raise ValueError(f"keys and counts must be integers in [0, 2**63 - 1], got {bad}")
    return {j: n for j, n in sorted(value.items()) if n}


# --- records.jsonl rows read back (``bench merge``) ----------------------------------------------

#: The largest time a records.jsonl row may hold, in seconds (a year): a time past it was not
#: measured by a run.
MAX_SECONDS = 365 * 86400.0


def from_json(raw: object) -> SpecDecodeAcceptanceRecord:
    """A record from its JSON form (a records.jsonl ``spec_decode_acceptance``), through the
    same validator every adapter's record passed (JSON object keys are strings: read as JSON so
    the histogram's keys are counts again, nothing else coerced). Raises ValueError."""
    if not isinstance(raw, dict):
        raise ValueError(f"expected an object, got {raw!r:.60}")
    try:
        return SpecDecodeAcceptanceRecord.model_validate_json(
            orjson.dumps(raw, option=orjson.OPT_NON_STR_KEYS)
        )
    except pydantic.ValidationError as exc:
        raise ValueError(
            "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'record'}: {e['msg']}"
                for e in exc.errors()
            )[:300]
        ) from None
    except TypeError as exc:  # orjson: a value JSON cannot hold
        raise ValueError(str(exc)) from None


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def _is_time(value: object, low: float = 0.0) -> TypeGuard[float]:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and low <= value <= MAX_SECONDS
    )


def _optional(test: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: value is None or test(value)


def _is_str(value: object) -> bool:
    return isinstance(value, str)


_COUNT = "an integer in [0, 2**63 - 1]"
_SECONDS = f"null or seconds in [0, {MAX_SECONDS:g}]"
#: Each checked field of a row: (its test, what it must be). ``start_s`` may be a little below
#: zero: a worker's first send can precede the shared origin by a clock tick.
_ROW_FIELDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "index": (_is_count, _COUNT),
    "category": (_is_str, "a string"),
    "warmup": (lambda v: isinstance(v, bool), "true or false"),
    "start_s": (lambda v: _is_time(v, -MAX_SECONDS), f"seconds within {MAX_SECONDS:g}"),
    "scheduled_s": (_optional(_is_time), _SECONDS),
    "ttft_s": (_optional(_is_time), _SECONDS),
    "latency_s": (_optional(_is_time), _SECONDS),
    "prompt_tokens": (_optional(_is_count), f"null or {_COUNT}"),
    "completion_tokens": (_optional(_is_count), f"null or {_COUNT}"),
    "status": (_optional(lambda v: _is_count(v) and v <= 999), "null or an HTTP status"),
    "error": (_optional(_is_str), "null or a string"),
    "unparsable_events": (_is_count, _COUNT),
    "anomalies": (lambda v: isinstance(v, list) and all(map(_is_str, v)), "a list of strings"),
    "raw": (lambda v: isinstance(v, list), "a list"),
    "spec_decode_status": (_is_str, "a string"),
    "spec_decode_adapter": (_optional(_is_str), "null or a string"),
    "spec_decode_message": (_optional(_is_str), "null or a string"),
}


def row_problems(row: object) -> list[tuple[str, str]]:
    """What is wrong with one records.jsonl row, as (field, what was expected and found):
    every field a figure reads, and the acceptance records through ``from_json``. A row that
    says it could not be written (``row_error``) needs only its index."""
    if not isinstance(row, dict):
        return [("", f"expected a JSON object, got {type(row).__name__}")]
    fields = ("index",) if "row_error" in row else tuple(_ROW_FIELDS)
    out = []
    for name in fields:
        test, what = _ROW_FIELDS[name]
        if name not in row:
            out.append((name, f"missing: expected {what}"))
        elif not test(row[name]):
            out.append((name, f"expected {what}, got {row[name]!r:.60}"))
    if "row_error" in row:
        return out
    out += _itl_problems(row.get("itl_runs_s"))
    out += _cached_problems(row)
    ttft, latency = row.get("ttft_s"), row.get("latency_s")
    if _is_time(ttft) and _is_time(latency) and ttft > latency:
        out.append(("ttft_s", f"expected at most latency_s ({latency!r}), got {ttft!r}"))
    out += _spec_problems(row.get("spec_decode_acceptance"), row.get("spec_decode_choices"))
    return out


def _cached_problems(row: dict[str, Any]) -> list[tuple[str, str]]:
    """``cached_tokens`` (rows written before it have none): null, or a count within the
    prompt."""
    value, prompt = row.get("cached_tokens"), row.get("prompt_tokens")
    if value is None:
        return []
    if not _is_count(value) or (_is_count(prompt) and value > prompt):
        return [("cached_tokens", f"expected null or a count at most prompt_tokens "
                                  f"({prompt!r}), got {value!r:.60}")]  # fmt: skip
    return []


def _itl_problems(runs: object) -> list[tuple[str, str]]:
    what = "a list of [gap seconds, tokens] pairs"
    if not isinstance(runs, list):
        return [("itl_runs_s", f"expected {what}, got {runs!r:.60}")]
    for i, run in enumerate(runs):
        if not (isinstance(run, list) and len(run) == 2 and _is_time(run[0]) and _is_count(run[1])):
            return [(f"itl_runs_s[{i}]", f"expected [gap seconds, tokens], got {run!r:.60}")]
    return []


def _spec_problems(spec: object, per_choice: object) -> list[tuple[str, str]]:
    out = []
    if spec is not None:
        try:
            from_json(spec)
        except ValueError as exc:
            out.append(("spec_decode_acceptance", f"not a valid acceptance record: {exc}"))
    if per_choice is None:
        return out
    if not isinstance(per_choice, dict):
        return [
            *out,
            ("spec_decode_choices", f"expected null or an object, got {per_choice!r:.60}"),
        ]
    for key, record in per_choice.items():
        where = f"spec_decode_choices[{key!r:.20}]"
        if not (isinstance(key, str) and key.isdecimal() and key.isascii()):
            out.append((where, "expected a choice index as the key"))
            continue
        try:
            from_json(record)
        except ValueError as exc:
            out.append((where, f"not a valid acceptance record: {exc}"))
    return out


#: The longest records.jsonl line a reader takes (merge, compare): a line is one request.
MAX_LINE_BYTES = 64 * 2**20


def parse_row(line: bytes | None) -> tuple[dict[str, Any] | None, list[tuple[str, str]]]:
    """One records.jsonl line as a validated row (``row_problems``, the acceptance record in its
    validated form, histogram keys as ints), or what is wrong with it. ``None``: a line longer
    than ``MAX_LINE_BYTES``, cut by the reader."""
    if line is None or len(line) > MAX_LINE_BYTES:
        return None, [("", f"longer than {MAX_LINE_BYTES} bytes")]
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return None, [("", f"not JSON ({exc})"[:200])]
    problems = row_problems(row)
    if problems:
        return None, problems
    if row.get("spec_decode_acceptance") is not None:
        row["spec_decode_acceptance"] = from_json(row["spec_decode_acceptance"]).model_dump()
    return row, []
