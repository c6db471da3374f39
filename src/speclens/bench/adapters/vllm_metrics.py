"""vLLM's merged shape: response-root ``metrics.speculative_decoding`` with a dense histogram.

Enabled with ``--per-request-spec-decode-metrics {summary,detailed}``; present only for n == 1; in
a stream it rides the final usage chunk (our server puts it on the finishing chunk when the client
asked for no usage). The histogram is a list, index j = steps that accepted exactly j drafts, of
length K + 1, so K is read from its length when ``num_spec_tokens`` is absent. Field names follow
``speclens.server.protocol.root_metrics``; vLLM's ``num_drafts`` / ``num_accepted_tokens`` (its
Prometheus counter names) are read as aliases, and every spelling present must agree.

The optional ``acceptance_histogram_by_draft_length`` (variable-length drafting) maps each draft
length, a JSON string key, to a dense list like the histogram's; the record checks that its rows
add up to the histogram and that length x steps adds up to the drafted tokens.

``num_decode_steps`` is read when present (``speclens serve`` sends it) and never derived: vLLM
0.32 calls ``RequestSpecDecodeMetrics.observe`` (``vllm/v1/metrics/stats.py``) only for a step
that had scheduled drafts (``Scheduler.update_from_output`` in ``vllm/v1/core/sched/scheduler.py``
guards it with ``if scheduled_spec_token_ids``), so ``per_step_drafted`` never lists a step that
drafted nothing, and ``completion_tokens`` does not give the count exactly either (the last step
may be cut short; a preempted request's re-prefill emits a token).
"""

from __future__ import annotations

from typing import Any

from speclens.acceptance.histogram import AcceptanceHistogram
from speclens.bench.adapters._common import (
    BuiltinAdapter,
    Malformed,
    Responses,
    aliased_count,
    as_object,
    completion_tokens,
    count,
    count_list,
    dense_histogram,
    keyed_histogram,
    last_carrier,
    optional_count,
    optional_number,
    required,
)
from speclens.runs.record import SpecDecodeAcceptanceRecord

WHERE = "metrics.speculative_decoding"
BY_LENGTH = "acceptance_histogram_by_draft_length"
STEPS = ("num_spec_steps", "num_drafts")
ACCEPTED = ("num_accepted_draft_tokens", "num_accepted_tokens")


def _by_length(spec: dict[str, Any]) -> dict[int, dict[int, int]] | None:
    raw = spec.get(BY_LENGTH)
    if raw is None:
        return None
    where = f"{WHERE}.{BY_LENGTH}"
    rows = keyed_histogram({key: 0 for key in as_object(raw, where)}, where)  # keys checked
    by_key = dict(zip(rows, as_object(raw, where).values(), strict=True))
    return {d: dense_histogram(row, f"{where}[{d!r}]") for d, row in by_key.items()}


def _metrics(response: dict[str, Any]) -> Any:
    metrics = response.get("metrics")
    return metrics.get("speculative_decoding") if isinstance(metrics, dict) else None


def _last(responses: Responses) -> tuple[bool, Any]:
    return last_carrier(responses, _metrics)


class VLLMMetricsAdapter(BuiltinAdapter):
    """The primary shape, first in line: what the merged vLLM emits."""

    name = "vllm-root-metrics"
    priority = 100
    root_markers = frozenset({"metrics"})
    engine = "vllm"

    @classmethod
    def _present(cls, responses: Responses) -> bool:
        return _last(responses)[0]

    @classmethod
    def _build(cls, responses: Responses) -> SpecDecodeAcceptanceRecord:
        spec = as_object(_last(responses)[1], WHERE)
        dense = required(spec, "acceptance_histogram", WHERE)
        hist = dense_histogram(dense, f"{WHERE}.acceptance_histogram")
        k = optional_count(spec, "num_spec_tokens", WHERE)
        if k is None:
            k = len(hist) - 1
            if k < 1:
                raise Malformed(f"{WHERE}.acceptance_histogram has {len(hist)} entries: no K >= 1")
        elif len(hist) != k + 1:
            raise Malformed(
                f"{WHERE}.acceptance_histogram has {len(hist)} entries, not K + 1 = {k + 1}"
            )
        steps = aliased_count(spec, STEPS, WHERE)
        accepted = aliased_count(spec, ACCEPTED, WHERE)
        if steps is None or accepted is None:
            missing = STEPS if steps is None else ACCEPTED
            raise Malformed(f"{WHERE}: none of {', '.join(missing)} is present")
        drafted = count(spec, "num_draft_tokens", WHERE)
        mean = optional_number(spec, "mean_acceptance_length", WHERE)
        rate = optional_number(spec, "draft_acceptance_rate", WHERE)
        return SpecDecodeAcceptanceRecord(
            engine=cls.engine,
            mean_acceptance_length=(
                AcceptanceHistogram(hist).acceptance_length if mean is None else mean
            ),
            draft_acceptance_rate=(accepted / drafted if drafted else 0.0)
            if rate is None
            else rate,
            acceptance_histogram=hist,
            num_accepted_draft_tokens=accepted,
            num_draft_tokens=drafted,
            num_spec_steps=steps,
            num_spec_tokens=k,
            num_decode_steps=optional_count(spec, "num_decode_steps", WHERE),
            completion_tokens=completion_tokens(responses),
            per_step_accepted=count_list(spec, "per_step_accepted", WHERE),
            per_step_drafted=count_list(spec, "per_step_drafted", WHERE),
            acceptance_histogram_by_draft_length=_by_length(spec),
        )
