"""SpecDecodeAcceptanceRecord: every invariant is enforced at construction."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from speclens.acceptance import AcceptanceHistogram
from speclens.runs.record import TOLERANCE, SpecDecodeAcceptanceRecord, from_json, row_problems

FAST = settings(max_examples=200, deadline=None)


def fields(**overrides: Any) -> dict[str, Any]:
    """K = 3, steps accepting [3, 1, 0, 2, 3] of 3 drafts each: AL 2.8, rate 0.6."""
    base: dict[str, Any] = {
        "engine": "vllm",
        "mean_acceptance_length": 2.8,
        "draft_acceptance_rate": 0.6,
        "acceptance_histogram": {0: 1, 1: 1, 2: 1, 3: 2},
        "num_accepted_draft_tokens": 9,
        "num_draft_tokens": 15,
        "num_spec_steps": 5,
        "num_spec_tokens": 3,
        "completion_tokens": 15,
        "per_step_accepted": [3, 1, 0, 2, 3],
        "per_step_drafted": [3, 3, 3, 3, 3],
    }
    base.update(overrides)
    return base


def make(**overrides: Any) -> SpecDecodeAcceptanceRecord:
    return SpecDecodeAcceptanceRecord(**fields(**overrides))


def refused(match: str, **overrides: Any) -> None:
    with pytest.raises(ValidationError, match=match):
        make(**overrides)


# --- valid records ------------------------------------------------------------------------------


def test_a_consistent_record() -> None:
    rec = make()
    assert rec.acceptance_histogram == {0: 1, 1: 1, 2: 1, 3: 2}
    assert rec.per_step_accepted == (3, 1, 0, 2, 3)
    assert rec.per_step_drafted == (3, 3, 3, 3, 3)
    assert isinstance(rec.histogram, AcceptanceHistogram)
    assert rec.histogram == AcceptanceHistogram({0: 1, 1: 1, 2: 1, 3: 2})
    assert rec.histogram.acceptance_length == pytest.approx(rec.mean_acceptance_length)


def test_optional_fields_default_to_none() -> None:
    rec = make(
        num_spec_tokens=None, completion_tokens=None, per_step_accepted=None, per_step_drafted=None
    )
    assert rec.num_spec_tokens is None
    assert rec.completion_tokens is None
    assert rec.per_step_accepted is None and rec.per_step_drafted is None


def test_decode_steps_give_draft_coverage() -> None:
    """5 verify steps among 8 decode steps (3 drafted nothing): coverage 5 / 8."""
    rec = make(num_decode_steps=8)
    assert rec.num_decode_steps == 8
    assert rec.draft_coverage == 5 / 8
    assert SpecDecodeAcceptanceRecord.model_validate_json(rec.model_dump_json()) == rec
    assert make().num_decode_steps is None and make().draft_coverage is None
    assert make(num_decode_steps=5).draft_coverage == 1.0
    no_steps = make(
        mean_acceptance_length=1.0, draft_acceptance_rate=0.0, acceptance_histogram={},
        num_accepted_draft_tokens=0, num_draft_tokens=0, num_spec_steps=0,
        per_step_accepted=[], per_step_drafted=[], num_decode_steps=0,
    )  # fmt: skip
    assert no_steps.draft_coverage is None


@pytest.mark.parametrize(
    ("value", "match"),
    [(4, "num_decode_steps 4 is below num_spec_steps 5"), (-1, "greater than or equal"),
     ("8", "valid integer"), (8.0, "valid integer"), (True, "valid integer")],
)  # fmt: skip
def test_bad_decode_steps_are_refused(value: object, match: str) -> None:
    refused(match, num_decode_steps=value)


def test_histogram_is_sparse_and_sorted() -> None:
    rec = make(acceptance_histogram={3: 2, 1: 1, 4: 0, 0: 1, 2: 1})
    assert list(rec.acceptance_histogram.items()) == [(0, 1), (1, 1), (2, 1), (3, 2)]
    assert make(acceptance_histogram={0: 1, 1: 1, 2: 1, 3: 2, 5: 0}) == make()


def test_histogram_property_is_a_copy() -> None:
    rec = make()
    rec.histogram.add(3)
    assert rec.histogram.num_steps == 5


def test_zero_step_record() -> None:
    rec = make(
        mean_acceptance_length=1.0,
        draft_acceptance_rate=0.0,
        acceptance_histogram={},
        num_accepted_draft_tokens=0,
        num_draft_tokens=0,
        num_spec_steps=0,
        per_step_accepted=[],
        per_step_drafted=[],
    )
    assert rec.histogram.num_steps == 0
    assert rec.acceptance_histogram == {}


def test_fully_rejected_record() -> None:
    rec = make(
        mean_acceptance_length=1.0,
        draft_acceptance_rate=0.0,
        acceptance_histogram={0: 5},
        num_accepted_draft_tokens=0,
        per_step_accepted=[0] * 5,
    )
    assert rec.acceptance_histogram == {0: 5}


def test_record_is_frozen() -> None:
    rec = make()
    with pytest.raises(ValidationError):
        rec.num_spec_steps = 6  # type: ignore[misc]


def test_json_round_trip() -> None:
    rec = make()
    assert SpecDecodeAcceptanceRecord.model_validate_json(rec.model_dump_json()) == rec


def test_tolerance_boundaries() -> None:
    make(mean_acceptance_length=2.8 + TOLERANCE / 2, draft_acceptance_rate=0.6 - TOLERANCE / 2)
    refused("mean_acceptance_length", mean_acceptance_length=2.8 + 3 * TOLERANCE)
    refused("draft_acceptance_rate", draft_acceptance_rate=0.6 - 3 * TOLERANCE)


def test_mean_within_tolerance_must_still_lie_in_range() -> None:
    at_top = {
        "acceptance_histogram": {3: 5},
        "num_accepted_draft_tokens": 15,
        "draft_acceptance_rate": 1.0,
        "per_step_accepted": [3] * 5,
    }
    make(mean_acceptance_length=4.0, **at_top)
    refused(r"outside \[1, 4\]", mean_acceptance_length=4.0 + TOLERANCE / 2, **at_top)
    at_bottom = {
        "acceptance_histogram": {0: 5},
        "num_accepted_draft_tokens": 0,
        "draft_acceptance_rate": 0.0,
        "per_step_accepted": [0] * 5,
    }
    refused(r"outside \[1, ", mean_acceptance_length=1.0 - TOLERANCE / 2, **at_bottom)


# --- every invariant, violated ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("match", "overrides"),
    [
        ("sums to 6 steps, not 5", {"acceptance_histogram": {0: 2, 1: 1, 2: 1, 3: 2}}),
        (
            "sums to 5 steps, not 6",
            {"num_spec_steps": 6, "per_step_accepted": None, "per_step_drafted": None},
        ),
        ("counts 9 accepted drafts, not 8", {"num_accepted_draft_tokens": 8}),
        ("exceed", {"num_draft_tokens": 8, "per_step_drafted": None, "per_step_accepted": None}),
        ("greater than or equal to 0", {"num_spec_steps": -1}),
        ("greater than or equal to 0", {"num_draft_tokens": -3}),
        ("greater than or equal to 0", {"num_accepted_draft_tokens": -9}),
        ("greater than or equal to 0", {"completion_tokens": -1}),
        ("integers in", {"acceptance_histogram": {-1: 1, 0: 0, 1: 1, 2: 1, 3: 2}}),
        ("integers in", {"acceptance_histogram": {0: -1, 1: 1, 2: 1, 3: 2}}),
        ("given together", {"per_step_drafted": None}),
        ("given together", {"per_step_accepted": None}),
        ("not num_spec_steps 5", {"per_step_accepted": [3, 1, 0, 2, 3, 0]}),
        ("not num_spec_steps 5", {"per_step_drafted": [3, 3, 3, 3]}),
        ("per_step_accepted sums to 10", {"per_step_accepted": [3, 1, 1, 2, 3]}),
        ("per_step_drafted sums to 14", {"per_step_drafted": [3, 3, 3, 3, 2]}),
        ("exceeds drafted at step 4", {"per_step_drafted": [3, 3, 4, 3, 2]}),
        ("not the count of per_step_accepted", {"per_step_accepted": [2, 2, 0, 2, 3]}),
        ("per-step counts", {"per_step_accepted": [3, 1, -1, 3, 3]}),
        ("count at 3 > K = 2", {"num_spec_tokens": 2}),
        ("greater than or equal to 1", {"num_spec_tokens": 0}),
        ("mean_acceptance_length 2.7", {"mean_acceptance_length": 2.7}),
        ("mean_acceptance_length", {"mean_acceptance_length": 3.0}),
        ("draft_acceptance_rate 0.5", {"draft_acceptance_rate": 0.5}),
        ("finite", {"mean_acceptance_length": math.nan}),
        ("finite", {"mean_acceptance_length": math.inf}),
        ("finite", {"draft_acceptance_rate": math.nan}),
        ("at least 1 character", {"engine": ""}),
        ("Extra inputs", {"extra_field": 1}),
    ],
)
def test_invariant_violations_are_refused(match: str, overrides: dict[str, Any]) -> None:
    refused(match, **overrides)


def test_zero_steps_needs_mean_one_and_zero_drafted_needs_rate_zero() -> None:
    zero = {
        "acceptance_histogram": {},
        "num_accepted_draft_tokens": 0,
        "num_draft_tokens": 0,
        "num_spec_steps": 0,
        "per_step_accepted": None,
        "per_step_drafted": None,
    }
    make(mean_acceptance_length=1.0, draft_acceptance_rate=0.0, **zero)
    refused("mean_acceptance_length", mean_acceptance_length=2.0, draft_acceptance_rate=0.0, **zero)
    refused("draft_acceptance_rate", mean_acceptance_length=1.0, draft_acceptance_rate=1.0, **zero)


@pytest.mark.parametrize(
    "overrides",
    [
        {"num_spec_steps": "5"},
        {"num_spec_steps": 5.0},
        {"num_spec_steps": True},
        {"completion_tokens": "15"},
        {"num_spec_tokens": 3.0},
        {"acceptance_histogram": {"0": 1, "1": 1, "2": 1, "3": 2}},
        {"acceptance_histogram": {0: 1.0, 1: 1, 2: 1, 3: 2}},
        {"acceptance_histogram": [1, 1, 1, 2]},
        {"per_step_accepted": ["3", 1, 0, 2, 3]},
        {"per_step_drafted": [3.0, 3, 3, 3, 3]},
        {"per_step_drafted": "33333"},
        {"mean_acceptance_length": "2.8"},
        {"engine": None},
        {"num_spec_steps": 2**63},
    ],
)
def test_wrong_types_are_refused_not_coerced(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        make(**overrides)


def test_an_integer_mean_is_a_number() -> None:
    rec = make(
        mean_acceptance_length=1,
        draft_acceptance_rate=0,
        acceptance_histogram={0: 5},
        num_accepted_draft_tokens=0,
        per_step_accepted=[0] * 5,
    )
    assert rec.mean_acceptance_length == 1.0


def test_validation_errors_are_value_errors() -> None:
    with pytest.raises(ValueError):
        make(num_accepted_draft_tokens=8)


# --- comparing records --------------------------------------------------------------------------


def test_same_measurement_ignores_the_engine_and_float_rounding() -> None:
    a = make()
    assert a.same_measurement(make(engine="sglang"))
    assert a.same_measurement(make(mean_acceptance_length=2.8 + TOLERANCE / 2))
    b = make(completion_tokens=16)
    assert not a.same_measurement(b)
    assert a.differences(b) == ["completion_tokens (15 vs 16)"]
    c = make(per_step_accepted=None, per_step_drafted=None)
    assert not a.same_measurement(c)
    assert a.differences(make(engine="x")) == []


# --- any consistent per-step data makes a valid record ------------------------------------------


@FAST
@given(
    k=st.integers(min_value=1, max_value=8),
    steps=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8)), max_size=40),
    completion=st.none() | st.integers(min_value=0, max_value=10_000),
)
def test_records_from_any_per_step_data(
    k: int, steps: list[tuple[int, int]], completion: int | None
) -> None:
    drafted = [min(d, k) for _, d in steps]
    accepted = [min(a, d) for (a, _), d in zip(steps, drafted, strict=True)]
    hist = AcceptanceHistogram.from_accepted(accepted)
    total_a, total_d = sum(accepted), sum(drafted)
    rec = SpecDecodeAcceptanceRecord(
        engine="test",
        mean_acceptance_length=hist.acceptance_length,
        draft_acceptance_rate=total_a / total_d if total_d else 0.0,
        acceptance_histogram=dict(Counter(accepted)),
        num_accepted_draft_tokens=total_a,
        num_draft_tokens=total_d,
        num_spec_steps=len(steps),
        num_spec_tokens=k,
        completion_tokens=completion,
        per_step_accepted=accepted,
        per_step_drafted=drafted,
    )
    assert 1.0 <= rec.mean_acceptance_length <= k + 1
    assert 0.0 <= rec.draft_acceptance_rate <= 1.0
    assert rec.histogram == hist
    assert SpecDecodeAcceptanceRecord.model_validate_json(rec.model_dump_json()) == rec


def test_a_record_read_back_from_json_passes_the_same_validator() -> None:
    """``bench merge`` reads records.jsonl through ``from_json``: a record bench wrote comes back
    equal (histogram keys were JSON strings), and a contradicting one is refused."""
    record = SpecDecodeAcceptanceRecord(**fields())
    raw = orjson.loads(orjson.dumps(record.model_dump(), option=orjson.OPT_NON_STR_KEYS))
    assert from_json(raw) == record
    raw["acceptance_histogram"] = {"4": 5}
    with pytest.raises(ValueError, match="acceptance_histogram"):
        from_json(raw)
    raw["acceptance_histogram"], raw["num_draft_tokens"] = record.acceptance_histogram, "15"
    with pytest.raises(ValueError, match="num_draft_tokens"):
        from_json(raw)


def test_every_row_bench_writes_passes_row_problems() -> None:
    from speclens.bench.client import RequestRecord
    from speclens.runs.report import record_row

    spec = SpecDecodeAcceptanceRecord(**fields()).model_dump()
    request = RequestRecord(index=3, category="c", start=0.5, end=1.5, ttft=0.1,
                            itl_runs=[(0.01, 4)], completion_tokens=9, status=200, spec=spec)  # fmt: skip
    row = orjson.loads(orjson.dumps(record_row(request), option=orjson.OPT_NON_STR_KEYS))
    assert row_problems(row) == []
    assert row_problems({**row, "ttft_s": 2.0}) == [
        ("ttft_s", "expected at most latency_s (1.0), got 2.0")
    ]
    assert row_problems({"index": 3, "row_error": "x"}) == []
    assert row_problems([]) == [("", "expected a JSON object, got list")]
