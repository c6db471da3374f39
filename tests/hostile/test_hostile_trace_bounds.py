"""Small trace files that ask for unbounded work: ``sim --trace`` and ``bench --dataset trace``
refuse them in one line (file, field, what was expected) before building anything, and
``sim --trace`` keeps ``sim``'s clock: no step price or arrival that would overflow it, lose a
step's price in its rounding, or write times a run's records cannot hold."""

from __future__ import annotations

import json
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from speclens.bench.datasets import trace_prompts
from speclens.runs.trace import TraceError

Cli = Callable[..., tuple[int, str, str]]


def _mooncake(path: Path, lines: int, input_length: int, output_length: int, gap_ms: float = 10.0
              ) -> Path:  # fmt: skip
    path.write_text("".join(json.dumps({"timestamp": i * gap_ms, "input_length": input_length,
                                        "output_length": output_length}) + "\n"
                            for i in range(lines)))  # fmt: skip
    return path


def _cost(path: Path, text: str = "base: 0.01\nper_seq: 0.001\n") -> Path:
    path.write_text(text)
    return path


def _peak(call: Callable[[], object]) -> tuple[object, int, float]:
    """``call()``'s result, the most bytes Python and numpy held during it, and its seconds."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1], time.perf_counter() - start
    finally:
        tracemalloc.stop()


# ------------------------------------------------------------------------- item 14: request-steps
def test_a_small_trace_of_long_outputs_is_refused_before_the_replay_allocates(
    run_cli: Cli, tmp_path: Path
) -> None:
    """4,096 lines of 2^20 output tokens each (270 KB, every line within its own bounds) once
    drove ``sim --trace`` to 3.5 GB and a numpy traceback: 4.3e9 request-steps, which the replay
    would keep step by step for its records."""
    trace = _mooncake(tmp_path / "t.jsonl", 4096, 10, 2**20)
    (code, out, err), peak, seconds = _peak(
        lambda: run_cli("sim", "--trace", trace, "--step-cost", _cost(tmp_path / "c.yaml"))
    )  # type: ignore[misc]
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"{trace}: output_length: 4,096 requests ask for 4,294,967,296 output tokens in all, up "
        "to as many request-steps, over the 2,000,000 a replay may take (it keeps every "
        "request's decode steps for its records, as sim --output-dir does): replay fewer or "
        "shorter requests"
    ]
    assert peak < 32 * 2**20, f"held {peak:,} bytes"
    assert seconds < 10


def test_a_trace_just_within_the_budget_is_replayed(run_cli: Cli, tmp_path: Path) -> None:
    trace = _mooncake(tmp_path / "t.jsonl", 4, 10, 500_000)
    cost = _cost(tmp_path / "c.yaml", "base: 0.0001\n")
    code, out, err = run_cli("sim", "--trace", trace, "--step-cost", cost, "--json")
    assert code == 0, err
    assert json.loads(out)["requests"] == 4


# ---------------------------------------------------------------- item 15: bench --dataset trace
def test_bench_refuses_a_trace_of_long_prompts_before_building_them(
    run_cli: Cli, tmp_path: Path
) -> None:
    """128 lines of 2^20-token inputs (8 KB): bench built 134 million words of filler (40 s,
    823 MB) before its first request; 512 lines ended in a MemoryError."""
    trace = _mooncake(tmp_path / "t.jsonl", 128, 2**20, 4)
    assert trace.stat().st_size < 9000
    expected = (
        f"{trace}: input_length: 128 requests ask for 134,217,728 input tokens in all, up to "
        "1,073,741,824 bytes of prompt text (a word of filler a token), over the 268,435,456 "
        "bytes a prompt set may hold: send fewer or shorter requests"
    )
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(TraceError) as caught:
            trace_prompts(trace)
        peak, seconds = tracemalloc.get_traced_memory()[1], time.perf_counter() - start
    finally:
        tracemalloc.stop()
    assert caught.value.lines == [expected]
    assert peak < 16 * 2**20 and seconds < 5, (peak, seconds)
    # nothing on an unreachable server's side: the refusal comes before any request
    code, out, err = run_cli("bench", "--url", "http://127.0.0.1:9", "--model", "dummy",
                             "--dataset", "trace", "--dataset-path", trace)  # fmt: skip
    assert (code, err.splitlines()) == (1, [expected]), out


def test_bench_builds_the_prompts_of_a_trace_within_the_bound(tmp_path: Path) -> None:
    trace = _mooncake(tmp_path / "t.jsonl", 3, 40, 4)
    prompts = trace_prompts(trace)
    assert [len(p.text.split()) for p in prompts] == [40, 40, 40]
    assert [p.due for p in prompts] == pytest.approx([0.0, 0.01, 0.02])


def test_bench_builds_a_trace_of_long_prompts_in_bounded_time_and_memory(tmp_path: Path) -> None:
    """Half a million words: what it holds is the text (about 3 MB), built in a few seconds at
    most."""
    trace = _mooncake(tmp_path / "t.jsonl", 2, 2**18, 4)
    prompts, peak, seconds = _peak(lambda: trace_prompts(trace))
    assert len(prompts) == 2  # type: ignore[arg-type]
    assert peak < 16 * 2**20 and seconds < 10, (peak, seconds)


# ------------------------------------------------------------------------------- item 16: clocks
def test_a_step_price_of_1e295_seconds_is_refused(run_cli: Cli, tmp_path: Path) -> None:
    trace = _mooncake(tmp_path / "t.jsonl", 8, 10, 16)
    cost = _cost(tmp_path / "c.yaml", "base: 1.0e+295\n")
    code, out, err = run_cli("sim", "--trace", trace, "--step-cost", cost)
    assert (code, out, err.splitlines()) == (1, "", [
        f"{cost}: base: prices a step at 1e+295 s at least: expected prices in seconds (a "
        "replay's records hold at most a year, 3.1536e+07 s)"
    ])  # fmt: skip


def test_a_step_cost_file_names_its_dearest_term(run_cli: Cli, tmp_path: Path) -> None:
    """calibrate's own file: the field is under ``step_cost``."""
    trace = _mooncake(tmp_path / "t.jsonl", 8, 10, 16)
    cost = _cost(tmp_path / "c.yaml", "kind: StepCostFit\nstep_cost: {base: 0.001, per_seq: "
                 "1.0e+200}\nfit: {}\nprovenance: {}\n")  # fmt: skip
    code, _, err = run_cli("sim", "--trace", trace, "--step-cost", cost)
    assert code == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(f"{cost}: step_cost.per_seq: prices a step at 1e+200 s at least: ")


