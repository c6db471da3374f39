"""TensorRT-LLM's per-choice ``speculative_decoding`` object.

It carries ``acceptance_rate`` (accepted / drafted), ``total_accepted_draft_tokens``,
``total_draft_tokens``, ``num_spec_steps``, a dense ``acceptance_histogram`` and
``num_spec_tokens``; no mean AL (derived here from the histogram, i.e. 1 + accepted / steps) and no
per-step arrays. In a stream it rides the finishing chunk's choice. The shape is a proposal, so a
keyed histogram is read too and a missing ``acceptance_rate`` is computed rather than refused.

The object is per sequence (``tensorrt_llm/serve/postprocess_handlers.py`` builds it from each
choice's own output), so for n > 1 each choice gets its record, keyed by its index, and the
request's record is their sum. Every choice must carry one.

``avg_decoded_tokens_per_iter``, which every TensorRT-LLM choice carries, is the request's decoded
tokens per engine iteration (``tensorrt_llm/executor/result.py``): one number for all its
sequences, by TensorRT-LLM's own formula, with no counts. It is not AL and makes no record; when
it is all there is, detection says so.
"""

from __future__ import annotations

from typing import Any

import pydantic

from speclens.acceptance.histogram import AcceptanceHistogram
from speclens.bench.adapters._common import (
    BuiltinAdapter,
    Choices,
    Malformed,
    Responses,
    any_histogram,
    as_object,
    choice_value,
    choices,
    completion_tokens,
    count,
    last_carrier,
    last_choice_value,
    objects,
    optional_count,
    optional_number,
    required,
    summarize,
)
from speclens.runs.record import SpecDecodeAcceptanceRecord

FIELD = "speculative_decoding"
TOKENS_PER_ITER = "avg_decoded_tokens_per_iter"


def _per_choice(responses: Responses) -> dict[int, Any]:
    """The last non-null object of each choice index (a stream re-sends it cumulatively)."""
    indices = sorted({index for response in objects(responses) for index, _ in choices(response)})
    out: dict[int, Any] = {}
    for index in indices:
        found, value = last_carrier(responses, choice_value(FIELD, index))
        if found:
            out[index] = value
    return out


class TRTLLMSpecDecodeAdapter(BuiltinAdapter):
    """TensorRT-LLM's field name differs from vLLM's, so the two never claim the same payload."""

    name = "trtllm-per-choice"
    priority = 200
    choice_markers = frozenset({FIELD})
    engine = "trtllm"

    @classmethod
    def _present(cls, responses: Responses) -> bool:
        return last_choice_value(responses, FIELD)[0]

    @classmethod
    def _build(cls, responses: Responses) -> SpecDecodeAcceptanceRecord:
        spec = last_choice_value(responses, FIELD)[1]
        return cls._record(spec, f"choices[].{FIELD}", completion_tokens(responses))

    @classmethod
    def _build_choices(cls, responses: Responses) -> Choices:
        found = _per_choice(responses)
        indices = {index for response in objects(responses) for index, _ in choices(response)}
        missing = sorted(indices - set(found))
        if missing:
            raise Malformed(f"n > 1: choices {missing} carry no {FIELD} (others do)")
        # usage covers every choice, so no choice has a completion_tokens of its own
        return {
            i: cls._record(spec, f"choices[{i}].{FIELD}", None) for i, spec in sorted(found.items())
        }

    @classmethod
    def _record(cls, raw: object, where: str, tokens: int | None) -> SpecDecodeAcceptanceRecord:
        spec = as_object(raw, where)
        hist = any_histogram(
            required(spec, "acceptance_histogram", where), f"{where}.acceptance_histogram"
        )
        accepted = count(spec, "total_accepted_draft_tokens", where)
        drafted = count(spec, "total_draft_tokens", where)
        rate = optional_number(spec, "acceptance_rate", where)
        try:
            return cls._checked(spec, where, hist, accepted, drafted, rate, tokens)
        except pydantic.ValidationError as exc:
            raise Malformed(f"{where} is self-contradicting: {summarize(exc)}") from None

    @classmethod
    def _checked(
        cls,
        spec: dict[str, Any],
        where: str,
        hist: dict[int, int],
        accepted: int,
        drafted: int,
        rate: float | None,
        tokens: int | None,
    ) -> SpecDecodeAcceptanceRecord:
        return SpecDecodeAcceptanceRecord(
            engine=cls.engine,
            mean_acceptance_length=AcceptanceHistogram(hist).acceptance_length,
            draft_acceptance_rate=(accepted / drafted if drafted else 0.0)
            if rate is None
            else rate,
            acceptance_histogram=hist,
            num_accepted_draft_tokens=accepted,
            num_draft_tokens=drafted,
            num_spec_steps=count(spec, "num_spec_steps", where),
            num_spec_tokens=optional_count(spec, "num_spec_tokens", where),
            completion_tokens=tokens,
        )

    @classmethod
    def absent_note(cls, responses: Responses) -> str | None:
        found, value = last_choice_value(responses, TOKENS_PER_ITER)
        if not found:
            return None
        shown = value if isinstance(value, int | float) and not isinstance(value, bool) else "?"
        return (
            f"TensorRT-LLM's {TOKENS_PER_ITER} ({shown}) is its decoded tokens per iteration for "
            "the whole request, not AL, with no counts: no record"
        )
