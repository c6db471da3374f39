"""The client's per-token path (issue 43): raw payloads kept as the bytes they came as, the SSE
parser's bytes path, and the same records as before whatever form a payload came in."""

from __future__ import annotations

import asyncio
import gc

import orjson
import pytest

from speclens.bench.datasets import random_prompts
from speclens.bench.finish import Tally, finish_record, payloads
from speclens.bench.load import GC_YOUNG_THRESHOLD, LoadConfig, LoadGenerator, _fewer_collections
from speclens.bench.sse import SSEParser
from speclens.bench.wire import Seen
from speclens.bench.workers import WorkerPool
from speclens.runs.report import record_row
from speclens.runs.request import RequestRecord

CHUNK = (
    b'{"id": "c", "choices": [{"index": 0, "text": "hi", "finish_reason": null}], '
    b'"usage": {"completion_tokens": 1}}'
)


def _tally(*events: bytes | str) -> tuple[RequestRecord, Tally]:
    record = RequestRecord(0, "x")
    tally = Tally(record, 16)
    for i, data in enumerate(events):
        tally.event(data, 0.1 * (i + 1))
    record.end = 1.0
    finish_record(record, tally)
    return record, tally


def _raw_line(record: RequestRecord) -> bytes:
    return orjson.dumps(record_row(record)).split(b',"raw":', 1)[1]


def test_plain_json_bytes_are_written_as_they_came() -> None:
    record, _ = _tally(CHUNK, b"[DONE]")
    assert record.success and record.completion_tokens == 1
    assert _raw_line(record) == b"[" + CHUNK + b"]}"  # the server's spacing kept
    assert payloads(record) == [orjson.loads(CHUNK)]


@pytest.mark.parametrize(
    "data",
    [
        CHUNK.replace(b'"hi"', b'"h\\u0069"'),  # an escape could hide a credential from redaction
        CHUNK.replace(b", ", b",\n "),  # a line break would split records.jsonl's line
        CHUNK.replace(b", ", b",\r "),
    ],
)
def test_escapes_and_line_breaks_are_written_as_orjson_writes_them(data: bytes) -> None:
    record, _ = _tally(data, b"[DONE]")
    value = orjson.loads(data)
    assert _raw_line(record) == b"[" + orjson.dumps(value) + b"]}"
    assert payloads(record) == [value] and record.completion_tokens == 1


def test_bytes_and_text_give_the_same_record() -> None:
    events = [CHUNK, b"not json", b'"\xff"', CHUNK.replace(b"1}", b"2}"), b"[DONE]"]
    as_bytes, tally_b = _tally(*events)
    as_text, tally_t = _tally(*(e.decode("utf-8", "replace") for e in events))
    assert payloads(as_bytes) == payloads(as_text)
    assert payloads(as_bytes)[1:3] == [{"unparsed": "not json"}, "\ufffd"]
    assert record_row(as_bytes) | {"raw": None} == record_row(as_text) | {"raw": None}
    assert tally_b.done and tally_t.done and as_bytes.unparsable_events == 2


def test_text_with_a_lone_surrogate_is_kept_writable() -> None:
    record, _ = _tally("\ud800 not json", "[DONE]")
    assert payloads(record) == [{"unparsed": "? not json"}]


def test_feed_data_is_feeds_data_undecoded() -> None:
    stream = b'\xef\xbb\xbfdata: {"a": 1}\n\nid: 7\ndata: x\xff\ndata: y\n\nevent: e\ndata: z\n\n'
    for size in (1, 2, 5, len(stream)):
        parts = [stream[i : i + size] for i in range(0, len(stream), size)]
        raw, full = SSEParser(), SSEParser()
        data = [d for p in parts for d in raw.feed_data(p)]
        events = [e for p in parts for e in full.feed(p)]
        assert data == [b'{"a": 1}', b"x\xff\ny", b"z"]
        assert [d.decode("utf-8", "replace") for d in data] == [e.data for e in events]
        assert [(e.event, e.id) for e in events] == [
            ("message", None),
            ("message", "7"),
            ("e", "7"),
        ]


def test_a_bom_split_across_reads_is_skipped_and_a_near_bom_kept() -> None:
    parser = SSEParser()
    assert parser.feed_data(b"\xef") == [] and parser.feed_data(b"\xbb") == []
    assert parser.feed_data(b"\xbfdata: a\n\n") == [b"a"]
    assert [e.data for e in SSEParser().feed(b"\xef\xbbdata: a\n\n")] == []  # "\ufffddata"
    assert SSEParser().feed_data(b"\xefdata: b\n\ndata: c\n\n") == [b"c"]


def test_worker_records_come_back_writable() -> None:
    """A worker keeps payloads as bytes (a Fragment does not pickle); the parent wraps them."""
    record = RequestRecord(3, "x", responses=[CHUNK, b'{"a":1}'])
    pool = WorkerPool.__new__(WorkerPool)
    pool.on_done = None
    records: list[RequestRecord] = []
    pool._take(("records", 1, [record]), records, [])
    assert records == [record]
    assert _raw_line(record).startswith(b"[" + CHUNK + b',{"a":1}]')


@pytest.mark.parametrize(
    ("choice", "content", "text"),
    [
        ({"index": 0, "text": "", "finish_reason": None}, True, False),
        ({"index": 0, "text": "a", "logprobs": None}, True, True),
        ({"delta": {"content": ""}}, True, False),
        ({"delta": {"role": "assistant"}}, True, False),
        ({"delta": {"content": "x"}, "text": 5}, True, True),
        ({"text": 5}, False, False),
        ({"delta": 1, "text": "a"}, True, True),
    ],
)
def test_the_commonest_chunk_reads_as_the_full_walk_does(
    choice: dict[str, object], content: bool, text: bool
) -> None:
    usage = {"completion_tokens": 1}
    seen = Seen()
    assert seen.add({"id": "c", "choices": [choice], "usage": usage}) == (
        None, content, text, usage
    )  # fmt: skip
    assert seen.carriers() == [{"id": "c", "choices": [choice], "usage": usage}]
    record, tally = _tally(orjson.dumps({"choices": [choice]}), b"[DONE]")
    assert tally.tokens == int(content and text) and record.success is content


def test_runs_raise_the_collectors_threshold_and_the_last_restores_it() -> None:
    before = gc.get_threshold()
    with _fewer_collections():
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *before[1:])
        with _fewer_collections():  # a second run in the same process
            pass
        assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD  # the first is still running
    assert gc.get_threshold() == before


def test_a_run_restores_the_threshold_when_it_fails() -> None:
    before = gc.get_threshold()
    seen: list[int] = []
    generator = LoadGenerator(LoadConfig(url="http://127.0.0.1:9", model="m", num_requests=1),
                              random_prompts(1, 4, 4, seed=0))  # fmt: skip

    def scrape() -> None:
        seen.append(gc.get_threshold()[0])
        raise RuntimeError("scrape failed")

    with pytest.raises(RuntimeError):
        asyncio.run(generator.run(before_measure=scrape))
    assert seen == [GC_YOUNG_THRESHOLD] and gc.get_threshold() == before
