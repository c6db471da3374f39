"""``sim --trace`` and ``calibrate`` on runs whose rows carry large raw payloads (bench keeps
each response's events): they keep only the fields they read, dropped line by line, and what
they keep is bounded, refused in one line past the bound."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from speclens.cost import StepCost
from speclens.runs import rundir
from speclens.runs import trace as trace_module
from speclens.runs.report import RecordStream
from speclens.runs.trace import Trace, TraceError, TraceRequest, read_trace
from speclens.sim import calibrate, run_output
from speclens.sim.replay import replay, settings

K = 4
COST = StepCost(base=0.004, per_token=0.0, per_seq=0.0015, per_context_token=2e-6,
                draft_base=0.0, draft_per_token=0.0, prefill_base=0.003,
                prefill_per_token=4e-5)  # fmt: skip
#: A streamed response's events, as bench keeps them in ``raw``: many small objects.
EVENT = {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "a",
         "logprobs": None, "finish_reason": None}]}  # fmt: skip


def _run(out: Path, concurrency: int, events: int) -> Path:
    """A replayed run of 16 requests at ``concurrency``, each row given ``events`` raw events."""
    reqs = [TraceRequest(i, 0.0, 40 + 7 * i, 30 + i, "c", 8, 10, {0: 2, 1: 2, 2: 2, 3: 2})
            for i in range(16)]  # fmt: skip
    t = Trace(Path("synthetic"), "run", reqs, concurrency, K, "dummy",
              {"model": "dummy", "max_tokens": 64, "ignore_eos": True, "temperature": 0.0,
               "concurrency": concurrency})  # fmt: skip
    result = replay(t, COST, K, 256, 8192)
    server = {"engine": "speclens", "version": "test", "model": "dummy",
              "acceptance": {"num_speculative_tokens": K, "forced": False}}  # fmt: skip
    summary = run_output.summary(result.records, result.makespan, settings(t, "cost", 0, K),
                                 server, {})  # fmt: skip
    with RecordStream(out) as stream:  # no plots: write_run's other files take seconds
        for record in result.records:
            stream.write(record)
    (out / "summary.json").write_bytes(orjson.dumps(summary))
    path = out / "records.jsonl"
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    raw = [EVENT] * events
    path.write_bytes(b"".join(orjson.dumps(r | {"raw": raw}) + b"\n" for r in rows))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Runs at concurrency 1 and 4 of about 3 MB each, nearly all of it raw payloads."""
    root = tmp_path_factory.mktemp("raw")
    out = {c: _run(root / f"c{c}", c, 1500) for c in (1, 4)}
    assert all((p / "records.jsonl").stat().st_size > 2.5 * 2**20 for p in out.values())
    return out


def _peak(read: Callable[[], object]) -> tuple[object, int]:
    """What ``read()`` returned, and the most bytes it held at once while it read."""
    tracemalloc.start()
    try:
        value = read()
        return value, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_trace_keeps_no_raw_payload(runs: dict[int, Path]) -> None:
    t, peak = _peak(lambda: read_trace(runs[4]))
    assert isinstance(t, Trace) and len(t.requests) == 16
    # one line's payload at a time (about 3 MB as it is parsed), never the run's 16
    assert peak < 8 * 2**20, f"read_trace held {peak:,} bytes of a 3 MB run at once"
    assert t.concurrency == 4 and t.k == K and t.model == "dummy"
    assert {r.histogram == {0: 2, 1: 2, 2: 2, 3: 2} for r in t.requests} == {True}
    run = rundir.read_run(runs[4], rundir.fields(trace_module.TRACE_FIELDS), dict)
    assert all(set(row) <= set(trace_module.TRACE_FIELDS) for row in run.rows)
    assert all("raw" not in row and "itl_runs_s" not in row for row in run.rows)


def test_calibrate_keeps_no_raw_payload_and_fits_as_before(runs: dict[int, Path]) -> None:
    observed, peak = _peak(lambda: [calibrate.observe(runs[c]) for c in (1, 4)])
    assert peak < 8 * 2**20, f"calibrate held {peak:,} bytes of two 3 MB runs at once"
    assert isinstance(observed, list)
    cost, report = calibrate.fit(observed)
    assert report["requests"] == 32 and report["batch_widths"] == [1, 4]
    assert cost.base == pytest.approx(COST.base, rel=0.1)


def test_what_a_trace_keeps_is_bounded_in_one_line(
    runs: dict[int, Path], run_cli: Callable[..., tuple[int, str, str]],
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:  # fmt: skip
    """The bound counts the fields kept, not the raw payloads dropped: under it, a 3 MB run
    reads; past it, one line naming the file and the row where it was passed."""
    monkeypatch.setattr(rundir, "MAX_KEPT_BYTES", 4000)
    with pytest.raises(TraceError) as caught:
        read_trace(runs[4])
    (line,) = caught.value.lines
    records = runs[4] / "records.jsonl"
    assert line.startswith(f"{records}: line ") and line.endswith(
        "pass 4,000 bytes in all: expected fewer or smaller runs"
    ), line
    cost = tmp_path / "cost.yaml"
    cost.write_text("base: 0.01\n")
    code, out, err = run_cli("sim", "--trace", runs[4], "--step-cost", cost)
    assert (code, out, err.splitlines()) == (1, "", [line])
    with pytest.raises(calibrate.CalibrationError) as refused:
        calibrate.observe(runs[4])
    (line,) = refused.value.lines
    assert line.startswith(f"{records}: line ") and "pass 4,000 bytes in all" in line, line
