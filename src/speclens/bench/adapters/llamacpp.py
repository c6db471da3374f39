"""llama.cpp's ``timings.draft_n`` and ``timings.draft_n_accepted``: counts only.

``llama-server`` (``tools/server/server-common.cpp``, ``server_slot_stats::to_json``) adds the two
counts to a response's ``timings`` object only when the request drafted something (draft_n > 0).
``timings`` sits at the root of ``/completion``, ``/v1/completions`` (streamed or not: its final
event is a whole ``text_completion`` object) and a non-streamed ``/v1/chat/completions``, and on
the last event of a chat stream (the usage chunk when ``include_usage`` is set)
(``tools/server/server-task.cpp``). With ``timings_per_token`` every event carries the running
totals, so the last one is the request's.

The server counts verify steps and accepted drafts per position but does not put them in a
response, so the record says counts only: steps, histogram and AL unknown, the draft acceptance
rate known. Nothing is estimated (no even spread of accepted drafts, no steps from
``predicted_n``); AL comes from the server's counters instead (``bench.server``).
"""

from __future__ import annotations

from typing import Any

from speclens.bench.adapters._common import (
    BuiltinAdapter,
    Responses,
    as_object,
    completion_tokens,
    count,
    last_carrier,
)
from speclens.runs.record import SpecDecodeAcceptanceRecord

WHERE = "timings"
KEYS = ("draft_n", "draft_n_accepted")


def _timings(response: dict[str, Any]) -> Any:
    timings = response.get(WHERE)
    if isinstance(timings, dict) and any(timings.get(key) is not None for key in KEYS):
        return timings
    return None


def _last(responses: Responses) -> tuple[bool, Any]:
    """The last ``timings`` with draft counts: with ``timings_per_token`` each event carries the
    running totals, so the last is the request's."""
    return last_carrier(responses, _timings)


class LlamaCppTimingsAdapter(BuiltinAdapter):
    """A root-level shape: for n > 1 llama.cpp's merged body keeps the first sequence's
    ``timings`` only, so acceptance is suppressed there."""

    name = "llamacpp-timings"
    priority = 400
    root_markers = frozenset({WHERE})
    engine = "llama.cpp"

    @classmethod
    def _present(cls, responses: Responses) -> bool:
        return _last(responses)[0]

    @classmethod
    def _build(cls, responses: Responses) -> SpecDecodeAcceptanceRecord:
        timings = as_object(_last(responses)[1], WHERE)
        accepted = count(timings, "draft_n_accepted", WHERE)
        drafted = count(timings, "draft_n", WHERE)
        return SpecDecodeAcceptanceRecord(
            engine=cls.engine,
            mean_acceptance_length=None,
            draft_acceptance_rate=accepted / drafted if drafted else 0.0,
            acceptance_histogram=None,
            num_accepted_draft_tokens=accepted,
            num_draft_tokens=drafted,
            num_spec_steps=None,
            completion_tokens=completion_tokens(responses),
        )
