"""SGLang's per-request spec-decode fields, wherever SGLang puts them: ``meta_info`` at the
response root (native ``/generate``), ``choices[].meta_info`` (OpenAI routes with
``return_meta_info``, non-streaming only) or ``sglext.spec_tokens_details`` (OpenAI routes with
``return_spec_tokens_details``, streaming too: a ``choices: []`` chunk after the finishing one).

SGLang sets them once the request finishes, and only when it ran verify steps
(python/sglang/srt/managers/tokenizer_manager.py, ``_calculate_spec_decoding_metrics``):
``spec_verify_ct``; ``spec_num_correct_drafts`` and ``spec_num_proposed_drafts`` (= verify steps
x (``speculative_num_draft_tokens`` - 1), tree nodes for a tree), aliased ``spec_accepted_drafts``
/ ``spec_proposed_drafts`` (older: ``spec_accept_token_num`` / ``spec_draft_token_num``,
``spec_num_accepted_tokens`` / ``spec_num_draft_tokens``); ``spec_correct_drafts_histogram``,
aliased ``spec_accept_histogram``, dense and as long as the largest accepted count seen + 1, so
its length says nothing about K; ``spec_accept_rate``; ``spec_accept_length``. Every spelling
present must agree. With no verify step SGLang sends none of them: such a request has no record
(``absent``), which is what SGLang said, not a malformed payload.

``spec_accept_length`` is completion_tokens / verify steps, a different formula from 1 +
accepted / steps (it counts the prefill token and capped tokens), so it is never copied: the
record's AL comes from the histogram, its rate from the counts. SGLang reports no fixed K, so
``num_spec_tokens`` stays None. ``completion_tokens`` is the usage's only (None on the native
route, which has none); the client's request record reads the native counts itself.
"""

from __future__ import annotations

from typing import Any

from speclens.acceptance.histogram import AcceptanceHistogram
from speclens.bench.adapters._common import (
    BuiltinAdapter,
    Malformed,
    MultipleSequences,
    Responses,
    aliased_count,
    any_histogram,
    as_object,
    choices,
    completion_tokens,
    count,
    last_carrier,
)
from speclens.runs.record import SpecDecodeAcceptanceRecord

WHERE = "meta_info"
DETAILS = "sglext.spec_tokens_details"
STEPS = "spec_verify_ct"
ACCEPTED = (
    "spec_accept_token_num",
    "spec_num_accepted_tokens",
    "spec_num_correct_drafts",
    "spec_accepted_drafts",
)
DRAFTED = (
    "spec_draft_token_num",
    "spec_num_draft_tokens",
    "spec_num_proposed_drafts",
    "spec_proposed_drafts",
)
HISTOGRAMS = ("spec_accept_histogram", "spec_correct_drafts_histogram")
#: Any of these marks a meta_info as carrying SGLang spec-decode stats (plain meta_info does not).
MARKERS = (STEPS, *ACCEPTED, *DRAFTED, *HISTOGRAMS, "spec_accept_length", "spec_accept_rate")


def _is_spec(meta: object) -> bool:
    return isinstance(meta, dict) and any(meta.get(key) is not None for key in MARKERS)


def _details(response: dict[str, Any]) -> object:
    """``sglext.spec_tokens_details``: an object, or a list of them when n > 1."""
    ext = response.get("sglext")
    return ext.get("spec_tokens_details") if isinstance(ext, dict) else None


def _meta(response: dict[str, Any]) -> Any:
    """The object's spec-carrying ``meta_info``: a choice's (the last such) over the root's."""
    for _, choice in reversed(list(choices(response))):
        if _is_spec(choice.get("meta_info")):
            return choice["meta_info"]
    meta = response.get("meta_info")
    return meta if _is_spec(meta) else None


def _spec_details(response: dict[str, Any]) -> Any:
    found = _details(response)
    return found if isinstance(found, list) or _is_spec(found) else None


def _last(responses: Responses) -> tuple[str | None, Any]:
    """Where the last spec-carrying object sits (``meta_info`` or ``sglext``) and the object.
    A stream re-sends meta_info cumulatively, so the last one is the whole request;
    ``meta_info`` (SGLang's own dict) wins over ``sglext``, a copy with defaults filled in."""
    found, meta = last_carrier(responses, _meta)
    if found:
        return WHERE, meta
    found, details = last_carrier(responses, _spec_details)
    if found:
        return DETAILS, details
    return None, None


def _histogram(meta: dict[str, Any], where: str) -> dict[int, int] | None:
    seen = {
        key: AcceptanceHistogram(any_histogram(meta[key], f"{where}.{key}")).counts
        for key in HISTOGRAMS
        if meta.get(key) is not None
    }
    values = list(seen.values())
    if any(v != values[0] for v in values[1:]):
        raise Malformed(f"{where}: {' and '.join(seen)} disagree")
    return values[0] if values else None


class SGLangSpecDecodeAdapter(BuiltinAdapter):
    """Last of the built-ins: ``meta_info`` is SGLang's alone, so order matters little here."""

    name = "sglang-meta-info"
    priority = 300
    root_markers = frozenset({"meta_info", "sglext"})
    choice_markers = frozenset({"meta_info"})
    engine = "sglang"

    @classmethod
    def _present(cls, responses: Responses) -> bool:
        return _last(responses)[0] is not None

    @classmethod
    def _build(cls, responses: Responses) -> SpecDecodeAcceptanceRecord:
        where, found = _last(responses)
        where = where or WHERE
        if isinstance(found, list):
            if len(found) != 1:
                raise MultipleSequences(f"{where} holds {len(found)} sequences (n > 1)")
            found = found[0]
        meta = as_object(found, where)
        steps = count(meta, STEPS, where)
        accepted = aliased_count(meta, ACCEPTED, where)
        drafted = aliased_count(meta, DRAFTED, where)
        hist = _histogram(meta, where)
        if steps == 0:
            # No verify step: nothing was drafted (sglext fills 0 and [] for what is missing).
            accepted = 0 if accepted is None else accepted
            drafted = 0 if drafted is None else drafted
            hist = {} if hist is None else hist
        if accepted is None or drafted is None:
            missing = ACCEPTED if accepted is None else DRAFTED
            raise Malformed(f"{where}: none of {', '.join(missing)} is present")
        if hist is None:
            raise Malformed(f"{where}: no {' or '.join(HISTOGRAMS)} for {steps} verify steps")
        return SpecDecodeAcceptanceRecord(
            engine=cls.engine,
            mean_acceptance_length=AcceptanceHistogram(hist).acceptance_length,
            draft_acceptance_rate=accepted / drafted if drafted else 0.0,
            acceptance_histogram=hist,
            num_accepted_draft_tokens=accepted,
            num_draft_tokens=drafted,
            num_spec_steps=steps,
            completion_tokens=completion_tokens(responses),
        )
