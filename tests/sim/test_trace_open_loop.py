"""An open-loop run read as a trace replays each request when it was due (``scheduled_s``), not
when a lagging client got it out (``start_s``): the arrival process is the workload's, the lag
the client's."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from speclens.cost import StepCost
from speclens.runs.report import RecordStream
from speclens.runs.trace import Trace, TraceRequest, read_trace
from speclens.sim import run_output
from speclens.sim.replay import replay, settings

COST = StepCost(base=0.01, per_token=0.0, per_seq=0.002, per_context_token=0.0,
                draft_base=0.0, draft_per_token=0.0)  # fmt: skip
#: When each request was due, and how late the client sent it: request 1 left 0.9 s late,
#: after request 2 (due 0.2 s after it, sent 0.1 s late).
DUE = [0.0, 0.5, 0.7, 1.5]
LAG = [0.05, 0.9, 0.1, 0.0]


def _open_run(out: Path, rate: float | None) -> Path:
    """A run of four requests (open loop at ``rate``, or closed at concurrency 1 where None)
    whose client sent each ``LAG`` after it was due."""
    reqs = [TraceRequest(i, due, 20 + i, 5, "c") for i, due in enumerate(DUE)]
    concurrency = None if rate else 1
    t = Trace(Path("synthetic"), "run", reqs, concurrency, 0, "dummy",
              {"model": "dummy", "max_tokens": 5, "ignore_eos": True, "temperature": 0.0,
               "concurrency": concurrency, "request_rate": rate})  # fmt: skip
    result = replay(t, COST, 0, 256, 8192)
    summary = run_output.summary(result.records, result.makespan, settings(t, "cost", 0, 0),
                                 {"engine": "speclens", "model": "dummy"}, {})  # fmt: skip
    for record in result.records:
        lag = LAG[record.index]
        record.scheduled = record.start if rate else None
        record.start, record.end = record.start + lag, record.end + lag
    with RecordStream(out) as stream:
        for record in result.records:
            stream.write(record)
    (out / "summary.json").write_bytes(orjson.dumps(summary))
    return out


def test_an_open_loop_run_replays_when_each_request_was_due(tmp_path: Path) -> None:
    run = _open_run(tmp_path / "run", rate=2.0)
    rows = [orjson.loads(line) for line in (run / "records.jsonl").read_bytes().splitlines()]
    assert [r["start_s"] - r["scheduled_s"] for r in rows] == pytest.approx(LAG)  # it lagged
    t = read_trace(run)
    assert t.concurrency is None
    assert [r.index for r in t.requests] == [0, 1, 2, 3]  # due order, not the order sent
    assert [r.arrival for r in t.requests] == pytest.approx(DUE)
    replayed = replay(t, COST, 0, 256, 8192).records
    assert [r.start for r in replayed] == pytest.approx(DUE)


def test_a_closed_loop_run_replays_when_each_request_was_sent(tmp_path: Path) -> None:
    """A closed loop has no schedule: a request arrives as one leaves, when it was sent."""
    run = _open_run(tmp_path / "run", rate=None)
    rows = [orjson.loads(line) for line in (run / "records.jsonl").read_bytes().splitlines()]
    assert {r["scheduled_s"] for r in rows} == {None}
    t = read_trace(run)
    assert t.concurrency == 1
    sent = sorted((r["start_s"], r["index"]) for r in rows)
    assert [r.index for r in t.requests] == [i for _, i in sent]
    assert [r.arrival for r in t.requests] == pytest.approx([s - sent[0][0] for s, _ in sent])
