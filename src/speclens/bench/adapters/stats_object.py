"""vLLM's per-choice ``speculative_decoding_stats`` object (``--per-request-spec-decode-stats``).

It maps to the record one-to-one: histogram keys are JSON strings and are int-cast; the mean AL
and draft acceptance rate are taken verbatim (the record checks them against the counts);
``num_spec_tokens`` is always present; ``detailed`` adds the per-step arrays. In a stream it rides
the finishing chunk's choice. Our own server emits this shape too (``protocol.choice_stats``),
with ``num_decode_steps`` added, which is read when present (vLLM sends none: None).
"""

from __future__ import annotations

from speclens.bench.adapters._common import (
    BuiltinAdapter,
    Responses,
    as_object,
    completion_tokens,
    count,
    count_list,
    keyed_histogram,
    last_choice_value,
    number,
    optional_count,
    required,
)
from speclens.runs.record import SpecDecodeAcceptanceRecord

FIELD = "speculative_decoding_stats"


class VLLMSpecDecodeAdapter(BuiltinAdapter):
    """The seed's shape, one iteration of vLLM's change; the merged vLLM emits the root shape
    (``VLLMMetricsAdapter``), which comes first. Our server sends both, and they must agree."""

    name = "vllm-per-choice-stats"
    priority = 110
    choice_markers = frozenset({FIELD})
    engine = "vllm"

    @classmethod
    def _present(cls, responses: Responses) -> bool:
        return last_choice_value(responses, FIELD)[0]

    @classmethod
    def _build(cls, responses: Responses) -> SpecDecodeAcceptanceRecord:
        where = f"choices[].{FIELD}"
        stats = as_object(last_choice_value(responses, FIELD)[1], where)
        return SpecDecodeAcceptanceRecord(
            engine=cls.engine,
            mean_acceptance_length=number(stats, "mean_acceptance_length", where),
            draft_acceptance_rate=number(stats, "draft_acceptance_rate", where),
            acceptance_histogram=keyed_histogram(
                required(stats, "acceptance_histogram", where), f"{where}.acceptance_histogram"
            ),
            num_accepted_draft_tokens=count(stats, "num_accepted_draft_tokens", where),
            num_draft_tokens=count(stats, "num_draft_tokens", where),
            num_spec_steps=count(stats, "num_spec_steps", where),
            num_spec_tokens=count(stats, "num_spec_tokens", where),
            num_decode_steps=optional_count(stats, "num_decode_steps", where),
            completion_tokens=completion_tokens(responses),
            per_step_accepted=count_list(stats, "per_step_accepted", where),
            per_step_drafted=count_list(stats, "per_step_drafted", where),
        )
