"""The client's one-pass scan (``Seen``) against the plain per-response definitions it replaced.

``Seen.add`` folds into one loop what used to be five walks over each response (the chunk
problem, whether it is a content chunk, its text, its finish reason, whether it can carry stats)
and finishing a record no longer walks the stream again. The reference functions below are those
definitions, kept verbatim; on payload-shaped and arbitrary JSON the scan must agree with them
everywhere.
"""

from __future__ import annotations

from typing import Any

import payloads
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from speclens.bench.client import Seen, carriers

_PLAIN_ROOT = frozenset(
    {"id", "object", "created", "model", "choices", "usage", "system_fingerprint"}
)
_PLAIN_CHOICE = frozenset({"index", "text", "delta", "logprobs", "finish_reason", "stop_reason"})


def _choices(chunk: dict[str, Any]) -> list[dict[str, Any]]:
    raw = chunk.get("choices")
    return [c for c in raw if isinstance(c, dict)] if isinstance(raw, list) else []


def ref_problem(chunk: object) -> str | None:
    if not isinstance(chunk, dict):
        return "not a JSON object"
    raw = chunk.get("choices")
    if raw is not None and not (isinstance(raw, list) and all(isinstance(c, dict) for c in raw)):
        return "choices is not a list of objects"
    return None


def ref_content(chunk: dict[str, Any]) -> bool:
    return any(
        isinstance(c.get("text"), str) or isinstance(c.get("delta"), dict)
        or isinstance(c.get("message"), dict)
        for c in _choices(chunk)
    )  # fmt: skip


def ref_text(chunk: dict[str, Any]) -> str:
    out = []
    for choice in _choices(chunk):
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if isinstance(text, str):
            out.append(text)
    return "".join(out)


def ref_finish(chunk: dict[str, Any]) -> object:
    for choice in _choices(chunk):
        if choice.get("finish_reason") is not None:
            return choice["finish_reason"]
    return None


def _usage(chunk: Any) -> dict[str, Any] | None:
    usage = chunk.get("usage") if isinstance(chunk, dict) else None
    return usage if isinstance(usage, dict) else None


def ref_carriers(responses: list[Any]) -> list[Any]:
    last_usage = max((i for i, r in enumerate(responses) if _usage(r)), default=-1)
    out = []
    for i, r in enumerate(responses):
        if not isinstance(r, dict):
            continue
        choices = r.get("choices")
        if (
            i == last_usage
            or not _PLAIN_ROOT.issuperset(r)
            or not isinstance(choices, list)
            or any(
                not isinstance(c, dict) or c.get("finish_reason") or not _PLAIN_CHOICE.issuperset(c)
                for c in choices
            )
        ):
            out.append(r)
    return out


SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(["", "a", "stop"]))
CHOICE = st.one_of(
    SCALAR,
    st.fixed_dictionaries(
        {},
        optional={
            "index": st.integers(0, 2), "text": SCALAR, "finish_reason": SCALAR,
            "delta": st.one_of(SCALAR, st.fixed_dictionaries({}, optional={"content": SCALAR})),
            "message": st.one_of(SCALAR, st.just({"content": "m"})), "extra": SCALAR,
        },
    ),
)  # fmt: skip
RESPONSE = st.one_of(
    SCALAR,
    st.fixed_dictionaries(
        {},
        optional={
            "id": st.just("x"), "choices": st.one_of(SCALAR, st.lists(CHOICE, max_size=3)),
            "usage": st.one_of(SCALAR, st.just({}), st.just({"completion_tokens": 2})),
            "unparsed": st.just("junk"), "metrics": st.just({}),
        },
    ),
)  # fmt: skip


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(RESPONSE, max_size=8))
@example([{"choices": [{"finish_reason": ""}, {"finish_reason": "stop"}]}])  # falsy reasons
@example([{"choices": [{"finish_reason": 0}]}, {"choices": [{"finish_reason": "length"}]}])
@example([{"choices": [1, {"text": "a"}]}, {"choices": "x"}, {"id": "x"}, 3])
@example([{"usage": {"completion_tokens": 2}}, {"usage": {}}, {"choices": [{"message": {}}]}])
@example(
    [
        {"choices": [{"delta": {"content": ""}, "text": "a"}]},
        {"choices": [{"delta": 1, "text": ""}]},
    ]
)
def test_one_pass_scan_equals_the_definitions(responses: list[Any]) -> None:
    seen = Seen()
    for r in responses:
        problem, content, text, usage = seen.add(r)
        assert problem == ref_problem(r)
        if isinstance(r, dict):
            assert content == ref_content(r)
            assert text == bool(ref_text(r))
            assert usage == _usage(r)
    assert [id(r) for r in seen.carriers()] == [id(r) for r in ref_carriers(responses)]
    assert seen.usage == next((u for r in reversed(responses) if (u := _usage(r))), None)
    finish = next((f for r in responses if isinstance(r, dict) and (f := ref_finish(r))), None)
    assert seen.finish_reason == finish


def test_the_payload_fixtures_agree_too() -> None:
    fixtures = [getattr(payloads, name) for name in dir(payloads) if not name.startswith("_")]
    calls = [
        f() for f in fixtures if callable(f) and getattr(f, "__module__", "") == payloads.__name__
    ]
    assert calls
    for responses in calls:
        assert [id(r) for r in carriers(responses)] == [id(r) for r in ref_carriers(responses)]
