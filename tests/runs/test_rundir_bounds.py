"""The run reader's bounds (``runs.rundir``) hold for every run it reads, aggregate-only ones
(published figures, a summary alone) included: the file size, what is kept of all inputs together,
the rows a records.jsonl may hold, the problems it reports; and what marks a run aggregate-only."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from aggregatekit import summary, write_point
from comparekit import row, write_run
from speclens.runs import rundir
from speclens.runs.compare_inputs import read_run

KEEP_NOTHING = rundir.fields(())


def _kept(path: Path) -> int:
    """The bytes the reader keeps of one aggregate-only run (its summary, as compare keeps it)."""
    return len(orjson.dumps(read_run(path).summary, option=orjson.OPT_NON_STR_KEYS))


def test_aggregate_only_runs_count_against_what_is_kept_in_all(tmp_path: Path) -> None:
    a = write_point(tmp_path / "a", summary(concurrency=4))
    b = write_point(tmp_path / "b", summary(concurrency=8))
    limit = int(_kept(a) * 1.5)
    budget = rundir.Budget(limit)
    read_run(a, budget)  # one fits
    with pytest.raises(rundir.InputError) as caught:
        read_run(b, budget)
    assert caught.value.code == 1
    assert caught.value.lines == [
        f"{b / 'summary.json'}: the fields kept of its inputs pass {limit:,} bytes in all: "
        "expected fewer or smaller runs"
    ]


def test_compare_of_published_points_past_the_bound_is_one_line(
    run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = write_point(tmp_path / "a", summary(concurrency=4))
    b = write_point(tmp_path / "b", summary(concurrency=8))
    limit = int(_kept(a) * 1.5)
    monkeypatch.setattr(rundir, "MAX_KEPT_BYTES", limit)
    code, out, err = run_cli("compare", a, b)
    assert code == 1 and "Traceback" not in out + err, (code, out, err)
    assert err.strip().splitlines() == [
        f"{b / 'summary.json'}: the fields kept of its inputs pass {limit:,} bytes in all: "
        "expected fewer or smaller runs"
    ]


@pytest.mark.parametrize("aggregate", [True, False])
def test_a_summary_past_the_file_bound_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, aggregate: bool
) -> None:
    path = (write_point(tmp_path / "a", summary()) if aggregate
            else write_run(tmp_path / "a", requests=4))  # fmt: skip
    size = (path / "summary.json").stat().st_size
    monkeypatch.setattr(rundir, "MAX_FILE_BYTES", size - 1)
    with pytest.raises(rundir.InputError) as caught:
        read_run(path)
    assert caught.value.code == 1
    assert caught.value.lines == [f"{path / 'summary.json'}: larger than {size - 1} bytes"]
    monkeypatch.setattr(rundir, "MAX_FILE_BYTES", size)
    assert read_run(path).aggregate_only is aggregate  # at the bound: read


def test_the_budget_is_its_limit_exactly() -> None:
    item = {"k": "x" * 10}
    size = len(orjson.dumps(item))
    budget = rundir.Budget(2 * size)
    budget.take(item, "a")
    budget.take(item, "b")  # exactly at the limit
    with pytest.raises(rundir.InputError, match=r"^c: the fields kept of its inputs pass "):
        budget.take({}, "c")
    assert rundir.Budget().limit == rundir.MAX_KEPT_BYTES


def test_the_aggregate_marker_travels_with_what_is_kept(tmp_path: Path) -> None:
    path = write_point(tmp_path / "a", summary())
    run = rundir.read_run(path, KEEP_NOTHING, rundir.fields(("settings",)))
    assert run.aggregate_only and run.summary["aggregate_only"] is True and run.rows == []


@pytest.mark.parametrize("marker", [1, "true", "yes", [True]])
def test_only_true_marks_a_run_aggregate_only(tmp_path: Path, marker: object) -> None:
    data = summary()
    data["aggregate_only"] = marker
    assert not rundir.is_aggregate_only(data)
    path = write_point(tmp_path / "a", data)
    with pytest.raises(rundir.InputError):  # read as a measured run: no records.jsonl
        rundir.read_run(path, KEEP_NOTHING, rundir.fields(("settings",)))


def _records(path: Path, rows: list[bytes]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "records.jsonl").write_bytes(b"\n".join(rows) + b"\n")
    return path / "records.jsonl"


def _row(index: int, **changes: object) -> bytes:
    data = row(index, prompt_tokens=8, completion_tokens=4, tpot_s=0.01, histogram=None, k=3)
    return orjson.dumps({**data, **changes})


def test_rows_are_counted_and_warm_up_rows_not_kept(tmp_path: Path) -> None:
    records = _records(tmp_path, [_row(0, warmup=True), _row(1), b"", _row(2)])
    rows = rundir.read_rows(records, rundir.Budget(), rundir.fields(("index",)))
    assert rows == [{"index": 1}, {"index": 2}]
    one = len(orjson.dumps({"index": 1}))
    with pytest.raises(rundir.InputError) as caught:
        rundir.read_rows(records, rundir.Budget(one), rundir.fields(("index",)))
    assert caught.value.lines[0].startswith(f"{records}: line 4: the fields kept of its inputs")


def test_a_records_file_past_its_row_bound_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rundir, "MAX_ROWS", 3)
    records = _records(tmp_path, [_row(i) for i in range(3)])
    assert len(rundir.read_rows(records, rundir.Budget(), KEEP_NOTHING)) == 3
    records = _records(tmp_path, [_row(i) for i in range(4)])
    with pytest.raises(rundir.InputError) as caught:
        rundir.read_rows(records, rundir.Budget(), KEEP_NOTHING)
    assert caught.value.lines == [f"{records}: holds more than 3 rows"]


def test_bad_rows_are_each_named_up_to_ten(tmp_path: Path) -> None:
    records = _records(tmp_path, [_row(0), b"not json", b"[1]", _row(3)])
    with pytest.raises(rundir.InputError) as caught:
        rundir.read_rows(records, rundir.Budget(), KEEP_NOTHING)
    assert [line.split(":")[1] for line in caught.value.lines] == [" line 2", " line 3"]
    records = _records(tmp_path, [b"not json"] * 25)
    with pytest.raises(rundir.InputError) as caught:
        rundir.read_rows(records, rundir.Budget(), KEEP_NOTHING)
    assert len(caught.value.lines) == 10
    assert caught.value.lines[-1].startswith(f"{records}: line 10")
