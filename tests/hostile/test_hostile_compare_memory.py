"""speclens compare on runs whose rows carry large raw payloads: it keeps only the fields it
reads (two runs of 96 MB once held 1.6 GB), and what it keeps of all its inputs together is
bounded, refused in one line past the bound."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import orjson
import pytest

from comparekit import write_run
from speclens.runs import compare as cmp
from speclens.runs import rundir
from speclens.runs.compare_inputs import read_inputs, read_run

#: A streamed response's events, as bench keeps them in ``raw``: many small objects.
EVENT = {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "a",
         "logprobs": None, "finish_reason": None}]}  # fmt: skip


def _with_raw(run: Path, events: int) -> Path:
    """Every row of the run given ``events`` raw events (its bytes grow; its figures do not)."""
    path = run / "records.jsonl"
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    raw = [EVENT] * events
    path.write_bytes(b"".join(orjson.dumps(r | {"raw": raw}) + b"\n" for r in rows))
    return run


def test_the_raw_payloads_are_not_kept(tmp_path: Path) -> None:
    """Two runs of 24 requests with 600 raw events each (about 1.4 MB a run): what compare holds
    after reading them is a few hundred bytes a request, not the payloads."""
    a = _with_raw(write_run(tmp_path / "a", seed=1), 600)
    b = _with_raw(write_run(tmp_path / "b", seed=2), 600)
    assert (a / "records.jsonl").stat().st_size > 2**20
    tracemalloc.start()
    try:
        inputs = read_inputs([a, b], ["A", "B"], [1, 1])
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 2**20, f"compare holds {held:,} bytes after reading two runs"
    for run in (r for item in inputs for r in item.runs):
        for row in run.rows:
            assert "raw" not in row and "anomalies" not in row, sorted(row)
    # what it keeps still gives every check and figure
    pair = cmp.compare(inputs)["pairs"][0]
    assert pair["comparable"], pair["label"]


def test_what_is_kept_of_all_inputs_together_is_bounded(
    run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run alone is under the bound; the two together are not: one line, exit 1, naming
    the file where the bound was passed."""
    a = write_run(tmp_path / "a", seed=1)
    b = write_run(tmp_path / "b", seed=2)
    one = read_run(a)
    size = sum(len(orjson.dumps(r, option=orjson.OPT_NON_STR_KEYS)) for r in one.rows)
    monkeypatch.setattr(rundir, "MAX_KEPT_BYTES", int(size * 1.5))
    read_run(a)  # one run fits
    code, out, err = run_cli("compare", a, b)
    assert code == 1 and "Traceback" not in out + err, (code, out, err)
    (line,) = err.strip().splitlines()
    assert line.startswith(f"{b / 'records.jsonl'}: line ")
    assert f"the fields kept of its inputs pass {int(size * 1.5):,} bytes in all" in line
