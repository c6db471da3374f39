"""TensorRT-LLM's proposed per-choice ``speculative_decoding`` object.

It carries ``acceptance_rate`` (accepted / drafted), ``total_accepted_draft_tokens``,
``total_draft_tokens``, ``num_spec_steps``, a dense ``acceptance_histogram`` and
``num_spec_tokens``; no mean AL (derived here from the histogram, i.e. 1 + accepted / steps) and no
per-step arrays. In a stream it rides the finishing chunk's choice. The shape is a proposal, so a
keyed histogram is read too and a missing ``acceptance_rate`` is computed rather than refused.
"""

from __future__ import annotations

from speclens.acceptance.histogram import AcceptanceHistogram
from speclens.bench.adapters._common import (
    BuiltinAdapter,
    Responses,
    any_histogram,
    as_object,
    completion_tokens,
    count,
    last_choice_value,
    optional_count,
    optional_number,
    required,
)
from speclens.bench.record import SpecDecodeAcceptanceRecord

FIELD = "speculative_decoding"


class TRTLLMSpecDecodeAdapter(BuiltinAdapter):
    """TensorRT-LLM's field name differs from vLLM's, so the two never claim the same payload."""

    name = "trtllm-per-choice"
    priority = 200
    engine = "trtllm"

    @classmethod
    def _present(cls, responses: Responses) -> bool:
        return last_choice_value(responses, FIELD)[0]

    @classmethod
    def _build(cls, responses: Responses) -> SpecDecodeAcceptanceRecord:
        where = f"choices[].{FIELD}"
        spec = as_object(last_choice_value(responses, FIELD)[1], where)
        hist = any_histogram(
            required(spec, "acceptance_histogram", where), f"{where}.acceptance_histogram"
        )
        accepted = count(spec, "total_accepted_draft_tokens", where)
        drafted = count(spec, "total_draft_tokens", where)
        rate = optional_number(spec, "acceptance_rate", where)
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
            completion_tokens=completion_tokens(responses),
        )
