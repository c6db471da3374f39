"""SGLang's ``meta_info`` spec-decode fields, at the choice level (OpenAI routes) or the response
level (native ``/generate``).

``spec_verify_ct`` is the verify steps; the accepted and proposed draft counts have had several
spellings across releases (``spec_accept_token_num`` / ``spec_draft_token_num``,
``spec_num_accepted_tokens`` / ``spec_num_draft_tokens``, and since v0.5.15
``spec_num_correct_drafts`` / ``spec_num_proposed_drafts`` with the aliases
``spec_accepted_drafts`` / ``spec_proposed_drafts``); every spelling present must agree. The
histogram (``spec_accept_histogram``, later ``spec_correct_drafts_histogram``) is indexed by
accepted drafts, dense list or map.

SGLang's ``spec_accept_length`` is completion_tokens / verify steps, a different formula from
1 + accepted / steps (it counts prefill and capped tokens), so it is never copied: the record's
mean AL comes from the histogram, and its rate from the counts. SGLang reports no fixed K, so ``num_spec_tokens``
stays None. Without a histogram there is no record, unless no step ran (then it is empty).
"""

from __future__ import annotations

from typing import Any

from speclens.acceptance.histogram import AcceptanceHistogram
from speclens.bench.adapters._common import (
    BuiltinAdapter,
    Malformed,
    Responses,
    aliased_count,
    any_histogram,
    as_object,
    choices,
    completion_tokens,
    count,
    objects,
)
from speclens.bench.record import SpecDecodeAcceptanceRecord

WHERE = "meta_info"
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


def _last(responses: Responses) -> tuple[bool, Any]:
    """The last spec-carrying meta_info, choice or response level (a stream re-sends it
    cumulatively, so the last one is the whole request)."""
    found, value = False, None
    for response in objects(responses):
        if _is_spec(response.get("meta_info")):
            found, value = True, response["meta_info"]
        for _, choice in choices(response):
            if _is_spec(choice.get("meta_info")):
                found, value = True, choice["meta_info"]
    return found, value


def _histogram(meta: dict[str, Any]) -> dict[int, int] | None:
    seen = {
        key: AcceptanceHistogram(any_histogram(meta[key], f"{WHERE}.{key}")).counts
        for key in HISTOGRAMS
        if meta.get(key) is not None
    }
    values = list(seen.values())
    if any(v != values[0] for v in values[1:]):
        raise Malformed(f"{WHERE}: {' and '.join(seen)} disagree")
    return values[0] if values else None


class SGLangSpecDecodeAdapter(BuiltinAdapter):
    """Last of the built-ins: ``meta_info`` is SGLang's alone, so order matters little here."""

    name = "sglang-meta-info"
    priority = 300
    engine = "sglang"

    @classmethod
    def _present(cls, responses: Responses) -> bool:
        return _last(responses)[0]

    @classmethod
    def _build(cls, responses: Responses) -> SpecDecodeAcceptanceRecord:
        meta = as_object(_last(responses)[1], WHERE)
        steps = count(meta, STEPS, WHERE)
        accepted = aliased_count(meta, ACCEPTED, WHERE)
        drafted = aliased_count(meta, DRAFTED, WHERE)
        hist = _histogram(meta)
        if steps == 0:
            # Current releases omit the counts and send [] when no step ran.
            accepted = 0 if accepted is None else accepted
            drafted = 0 if drafted is None else drafted
            hist = {} if hist is None else hist
        if accepted is None or drafted is None:
            missing = ACCEPTED if accepted is None else DRAFTED
            raise Malformed(f"{WHERE}: none of {', '.join(missing)} is present")
        if hist is None:
            raise Malformed(f"{WHERE}: no {' or '.join(HISTOGRAMS)} for {steps} verify steps")
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
