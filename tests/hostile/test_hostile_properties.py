"""Properties over arbitrary wire input: detection, the SSE parser, the client's per-chunk
accounting and the figures never raise, whatever a server sends."""

from __future__ import annotations

import copy
import importlib.util
import inspect
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speclens.bench.adapters import detect
from speclens.bench.client import (
    RequestRecord,
    RunResult,
    Tally,
    carriers,
    finish_record,
    token_bound,
)
from speclens.bench.sse import SSEParser
from speclens.runs.figures import summarize, weighted_distribution
from speclens.runs.report import record_row

pytestmark = pytest.mark.timeout(120)

BOUNDED = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

KEYS = st.sampled_from(
    [
        "choices", "usage", "completion_tokens", "prompt_tokens", "text", "delta", "content",
        "message", "finish_reason", "index", "error", "speculative_decoding_stats", "metrics",
        "num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens", "acceptance_histogram",
        "mean_acceptance_length", "draft_acceptance_rate", "num_spec_tokens", "meta_info",
    ]
) | st.text(max_size=8)  # fmt: skip
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=25,
)


def _payloads() -> Any:
    """tests/bench/payloads.py, the hand-written engine payloads (not on this directory's path)."""
    spec = importlib.util.spec_from_file_location(
        "payloads", Path(__file__).resolve().parents[1] / "bench" / "payloads.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


payloads = _payloads()
SHAPES = [
    fn()
    for name, fn in inspect.getmembers(payloads, inspect.isfunction)
    if not name.startswith("_")
    and fn.__module__ == payloads.__name__
    and not inspect.signature(fn).parameters
]


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += _paths(item, (*path, i))
    return out


@st.composite
def mutated_shapes(draw: st.DrawFn) -> list[Any]:
    """A real engine payload with up to three of its fields replaced by arbitrary JSON."""
    responses = copy.deepcopy(draw(st.sampled_from(SHAPES)))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(responses)))
        replacement = draw(JSON)
        if not path:
            responses = replacement
            continue
        target = responses
        try:
            for step in path[:-1]:
                target = target[step]
            target[path[-1]] = replacement
        except (KeyError, IndexError, TypeError):  # an earlier replacement moved it
            pass
    return responses if isinstance(responses, list) else [responses]


@BOUNDED
@given(st.lists(JSON, max_size=5) | mutated_shapes())
def test_detect_returns_a_status_and_never_raises(responses: list[Any]) -> None:
    for given_responses in (responses, carriers(responses)):
        detection = detect(given_responses)
        assert detection.status in {"ok", "absent", "malformed", "multiple_sequences", "conflict"}
        assert (detection.record is not None) == (detection.status == "ok")


def _events(parser: SSEParser, parts: list[bytes]) -> list[Any]:
    return [event for part in parts for event in parser.feed(part)]


SSE_BYTES = st.binary(max_size=300) | st.lists(
    st.sampled_from(
        [b"data: ", b"data:", b"x", b"\r", b"\n", b"\r\n", b":", b"event: e", b"id: 1", b"\xef",
         b"\xbb\xbf", b"\xe2\x82", b"\xac", b"\xff", b"retry: 5", b" ", b"\x00"]
    ),
    max_size=60,
).map(b"".join)  # fmt: skip


@BOUNDED
@given(SSE_BYTES, st.data())
def test_sse_parsing_never_raises_and_ignores_chunking(raw: bytes, data: st.DataObject) -> None:
    whole = _events(SSEParser(), [raw])
    cuts = sorted(data.draw(st.sets(st.integers(0, len(raw)), max_size=20)))
    parts = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    assert _events(SSEParser(), parts) == whole
    assert _events(SSEParser(), [bytes([b]) for b in raw]) == whole


def _chunk_like(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["json", "text", "done"]))
    if kind == "done":
        return "[DONE]"
    if kind == "text":
        return draw(st.text(max_size=20))
    return json.dumps(draw(JSON))


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[str], list[float], int | None]:
    """A real engine stream with fields replaced, with junk events inserted anywhere."""
    events = [json.dumps(chunk) for chunk in draw(st.just([]) | mutated_shapes())]
    for _ in range(draw(st.integers(0, 6))):
        events.insert(draw(st.integers(0, len(events))), _chunk_like(draw))
    gaps = draw(st.lists(st.floats(0, 10), min_size=len(events), max_size=len(events)))
    max_tokens = draw(st.none() | st.integers(1, 10**6))
    return events, [float(t) for t in np.cumsum(gaps)], max_tokens


def _check(record: RequestRecord) -> None:
    """Everything downstream of the client accepts the record."""
    for value in (record.prompt_tokens, record.completion_tokens):
        assert value is None or (isinstance(value, int) and 0 <= value <= 2**31)
    assert record.finish_reason is None or isinstance(record.finish_reason, str)
    summary = summarize(RunResult([record], 0.0, 1.0))
    orjson.dumps(summary, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    orjson.dumps(record_row(record), option=orjson.OPT_NON_STR_KEYS)


@BOUNDED
@given(streams(), st.booleans())
def test_record_building_never_raises(stream: Any, done: bool) -> None:
    events, times, max_tokens = stream
    record = RequestRecord(0, "x")
    tally = Tally(record, max_tokens)
    for data, now in zip(events, times, strict=True):
        tally.event(data, now)
    if done:
        record.end = (times[-1] if times else 0.0) + 1.0
    finish_record(record, tally)
    assert sum(n for _, n in record.itl_runs) <= token_bound(max_tokens)
    assert len(record.itl_runs) <= len(events)
    if record.success:
        assert tally.content_chunks > 0
    _check(record)


@BOUNDED
@given(
    st.one_of(JSON.map(json.dumps), mutated_shapes().map(lambda r: json.dumps(r[0] if r else r)))
)
def test_a_non_streamed_body_never_raises(body: str) -> None:
    record = RequestRecord(0, "x")
    tally = Tally(record, 16, stream=False)
    tally.body(body.encode(), 0.5)
    record.end = 1.0
    finish_record(record, tally)
    _check(record)


@BOUNDED
@given(st.lists(st.tuples(st.floats(0, 1e3), st.integers(0, 6)), max_size=12))
def test_weighted_percentiles_equal_numpys_on_the_expanded_data(runs: list[Any]) -> None:
    expanded = np.repeat([g for g, _ in runs], [c for _, c in runs])
    got = weighted_distribution(runs)
    if expanded.size == 0:
        assert got is None
        return
    assert got is not None
    for q in (50, 90, 99):
        assert math.isclose(got[f"p{q}"], float(np.percentile(expanded, q)), abs_tol=1e-9)
    assert math.isclose(got["mean"], float(expanded.mean()), rel_tol=1e-9, abs_tol=1e-9)
    assert (got["min"], got["max"], got["count"]) == (expanded.min(), expanded.max(), expanded.size)


def test_weighted_percentiles_of_a_billion_token_run_cost_nothing() -> None:
    got = weighted_distribution([(0.001, 10**9), (0.5, 1)])
    assert (
        got is not None and got["p99"] == 0.001 and got["max"] == 0.5 and got["count"] == 10**9 + 1
    )


def test_an_invalid_byte_at_the_end_of_a_read_keeps_its_event() -> None:
    """It used to wait for the rest of a "split character" that never came: the event was lost."""
    assert [e.data for e in SSEParser().feed(b"data: a\xff\n\n")] == ["a\ufffd"]