def test_prices_that_run_the_replay_past_a_year_are_refused(run_cli: Cli, tmp_path: Path) -> None:
    """Each step within a year, but 8 x 16 of them at 10^7 s: the replay's records would hold
    times no run's records hold (compare refused them)."""
    trace = _mooncake(tmp_path / "t.jsonl", 8, 10, 16)
    cost = _cost(tmp_path / "c.yaml", "base: 1.0e+7\n")
    code, out, err = run_cli("sim", "--trace", trace, "--step-cost", cost,
                             "--output-dir", tmp_path / "out")  # fmt: skip
    assert (code, out) == (1, ""), out
    (line,) = err.splitlines()
    assert line.startswith(f"{cost}: base: the replay ran ") and line.endswith(
        " s of virtual time, past a year (3.1536e+07 s, the longest a run's records hold): "
        "expected prices in seconds"
    ), line
    assert not (tmp_path / "out" / "summary.json").exists()


def test_a_chip_with_a_bandwidth_of_1e_300_is_refused(run_cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "chip.yaml").write_text(
        "kind: Chip\nname: slow\nsource: measured\ntflops: {bf16: 1.0}\nmemory_gb: 64\n"
        "memory_bandwidth_tbps: 1.0e-300\ninterconnect_gbps: 10\n"
    )
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(
        "model: smollm2-135m\nhardware_file: chip.yaml\ndeployment: {pools: [{engine: {}}]}\n"
        "workload: {input_tokens: 32, output_tokens: 32, concurrency: 4, requests: 8}\n"
    )
    trace = _mooncake(tmp_path / "t.jsonl", 8, 10, 16)
    code, out, err = run_cli("sim", "--trace", trace, scenario)
    assert (code, out) == (1, "")
    (line,) = err.splitlines()
    assert line.startswith(f"{scenario}: hardware_file: prices a step at ") and line.endswith(
        " s at least: expected prices in seconds (a replay's records hold at most a year, "
        "3.1536e+07 s)"
    ), line


def test_a_timestamp_of_1e308_is_refused(run_cli: Cli, tmp_path: Path) -> None:
    """An arrival of 1e305 s: every price vanished in the clock's rounding (latencies of 0 s)."""
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 16}\n'
                     '{"timestamp": 1e308, "input_length": 10, "output_length": 16}\n')  # fmt: skip
    code, out, err = run_cli("sim", "--trace", trace, "--step-cost", _cost(tmp_path / "c.yaml"))
    assert (code, out, err.splitlines()) == (1, "", [
        f"{trace}: line 2: timestamp: expected milliseconds within 31536000000 (a year) of the "
        "first line's (0), got 1e+308"
    ])  # fmt: skip


def test_arrivals_a_day_apart_are_replayed_to_the_millisecond(run_cli: Cli, tmp_path: Path) -> None:
    """Within the bound, a long trace keeps every price: each request alone, its E2E is its
    prefill plus its decode steps whatever its arrival."""
    trace = _mooncake(tmp_path / "t.jsonl", 3, 10, 5, gap_ms=86_400_000.0)
    code, out, err = run_cli("sim", "--trace", trace, "--step-cost",
                             _cost(tmp_path / "c.yaml", "base: 0.01\n"), "--json")  # fmt: skip
    assert code == 0, err
    figures = json.loads(out)
    assert figures["makespan_s"] == pytest.approx(2 * 86_400 + 5 * 0.01)
    assert figures["latency_ms"]["e2e"]["mean"] == pytest.approx(50.0, rel=0.02)  # a sketch
