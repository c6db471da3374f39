"""``records.jsonl`` is followed while a run goes on: each line reaches the file whole."""

from __future__ import annotations

import io
from pathlib import Path

import orjson

from speclens.runs.report import RecordStream
from speclens.runs.request import RequestRecord


class ShortWrites(io.RawIOBase):
    """A file that takes at most ``limit`` bytes per ``write``, as a raw write may."""

    def __init__(self, inner: io.RawIOBase, limit: int) -> None:
        self.inner, self.limit, self.calls = inner, limit, 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.calls += 1
        return self.inner.write(bytes(data[: self.limit])) or 0

    def close(self) -> None:
        self.inner.close()
        super().close()


def test_a_line_longer_than_a_short_write_is_written_whole(tmp_path: Path) -> None:
    with RecordStream(tmp_path) as stream:
        short = ShortWrites(stream._fh, limit=1000)  # type: ignore[arg-type]
        stream._fh = short  # type: ignore[assignment]
        stream.write(RequestRecord(index=0, category="c" * 20_000, end=1.0))
        stream.write(RequestRecord(index=1, category="d", end=1.0))
        assert short.calls > 20
        assert stream.error is None and stream.count == 2
    lines = (tmp_path / "records.jsonl").read_bytes().splitlines()
    assert [orjson.loads(line)["index"] for line in lines] == [0, 1]
    assert orjson.loads(lines[0])["category"] == "c" * 20_000


def test_every_line_is_in_the_file_before_the_next_request_finishes(tmp_path: Path) -> None:
    """Unbuffered: what a follower reads between two writes is whole lines only."""
    path = tmp_path / "records.jsonl"
    with RecordStream(tmp_path) as stream:
        for index in range(3):
            stream.write(RequestRecord(index=index, category="x" * 100, end=1.0))
            data = path.read_bytes()
            assert data.endswith(b"\n") and data.count(b"\n") == index + 1
