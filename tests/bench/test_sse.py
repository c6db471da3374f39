"""The SSE parser: the WHATWG rules, and any split of the byte stream gives the same events."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from speclens.bench.sse import Event, SSEParser


def parse(*chunks: bytes) -> list[Event]:
    parser = SSEParser()
    return [e for c in chunks for e in parser.feed(c)]


def test_data_lines_join_and_blank_line_dispatches() -> None:
    events = parse(b"data: a\ndata: b\n\ndata: c\n\n")
    assert [e.data for e in events] == ["a\nb", "c"]


def test_line_endings_crlf_cr_lf_and_split_crlf() -> None:
    assert [e.data for e in parse(b"data: x\r\n\r\ndata: y\r\rdata: z\n\n")] == ["x", "y", "z"]
    # A CR at the end of one read and its LF at the start of the next are one line ending.
    assert [e.data for e in parse(b"data: x\r", b"\n\r", b"\n")] == ["x"]


def test_comments_fields_and_space_rules() -> None:
    events = parse(
        b": keep-alive\nevent: update\nid: 7\nretry: 1500\ndata:no-space\ndata:  two\n\n"
    )
    assert events == [Event("no-space\n two", "update", "7", 1500)]


def test_bom_and_no_dispatch_without_blank_line() -> None:
    parser = SSEParser()
    assert parser.feed("\ufeffdata: one\n".encode()) == []
    assert [e.data for e in parser.feed(b"\n")] == ["one"]


def test_multibyte_characters_split_across_reads() -> None:
    payload = "data: caf\u00e9 \u2603\n\n".encode()
    split = payload.index(b"\xc3") + 1
    assert [e.data for e in parse(payload[:split], payload[split:])] == ["caf\u00e9 \u2603"]


def test_empty_data_events_are_not_dispatched_without_data() -> None:
    assert parse(b"event: ping\n\n") == []


STREAM = (
    'data: {"a": 1}\r\n\r\n: comment\ndata: caf\u00e9\ndata: \u2603\n\nevent: x\rdata: [DONE]\r\r'
).encode()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_split_gives_the_same_events(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    chunks = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    assert parse(*chunks) == parse(STREAM)
    assert [e.data for e in parse(STREAM)] == ['{"a": 1}', "caf\u00e9\n\u2603", "[DONE]"]


def _parse_seconds(size: int, piece: int = 1024) -> float:
    """Seconds to parse one ``size``-byte data line sent in ``piece``-byte reads (best of 3)."""
    line = b"data: " + b"x" * (size - 8) + b"\n\n"
    pieces = [line[i : i + piece] for i in range(0, len(line), piece)]
    best = float("inf")
    for _ in range(3):
        parser = SSEParser()
        began = time.perf_counter()
        events = [e for p in pieces for e in parser.feed(p)]
        best = min(best, time.perf_counter() - began)
        assert len(events) == 1 and len(events[0].data) == size - 8
    return best


def test_a_long_line_in_small_reads_costs_linear_time() -> None:
    """Issue 19 item 12: the unfinished line was rescanned on every read (8 MiB in 1 KiB reads:
    33.6 s). Eight times the bytes must cost about eight times the time, not 64; the absolute
    bound is only a guard against a machine too slow to tell."""
    small, large = _parse_seconds(2**20), _parse_seconds(8 * 2**20)
    assert large < 5.0
    # quadratic took 33.6 s on 8 MiB; linear takes milliseconds, too few to hold a ratio to
    assert large < max(24 * small, 1.0), (small, large)
