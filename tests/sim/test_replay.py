"""``sim --trace``: a trace's requests replayed with their own lengths and acceptance, at their
arrivals or at the run's concurrency; and ``calibrate``: a step cost fitted from what a client
saw recovers the cost that produced the observations, and predicts a held-out run with it."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import launch
from speclens.cost import StepCost
from speclens.runs.report import RecordStream
from speclens.runs.trace import Trace, TraceError, TraceRequest, read_trace
from speclens.sim import catalog, run_output
from speclens.sim.calibrate import (
    CalibrationError,
    _misfit,
    fit,
    fit_roofline,
    observe,
    read_cost_file,
)
from speclens.sim.catalog import ChipSpec
from speclens.sim.replay import replay, settings
from speclens.sim.roofline import Efficiency, Roofline

K = 4
STALLS_ABOVE_IDLE = "idle TTFTs (the stalls priced a prefill above them)"
#: A cost with every term the black-box fit can see (per_token folded into per_seq).
TRUE = StepCost(base=0.004, per_token=0.0, per_seq=0.0015, per_context_token=2e-6,
                draft_base=0.0, draft_per_token=0.0, prefill_base=0.003,
                prefill_per_token=4e-5)  # fmt: skip


def requests(
    n: int, seed: int, gap: float = 0.0, prompts: tuple[int, int] = (20, 400),
    outputs: tuple[int, int] = (24, 80),
) -> list[TraceRequest]:  # fmt: skip
    """n requests with varied lengths and histograms at K 4, arriving ``gap`` s apart."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        prompt, completion = int(rng.integers(*prompts)), int(rng.integers(*outputs))
        hist = {j: int(c) for j, c in enumerate(rng.multinomial(12, [0.3, 0.2, 0.2, 0.1, 0.2]))}
        hist = {j: c for j, c in hist.items() if c}
        steps, accepted = sum(hist.values()), sum(j * c for j, c in hist.items())
        out.append(TraceRequest(i, i * gap, prompt, completion, "random", steps, accepted, hist))
    return out


def trace(reqs: list[TraceRequest], concurrency: int | None) -> Trace:
    return Trace(Path("synthetic"), "run", reqs, concurrency, K, "dummy",
                 {"model": "dummy", "max_tokens": 80, "ignore_eos": True, "temperature": 0.0,
                  "concurrency": concurrency})  # fmt: skip


def write(
    out: Path, t: Trace, cost: StepCost | Roofline, seed: int = 0, front: float = 0.0
) -> Path:
    """The replay written as a run directory (what calibrate reads as an observation)."""
    result = replay(t, cost, K, 256, 8192, seed, front)
    server = {"engine": "speclens", "version": "test", "model": t.model,
              "acceptance": {"num_speculative_tokens": K, "forced": False}}  # fmt: skip
    summary = run_output.summary(result.records, result.makespan,
                                 settings(t, "cost", seed, K), server, {})  # fmt: skip
    run_output.write_run(RecordStream(out), summary, result.records)
    return out


# --- replay ---------------------------------------------------------------------------------------


def test_one_at_a_time_each_request_costs_its_prefill_and_its_verify_steps() -> None:
    """Closed loop at concurrency 1: request i starts when i - 1 ends, and lasts its prefill
    plus one decode step per verify step it realized (each emitting 1 + accepted tokens),
    priced by the step cost's formula."""
    reqs = [TraceRequest(0, 0.0, 100, 1 + 3 + 5, "c", 3, 5, {0: 1, 2: 1, 3: 1}),
            TraceRequest(1, 0.0, 50, 1 + 2 + 2, "c", 2, 2, {1: 2})]  # fmt: skip
    cost = StepCost(base=0.01, per_token=0.0, per_seq=0.002, per_context_token=0.0,
                    draft_base=0.0, draft_per_token=0.0)  # fmt: skip
    result = replay(trace(reqs, 1), cost, K, 256, 8192)
    first, second = result.records
    step = 0.01 + 0.002
    assert first.start == 0.0 and first.ttft == pytest.approx(cost.prefill(100, 1, 100))
    assert first.latency == pytest.approx(cost.prefill(100, 1, 100) + 3 * step)
    assert second.start == pytest.approx(first.end)
    assert second.latency == pytest.approx(cost.prefill(50, 1, 50) + 2 * step)
    for record, req in zip(result.records, reqs, strict=True):
        spec = record.spec
        assert spec is not None and record.completion_tokens == req.output_tokens
        assert spec["acceptance_histogram"] == req.histogram  # its own acceptance, step for step
        assert sorted(n for _, n in record.itl_runs) == sorted(1 + j for j, c in req.histogram.items() for _ in range(c))  # fmt: skip


def test_a_closed_loop_request_waits_for_the_step_that_began_as_it_arrived() -> None:
    """Closed loop at concurrency 2: request 2 arrives as request 0 leaves, just after that
    step's boundary, so with request 1 still decoding it waits for the step the engine has
    begun, then its prefill (on speclens serve at c8 every such request waited a whole decode
    step, 50 to 110 ms; without it the replays' TTFTs at c8 came out 20% to 50% short)."""
    reqs = [TraceRequest(0, 0.0, 100, 3, "c", 2, 0, {0: 2}),
            TraceRequest(1, 0.0, 50, 11, "c", 10, 0, {0: 10}),
            TraceRequest(2, 0.0, 30, 2, "c", 1, 0, {0: 1})]  # fmt: skip
    cost = StepCost(base=0.01, per_token=0.0, per_seq=0.002, per_context_token=0.0,
                    draft_base=0.0, draft_per_token=0.0)  # fmt: skip
    first, second, third = replay(trace(reqs, 2), cost, K, 256, 8192).records
    assert first.ttft == second.ttft == pytest.approx(cost.prefill(150, 2, 150))
    assert first.end == pytest.approx(first.ttft + 2 * (0.01 + 2 * 0.002))
    assert third.start == pytest.approx(first.end)
    assert third.ttft == pytest.approx((0.01 + 0.002) + cost.prefill(30, 1, 30))
    # An idle engine takes it at once: at concurrency 1 no step is running.
    alone = replay(trace(reqs, 1), cost, K, 256, 8192).records
    assert alone[1].ttft == pytest.approx(cost.prefill(50, 1, 50))


def test_the_engine_sees_a_request_its_front_latency_after_it_arrived() -> None:
    """A server's front end (HTTP, tokenizing, another process on vLLM) holds each request
    ``front`` seconds before the engine sees it: at concurrency 1 that adds to its TTFT; at 2
    the next request joins at the first step boundary after its arrival plus ``front``."""
    reqs = [TraceRequest(0, 0.0, 100, 3, "c", 2, 0, {0: 2}),
            TraceRequest(1, 0.0, 50, 11, "c", 10, 0, {0: 10}),
            TraceRequest(2, 0.0, 30, 2, "c", 1, 0, {0: 1})]  # fmt: skip
    cost = StepCost(base=0.01, per_token=0.0, per_seq=0.002, per_context_token=0.0,
                    draft_base=0.0, draft_per_token=0.0)  # fmt: skip
    alone = replay(trace(reqs, 1), cost, K, 256, 8192, front=0.05).records
    assert alone[1].start == pytest.approx(alone[0].end)
    assert [r.ttft for r in alone] == pytest.approx(
        [0.05 + cost.prefill(p, 1, p) for p in (100, 50, 30)])  # fmt: skip
    (arrived,) = replay(trace(reqs[:1], None), cost, K, 256, 8192, front=0.05).records
    assert arrived.ttft == pytest.approx(0.05 + cost.prefill(100, 1, 100))  # open loop too
    first, _, third = replay(trace(reqs, 2), cost, K, 256, 8192, front=0.05).records
    assert first.ttft == pytest.approx(0.05 + cost.prefill(150, 2, 150))
    assert third.start == pytest.approx(first.end)
    # Request 1 alone steps 12 ms at a time: the fifth boundary is the first 50 ms on.
    assert third.ttft == pytest.approx(5 * (0.01 + 0.002) + cost.prefill(30, 1, 30))


def test_open_loop_requests_start_at_their_arrivals_and_keep_their_indices() -> None:
    reqs = requests(12, seed=1, gap=0.5)
    result = replay(trace(reqs, None), TRUE, K, 256, 8192)
    assert [r.index for r in result.records] == [r.index for r in reqs]
    assert [r.start for r in result.records] == pytest.approx([r.arrival for r in reqs])
    assert [r.prompt_tokens for r in result.records] == [r.input_tokens for r in reqs]


def test_closed_loop_keeps_its_concurrency() -> None:
    result = replay(trace(requests(16, seed=2), 4), TRUE, K, 256, 8192)
    events = sorted([(r.start, 1) for r in result.records] + [(r.end, -1) for r in result.records])
    live = np.cumsum([e for _, e in sorted(events, key=lambda e: (e[0], e[1]))])
    assert live.max() == 4


def test_counts_only_acceptance_spreads_the_accepted_drafts_over_its_steps() -> None:
    req = TraceRequest(0, 0.0, 10, 1 + 4 + 6, "c", 4, 6, None)
    result = replay(trace([req], 1), TRUE, K, 256, 8192)
    (record,) = result.records
    assert record.spec is not None and record.spec["num_accepted_draft_tokens"] == 6
    assert sorted(n for _, n in record.itl_runs) == [2, 2, 3, 3]


def test_a_request_runs_the_decode_steps_the_server_counted() -> None:
    """speclens serve counts every decode step (``num_decode_steps``) and its acceptance in
    full, though ``max_tokens`` cut the last step: 2 verify steps accepting 4 and 1, 6 decode
    steps, 10 tokens. Counted from its tokens (9 - 5) it ran 4 steps; it ran 6: 4 that drafted
    nothing, the one that accepted 1, and last, always, the one that accepted 4 of which 2 were
    kept (the only one that accepted 2 or more)."""
    req = TraceRequest(0, 0.0, 10, 10, "c", 2, 5, {4: 1, 1: 1}, decode_steps=6)
    for seed in range(5):
        (record,) = replay(trace([req], 1), TRUE, K, 256, 8192, seed=seed).records
        assert record.spec is not None and record.spec["num_decode_steps"] == 6
        assert record.spec["acceptance_histogram"] == {4: 1, 1: 1}
        emitted = [n for _, n in record.itl_runs]
        assert emitted[-1] == 3 and sorted(emitted[:-1]) == [1, 1, 1, 1, 2], (seed, emitted)


@pytest.mark.parametrize(
    ("completion", "histogram", "decode_steps", "steps", "why"),
    [(10, {4: 1, 1: 1}, 9, 4, "no step accepted the 5 it would lose"),
     (10, {4: 1, 1: 1}, 3, 4, "short of the completion"),
     (8, {4: 2}, 1, 2, "fewer steps than its verify steps")],
)  # fmt: skip
def test_decode_steps_that_cannot_be_fill_up_to_the_completion(
    completion: int, histogram: dict[int, int], decode_steps: int, steps: int, why: str
) -> None:
    """Where the stated count cannot be the request's steps (another engine's count, or a stop
    string's cut), the steps that drafted nothing fill up to its completion, as without one."""
    accepted = sum(j * n for j, n in histogram.items())
    req = TraceRequest(0, 0.0, 10, completion, "c", sum(histogram.values()), accepted, histogram,
                       decode_steps=decode_steps)  # fmt: skip
    (record,) = replay(trace([req], 1), TRUE, K, 256, 8192).records
    assert record.spec is not None and record.spec["num_decode_steps"] == steps, why
    assert sum(n for _, n in record.itl_runs) == completion - 1, why


def test_token_counts_without_steps_decode_on_the_fewest_verify_steps_that_drafted_them() -> None:
    """llama.cpp counts drafted and accepted tokens only: 9 drafted at K 4 took at least 3
    verify steps; its 5 accepted drafts spread over them (2, 2, 1), the rest a token a step."""
    req = TraceRequest(0, 0.0, 10, 1 + 20, "c", None, 5, None, 9)
    assert req.verify_steps(K) == 3 and req.verify_steps(2) == 5
    result = replay(trace([req], 1), TRUE, K, 256, 8192)
    (record,) = result.records
    assert record.spec is not None and record.spec["num_accepted_draft_tokens"] == 5
    assert record.spec["num_spec_steps"] == 3
    assert sorted(n for _, n in record.itl_runs) == [1] * 12 + [2, 3, 3]
    # Accepted drafts need a step per K even where fewer tokens are said to be drafted.
    assert TraceRequest(0, 0.0, 10, 30, "c", None, 9, None, 0).verify_steps(K) == 3


def test_a_prefill_computes_only_the_prompt_tokens_not_from_the_cache() -> None:
    """Two identical requests, one with 90 of its 100 prompt tokens from the server's prefix
    cache: its TTFT is the prefill of 10 tokens, and it decodes over all 100 of its context."""
    cost = StepCost(base=0.01, per_token=0.0, per_seq=0.0, per_context_token=1e-4,
                    draft_base=0.0, draft_per_token=0.0, prefill_base=0.002,
                    prefill_per_token=1e-3)  # fmt: skip
    plain = TraceRequest(0, 0.0, 100, 5, "c", 0, 0, {})
    cached = TraceRequest(1, 0.0, 100, 5, "c", 0, 0, {}, None, 90)
    one, two = (replay(trace([r], 1), cost, K, 256, 8192).records[0] for r in (plain, cached))
    assert one.ttft == pytest.approx(0.002 + 0.1) and two.ttft == pytest.approx(0.002 + 0.01)
    assert two.latency - two.ttft == pytest.approx(one.latency - one.ttft)


def test_a_verify_step_attends_over_its_k_drafts() -> None:
    """A verify step's context is the prompt, the tokens so far and its K drafts; a step that
    drafted nothing attends over the prompt and the tokens so far only. By hand, at K 4: a
    prompt of 100, three verify steps accepting 2 drafts each (3 tokens a step after the
    prefill's 1) attend over 100 + 1 + 4, 100 + 4 + 4 and 100 + 7 + 4 tokens."""
    from speclens.sim.replay import Recorded

    drafting = TraceRequest(0, 0.0, 100, 1 + 3 * 3, "c", 3, 6, {2: 3})
    t = trace([drafting], 1)
    emitted, context, drafted, accepted = Recorded(t, K, np.random.default_rng(0))._one(
        100, drafting.output_tokens, drafting
    )
    assert emitted.tolist() == [3, 3, 3] and drafted.tolist() == [True] * 3
    assert accepted.tolist() == [2, 2, 2]
    assert context.tolist() == [105, 108, 111]
    # one verify step that accepted nothing and two that drafted nothing, in a random order
    mixed = TraceRequest(1, 0.0, 50, 1 + 3, "c", 1, 0, {0: 1})
    _, context, drafted, _ = Recorded(trace([mixed], 1), K, np.random.default_rng(1))._one(
        50, mixed.output_tokens, mixed
    )
    assert drafted.sum() == 1
    assert sorted(zip(drafted.tolist(), context.tolist(), strict=True)) == sorted(
        (bool(d), 51 + i + 4 * bool(d)) for i, d in enumerate(drafted.tolist())
    )
    # priced by context alone (1 ms a token), the request's decode takes 105 + 108 + 111 ms
    cost = StepCost(base=0.0, per_token=0.0, per_seq=0.0, per_context_token=1e-3,
                    draft_base=0.0, draft_per_token=0.0)  # fmt: skip
    (record,) = replay(t, cost, K, 256, 8192).records
    assert record.latency - record.ttft == pytest.approx(0.324)


def test_a_request_without_acceptance_decodes_a_token_a_step() -> None:
    req = TraceRequest(0, 0.0, 10, 9, "c")
    result = replay(Trace(Path("t"), "mooncake", [req]), TRUE, 0, 256, 8192)
    (record,) = result.records
    assert [n for _, n in record.itl_runs] == [1] * 8 and record.spec is None


# --- Mooncake-style traces ------------------------------------------------------------------------


def test_a_mooncake_trace_is_read_in_arrival_order_from_zero(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    rows = [{"timestamp": 1000 + 250 * i, "input_length": 10 + i, "output_length": 5, "hash_ids": [i]}
            for i in range(4)]  # fmt: skip
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    t = read_trace(path)
    assert t.kind == "mooncake" and t.concurrency is None and not t.states_acceptance
    assert [r.arrival for r in t.requests] == [0.0, 0.25, 0.5, 0.75]
    assert [r.input_tokens for r in t.requests] == [10, 11, 12, 13]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("{not json", "line 2: not JSON"),
        ('{"timestamp": -1, "input_length": 3, "output_length": 3}', "line 2: timestamp: expected milliseconds >= 0"),
        ('{"timestamp": 5, "input_length": 0, "output_length": 3}', "line 2: input_length: expected a token count >= 1"),
        ('{"timestamp": 5, "input_length": 3}', "line 2: output_length: expected a token count >= 1"),
        ('{"timestamp": 0, "input_length": 3, "output_length": 3}', "timestamps must not decrease"),
        ("[1, 2]", "line 2: expected an object"),
    ],
)  # fmt: skip
def test_a_bad_mooncake_line_is_named(tmp_path: Path, line: str, expected: str) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text('{"timestamp": 1, "input_length": 3, "output_length": 3}\n' + line + "\n")
    with pytest.raises(TraceError) as caught:
        read_trace(path)
    assert caught.value.lines[0].startswith(str(path)) and expected in caught.value.lines[0]


def test_a_run_without_timings_is_not_a_trace(tmp_path: Path) -> None:
    run = write(tmp_path / "run", trace(requests(4, seed=3), 1), TRUE)
    rows = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    for row in rows:
        row["latency_s"] = None
        row["success"] = True
    (run / "records.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(TraceError):
        read_trace(run)


def test_a_run_directory_is_a_trace_with_its_loop_k_and_acceptance(tmp_path: Path) -> None:
    reqs = requests(8, seed=4)
    run = write(tmp_path / "run", trace(reqs, 2), TRUE)
    t = read_trace(run)
    assert t.kind == "run" and t.concurrency == 2 and t.k == K and t.model == "dummy"
    assert [r.index for r in sorted(t.requests, key=lambda r: r.index)] == list(range(8))
    by = {r.index: r for r in t.requests}
    for req in reqs:
        assert by[req.index].histogram == req.histogram
        assert by[req.index].output_tokens == req.output_tokens
    rows = map(json.loads, (run / "records.jsonl").read_text().splitlines())
    counted = {row["index"]: row["spec_decode_acceptance"]["num_decode_steps"] for row in rows}
    assert {i: r.decode_steps for i, r in by.items()} == counted  # every step, drafted or not


def test_a_llamacpp_run_is_a_trace_with_its_stated_k_cache_and_slots(tmp_path: Path) -> None:
    """A run of a server that reports no K nor steps (llama.cpp): the K bench was told, each
    request's counts and cached prompt tokens, and the server's slots, which the replay keeps
    to when no scenario says otherwise."""
    reqs = requests(6, seed=5)
    run = write(tmp_path / "run", trace(reqs, 6), TRUE)
    summary = json.loads((run / "summary.json").read_text())
    summary["server"] = {"engine": "llama.cpp", "version": "b1", "max_num_seqs": 2}
    summary["settings"]["num_speculative_tokens"] = K
    (run / "summary.json").write_text(json.dumps(summary))
    rows = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    for row in rows:
        spec = row["spec_decode_acceptance"]
        drafted = spec["num_draft_tokens"]
        row["spec_decode_acceptance"] = {**spec, "num_spec_steps": None, "num_spec_tokens": None,
                                         "acceptance_histogram": None, "num_decode_steps": None,
                                         "mean_acceptance_length": None}  # fmt: skip
        row["cached_tokens"] = row["prompt_tokens"] // 2
        assert drafted
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    t = read_trace(run)
    assert t.k == K and t.max_num_seqs == 2 and t.states_acceptance
    by = {r.index: r for r in t.requests}
    for row in rows:
        r = by[row["index"]]
        assert (r.steps, r.histogram) == (None, None)
        assert r.accepted == row["spec_decode_acceptance"]["num_accepted_draft_tokens"]
        assert r.cached == row["prompt_tokens"] // 2
    out, cost = tmp_path / "sim", tmp_path / "cost.yaml"
    cost.write_text(yaml.safe_dump(asdict(TRUE)))
    command = [sys.executable, "-m", "speclens", "sim", "--trace", str(run), "--step-cost",
               str(cost), "--output-dir", str(out)]  # fmt: skip
    summary["settings"]["num_speculative_tokens"] = None  # as a bench not told K writes it
    (run / "summary.json").write_text(json.dumps(summary))
    refused = launch.run(command, timeout=120)
    assert refused.returncode == 1 and "state acceptance but not K" in refused.stderr
    assert "bench --num-spec-tokens K" in refused.stderr, refused.stderr
    summary["settings"]["num_speculative_tokens"] = K
    (run / "summary.json").write_text(json.dumps(summary))
    done = launch.run(command, timeout=120)
    assert done.returncode == 0, done.stderr
    replayed = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    events = sorted([(r["start_s"] + r["ttft_s"], 1) for r in replayed]
                    + [(r["start_s"] + r["latency_s"], -1) for r in replayed])  # fmt: skip
    assert max(np.cumsum([e for _, e in sorted(events, key=lambda e: (e[0], e[1]))])) <= 2


# --- calibration ----------------------------------------------------------------------------------


def held_out_error(run: Path, cost: StepCost | Roofline, front: float = 0.0) -> float:
    """The median per-request E2E error of ``run``'s trace replayed with ``cost``."""
    predicted = replay(read_trace(run), cost, K, 256, 8192, seed=99, front=front)
    rows = map(json.loads, (run / "records.jsonl").read_text().splitlines())
    truth = {r["index"]: r["latency_s"] for r in rows}
    errors = [abs(r.latency - truth[r.index]) / truth[r.index] for r in predicted.records]
    return float(np.median(errors))


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Runs at concurrency 1, 4 and 8 whose every step the true cost priced: short prompts and
    long outputs, so a step's context is mostly the tokens its requests have decoded so far."""
    root = tmp_path_factory.mktemp("observed")
    reqs = {
        c: requests(8 * c, seed=10 + c, prompts=(16, 200), outputs=(64, 160)) for c in (1, 4, 8)
    }
    return {c: write(root / f"c{c}", trace(reqs[c], c), TRUE) for c in (1, 4, 8)}


def test_calibration_recovers_the_cost_that_priced_the_steps(observed: dict[int, Path]) -> None:
    cost, report = fit([observe(observed[1]), observe(observed[4])])
    assert report["batch_widths"] == [1, 4]
    assert cost.base == pytest.approx(TRUE.base, rel=0.05)
    assert cost.per_seq == pytest.approx(TRUE.per_seq, rel=0.05)
    assert cost.per_context_token == pytest.approx(TRUE.per_context_token, rel=0.1)
    # A prefill step is priced by what it cost the requests decoding through it, unless that
    # overshoots the idle TTFTs (no batch to hold up here, so the same price; the stalls'
    # estimate of so small a price is loose and does overshoot on these runs), which are kept
    # beside it either way.
    assert report["prefill_from"] in ("decode stalls", STALLS_ABOVE_IDLE)
    assert cost.prefill(100, 1, 100) == pytest.approx(TRUE.prefill(100, 1, 100), rel=0.1)
    idle = report["idle_prefill"]
    assert (idle["base"], idle["per_token"]) == pytest.approx(
        (TRUE.prefill_base, TRUE.prefill_per_token), rel=1e-6
    )
    assert report["decode_time_error_median"] < 0.02
    assert report["front_latency_s"] < 0.002  # none: every idle TTFT is its prefill


def test_calibration_finds_the_front_latency_no_step_pays(tmp_path: Path) -> None:
    """Runs whose server held each request 50 ms before its engine saw it (vLLM's API
    server: 157 ms): the idle TTFTs carry it, the stalls do not, so the prefill is priced by
    the stalls and the front latency is what the idle requests waited beyond it; ``sim
    --trace`` with the file waits it again."""
    runs = {}
    for c in (1, 4):
        reqs = requests(8 * c, seed=10 + c, prompts=(16, 200), outputs=(64, 160))
        runs[c] = write(tmp_path / f"c{c}", trace(reqs, c), TRUE, front=0.05)
    cost, report = fit([observe(runs[1]), observe(runs[4])])
    assert report["prefill_from"] == "decode stalls", report
    assert report["front_latency_s"] == pytest.approx(0.05, rel=0.05)
    assert cost.prefill(100, 1, 100) == pytest.approx(TRUE.prefill(100, 1, 100), rel=0.1)
    out = tmp_path / "cost.yaml"
    done = launch.run([sys.executable, "-m", "speclens", "calibrate", runs[1], runs[4], "-o",
                       out], timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    _, meta = read_cost_file(out)
    assert meta["front_latency_s"] == report["front_latency_s"]
    assert held_out_error(runs[1], cost, front=meta["front_latency_s"]) < 0.01
    assert held_out_error(runs[1], cost) > 0.05  # without it, every request comes out short
    done = launch.run([sys.executable, "-m", "speclens", "sim", "--trace", runs[1], "--step-cost",
                       out, "--output-dir", tmp_path / "sim1"], timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    ttfts = [json.loads(line)["ttft_s"] for line in (tmp_path / "sim1" / "records.jsonl").open()]
    observed = [json.loads(line)["ttft_s"] for line in (runs[1] / "records.jsonl").open()]
    assert ttfts == pytest.approx(observed, rel=0.05)


@pytest.mark.parametrize("value", ["-0.1", ".nan", ".inf", "'soon'", "true", "1.0e+9"])
def test_a_front_latency_that_is_not_seconds_is_refused(
    observed: dict[int, Path], tmp_path: Path, value: str
) -> None:
    out = tmp_path / "cost.yaml"
    document = {"kind": "StepCostFit", "step_cost": asdict(TRUE),
                "fit": {"front_latency_s": 0.0}, "provenance": {}}  # fmt: skip
    out.write_text(yaml.safe_dump(document).replace("front_latency_s: 0.0",
                                                    f"front_latency_s: {value}"))  # fmt: skip
    done = launch.run([sys.executable, "-m", "speclens", "sim", "--trace", observed[8],
                       "--step-cost", out], timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stdout
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"{out}: fit.front_latency_s: expected seconds from 0 to 60, got ")


class _DearLongPrompts(StepCost):
    """TRUE, but a prefill also costs the square of its prompt tokens (attention over a long
    prompt): no linear prefill price fits it."""

    def prefill(self, query_tokens: Any, requests: Any, context_tokens: Any) -> Any:
        return super().prefill(query_tokens, requests, context_tokens) + 2e-6 * query_tokens**2


def test_the_decode_terms_come_from_the_chunks_no_prefill_ran_in(tmp_path: Path) -> None:
    """Prefills priced beyond what a linear price can say (here quadratic in the prompt; on
    speclens serve, fitted beside the decode terms, they left a step 13% dear at batch 4 and
    8): the decode terms are fitted on the chunks no prefill ran in, so the prefill's misfit
    stays in the prefill prices, and a decode step is priced as the truth prices it."""
    dear = _DearLongPrompts(**asdict(TRUE))
    runs = []
    for c in (1, 4):
        reqs = requests(8 * c, seed=30 + c, prompts=(16, 600), outputs=(64, 160))
        runs.append(observe(write(tmp_path / f"c{c}", trace(reqs, c), dear)))
    cost, report = fit(runs)
    for width in (1, 4, 8):
        step = cost.verify(width, width, 300 * width)
        assert step == pytest.approx(TRUE.verify(width, width, 300 * width), rel=0.01), width
    assert report["decode_from"] == "40 requests' chunks no prefill ran in", report


def test_a_prompt_price_the_stalls_left_at_zero_comes_from_the_idle_ttfts(
    observed: dict[int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where every prefill a request decoded through was of one prompt, the stalls cannot tell
    a prompt token's price from the prefill step's, and the fit can hit the bound at 0 (seen
    on a real speclens serve run: the replay then priced a prefill of 8 prompts as one). A
    price at 0 is then taken from the idle TTFTs' slope, and the rest refitted around it."""
    import speclens.sim.calibrate as module

    refit = module._refit

    def clamped(xa: np.ndarray, ya: np.ndarray, held: dict[int, float]) -> list[float]:
        out = refit(xa, ya, held)
        if module.PROMPT not in held:  # the stall fit: its prompt-token price hits the bound
            out[module.PROMPT] = 0.0
        return out

    monkeypatch.setattr(module, "_refit", clamped)
    cost, report = fit([observe(observed[1]), observe(observed[4])])
    assert report["prefill_per_token_from"] == "idle TTFT slope"
    assert cost.prefill_per_token == pytest.approx(TRUE.prefill_per_token, rel=1e-6)
    assert cost.base == pytest.approx(TRUE.base, rel=0.05)
    assert cost.per_seq == pytest.approx(TRUE.per_seq, rel=0.05)
    monkeypatch.setattr(module, "_refit", refit)
    assert fit([observe(observed[1]), observe(observed[4])])[1]["prefill_per_token_from"] == (
        "decode stalls")  # fmt: skip


def test_stall_prices_above_the_idle_ttfts_give_way_to_them(
    observed: dict[int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle request's TTFT held its prefill and nothing else. Where the stalls price a
    prefill above most of those TTFTs (seen on llama.cpp with 16 requests at concurrency 4:
    546 ms a prefill step against idle TTFTs of 0.1 to 0.5 s), the price is the fit's slack:
    the idle prices are taken, and the decode terms (from the chunks no prefill ran in) stay
    the truth's."""
    import speclens.sim.calibrate as module

    refit = module._refit

    def stalls(step: float, token: float) -> Callable[..., list[float]]:
        def solved(xa: np.ndarray, ya: np.ndarray, held: dict[int, float]) -> list[float]:
            out = refit(xa, ya, held)
            if module.PREFILL not in held:  # the stall fit: a prefill at these prices
                out[module.PROMPT], out[module.PREFILL] = token, step
            return out

        return solved

    runs = [observe(observed[1]), observe(observed[4])]
    monkeypatch.setattr(module, "_refit", stalls(0.5, TRUE.prefill_per_token))
    cost, report = fit(runs)
    assert report["prefill_from"] == STALLS_ABOVE_IDLE
    assert (cost.prefill_base, cost.prefill_per_token) == pytest.approx(
        (TRUE.prefill_base, TRUE.prefill_per_token), rel=1e-6
    )
    assert cost.base == pytest.approx(TRUE.base, rel=0.05)
    assert cost.per_seq == pytest.approx(TRUE.per_seq, rel=0.05)
    # Below the idle TTFTs, the stall prices stand.
    half = (TRUE.prefill_base / 2, TRUE.prefill_per_token / 2)
    monkeypatch.setattr(module, "_refit", stalls(*half))
    cost, report = fit(runs)
    assert report["prefill_from"] == "decode stalls"
    assert (cost.prefill_base, cost.prefill_per_token) == pytest.approx(half)


def test_a_prefill_is_fitted_on_the_prompt_tokens_it_computed(tmp_path: Path) -> None:
    """Runs whose prompts came mostly from the server's prefix cache (``cached_tokens``): an
    idle TTFT is the prefill of the tokens computed, and the fit recovers its true price from
    them (taken as whole prompts, the slope is off several times over). The stall prices are
    not checked here: a prefill of a few tokens is too small beside these decode steps for the
    stalls to price it apart."""
    runs = []
    for c in (1, 4):
        reqs = [replace(r, cached=r.input_tokens - max(4, r.input_tokens // 5))
                for r in requests(8 * c, seed=20 + c, prompts=(40, 400), outputs=(64, 160))]  # fmt: skip
        runs.append(write(tmp_path / f"c{c}", trace(reqs, c), TRUE))
    rows = [json.loads(line) for line in (runs[1] / "records.jsonl").read_text().splitlines()]
    assert all(r["cached_tokens"] and r["cached_tokens"] < r["prompt_tokens"] for r in rows)
    _, report = fit([observe(run) for run in runs])
    idle = report["idle_prefill"]  # exact here: an idle TTFT is the prefill of what it computed
    assert (idle["base"], idle["per_token"]) == pytest.approx(
        (TRUE.prefill_base, TRUE.prefill_per_token), rel=1e-6
    )


def test_a_calibrated_cost_predicts_a_held_out_run(observed: dict[int, Path]) -> None:
    """Fit on concurrency 1 and 4, replay the concurrency-8 trace: per-request E2E within 3%."""
    cost, _ = fit([observe(observed[1]), observe(observed[4])])
    error = held_out_error(observed[8], cost)
    assert error < 0.03, error


def test_one_load_point_is_refused_not_fitted(observed: dict[int, Path]) -> None:
    with pytest.raises(CalibrationError, match="one load point only"):
        fit([observe(observed[4]), observe(observed[4])])


def test_the_cli_writes_a_cost_file_sim_replays_with(
    observed: dict[int, Path], tmp_path: Path
) -> None:
    out = tmp_path / "cost.yaml"
    done = launch.run([sys.executable, "-m", "speclens", "calibrate", observed[1], observed[4],
                       "-o", out], timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout and "decode steps" in done.stdout
    document = yaml.safe_load(out.read_text())
    assert document["kind"] == "StepCostFit" and document["provenance"]["model"] == "dummy"
    assert document["provenance"]["runs"] == [str(observed[1]), str(observed[4])]
    cost, meta = read_cost_file(out)
    assert asdict(cost) == document["step_cost"] and meta["fit"]["batch_widths"] == [1, 4]
    sim8 = tmp_path / "sim8"
    done = launch.run([sys.executable, "-m", "speclens", "sim", "--trace", observed[8],
                       "--step-cost", out, "--output-dir", sim8], timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "outside them it extrapolates" in done.stderr  # fitted on 1..4, replayed at 8
    observed_rows = (observed[8] / "records.jsonl").read_text().splitlines()
    replayed_rows = (sim8 / "records.jsonl").read_text().splitlines()
    assert sorted(json.loads(r)["index"] for r in replayed_rows) == sorted(
        json.loads(r)["index"] for r in observed_rows
    )
    summary = json.loads((sim8 / "summary.json").read_text())
    assert (
        summary["settings"]["trace"] == str(observed[8])
        and summary["settings"]["executor"] == "sim"
    )


def test_a_single_run_is_refused_in_one_line(observed: dict[int, Path], tmp_path: Path) -> None:
    done = launch.run([sys.executable, "-m", "speclens", "calibrate", observed[4], "-o",
                       tmp_path / "cost.yaml"], timeout=120)  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "calibrate: runs at one load point only (concurrency 4): the per-request cost cannot be "
        "told from the base; add a run at another concurrency or rate"
    ]
    assert not (tmp_path / "cost.yaml").exists()


def test_a_cost_file_for_another_model_is_refused(
    observed: dict[int, Path], tmp_path: Path
) -> None:
    out = tmp_path / "cost.yaml"
    document = {"kind": "StepCostFit", "step_cost": asdict(TRUE), "fit": {},
                "provenance": {"model": "llama-3.1-8b"}}  # fmt: skip
    out.write_text(yaml.safe_dump(document))
    done = launch.run([sys.executable, "-m", "speclens", "sim", "--trace", observed[8],
                       "--step-cost", out], timeout=120)  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"{out}: provenance.model: fitted on 'llama-3.1-8b', but the trace {observed[8]} ran "
        "'dummy': a cost file prices one model"
    ]


def test_a_trace_without_a_cost_is_a_usage_error(observed: dict[int, Path]) -> None:
    done = launch.run(
        [sys.executable, "-m", "speclens", "sim", "--trace", observed[8]], timeout=120
    )
    assert done.returncode == 2 and "--trace needs --step-cost" in done.stderr


def test_serve_takes_a_calibrated_cost_file(observed: dict[int, Path], tmp_path: Path) -> None:
    """``serve --executor sim --step-cost FILE`` prices its steps with calibrate's output; a file
    that is not a cost is refused naming the file and the field (exit 2)."""
    import typer

    from speclens.cli.serve import _step_cost

    out = tmp_path / "cost.yaml"
    cost, _ = fit([observe(observed[1]), observe(observed[4])])
    out.write_text(yaml.safe_dump({"kind": "StepCostFit", "step_cost": asdict(cost), "fit": {},
                                   "provenance": {}}))  # fmt: skip
    assert _step_cost(str(out), StepCost) == cost
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"kind": "StepCostFit", "step_cost": {"base": -1}}))
    with pytest.raises(typer.Exit) as caught:
        _step_cost(str(bad), StepCost)
    assert caught.value.exit_code == 2


def test_a_trace_of_bad_lines_reports_the_first_ten_and_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading stops at the tenth problem: a file of bad lines costs ten parses, not one a line."""
    import speclens.runs.trace as trace_module

    parsed = []
    loads = trace_module.orjson.loads
    monkeypatch.setattr(trace_module.orjson, "loads", lambda b: parsed.append(b) or loads(b))
    path = tmp_path / "trace.jsonl"
    path.write_text("{not json\n" * 100_000)
    with pytest.raises(TraceError) as caught:
        read_trace(path)
    assert len(parsed) == 10
    assert len(caught.value.lines) == 10
    assert caught.value.lines[-1] == f"{path}: line 10: not JSON"


@pytest.mark.parametrize("field", ["input_length", "output_length"])
def test_a_length_no_request_has_is_refused_before_anything_is_built(
    tmp_path: Path, field: str
) -> None:
    """A billion-token request would be a billion words of filler for bench and a billion decode
    steps of arrays for the replay: refused when the trace is read."""
    row = {"timestamp": 0, "input_length": 10, "output_length": 10, field: 10**9}
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(TraceError) as caught:
        read_trace(path)
    assert caught.value.lines == [
        f"{path}: line 1: {field}: expected a token count >= 1 and at most 1,048,576, "
        "got 1000000000"
    ]


# --- a roofline's efficiencies ----------------------------------------------------------------


def _host_chip() -> ChipSpec:
    """A chip like a 2-core CPU: 0.4 TFLOP/s and 26 GB/s, so a step turns compute-bound at a
    few tokens (what makes both efficiencies visible at concurrency 1 and 4)."""
    return ChipSpec(name="cpu", source="test", tflops={"bf16": 0.4}, memory_gb=64,
                    memory_bandwidth_tbps=0.026, interconnect_gbps=13)  # fmt: skip


#: The roofline that priced the observed runs: SmolLM2 on the CPU-like chip.
TRUE_ROOF = Roofline(catalog.model("smollm2-135m"), _host_chip(),
                     efficiency=Efficiency(compute=0.2, memory=0.6, overhead=0.003,
                                           per_sequence=0.001))  # fmt: skip


@pytest.fixture(scope="module")
def roofed(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("roofed")
    reqs = {
        c: requests(8 * c, seed=20 + c, prompts=(16, 200), outputs=(64, 160)) for c in (1, 4, 8)
    }
    return {c: write(root / f"c{c}", trace(reqs[c], c), TRUE_ROOF) for c in (1, 4, 8)}


def test_calibration_recovers_the_roofline_that_priced_the_steps(roofed: dict[int, Path]) -> None:
    """From concurrency 1 (memory-bound steps) and 4 (compute-bound): each request's decode
    time within 3%, and both efficiencies within 20% of the truth (the fit's own model of a
    request's steps, batches of its mean width, is not the replay's step for step, and the
    overheads per step and per sequence trade off against the efficiencies at these widths,
    so the parameters are not recovered one by one). The fit then predicts concurrency 8,
    which it never saw, within 5%."""
    guess = Roofline(TRUE_ROOF.model, TRUE_ROOF.chip)
    fitted, report = fit_roofline([observe(roofed[1]), observe(roofed[4])], guess)
    e = fitted.efficiency
    assert e.memory == pytest.approx(0.6, rel=0.2)
    assert e.compute == pytest.approx(0.2, rel=0.2)
    assert report["decode_time_error_median"] < 0.03 and report["at_the_grid_edge"] == []
    assert report["misfit"] is None, report
    error = held_out_error(roofed[8], fitted)
    assert error < 0.05, error


#: A step like llama.cpp's on this machine (its linear fit on the peer tier's runs): 3 ms and
#: 113 us a context token, a prefill 16 ms and 3 ms a prompt token. No roofline of SmolLM2 on
#: a chip prices a context token so dear without pricing the weights' read far dearer.
LLAMA_LIKE = StepCost(base=0.003, per_token=0.0, per_seq=0.0, per_context_token=1.13e-4,
                      draft_base=0.0, draft_per_token=0.0, prefill_base=0.016,
                      prefill_per_token=0.003)  # fmt: skip


def test_a_roofline_that_does_not_describe_the_runs_says_so(tmp_path: Path) -> None:
    """Runs of an engine that is not what the model and chip entries say (here a step that
    grows with context as llama.cpp's Q4_1 CPU kernels did): the roofline fits them far worse
    than the linear cost, and the fit says so, so that nobody replays with it unwarned."""
    runs = {}
    for c in (1, 4):
        reqs = requests(8 * c, seed=40 + c, prompts=(16, 200), outputs=(64, 160))
        runs[c] = write(tmp_path / f"c{c}", trace(reqs, c), LLAMA_LIKE)
    chip, out = tmp_path / "cpu.yaml", tmp_path / "roofline.yaml"
    chip.write_text(yaml.safe_dump({"kind": "Chip", **_host_chip().model_dump(exclude_none=True)}))
    done = launch.run([sys.executable, "-m", "speclens", "calibrate", runs[1], runs[4],
                       "--model", "smollm2-135m", "--hardware", chip, "-o", out],
                      timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = yaml.safe_load(out.read_text())["fit"]
    linear = report["linear_decode_time_error_median"]
    assert linear == fit([observe(runs[1]), observe(runs[4])])[1]["decode_time_error_median"]
    assert linear < 0.05 and report["decode_time_error_median"] > 3 * linear, report
    said = " ".join(done.stdout.split())  # as the terminal's width wrapped it
    assert f"note: {report['misfit']}" in said, done.stdout
    assert report["misfit"].startswith("the roofline describes these runs worse than the linear")
    done = launch.run([sys.executable, "-m", "speclens", "sim", "--trace", runs[4],
                       "--step-cost", out, "--output-dir", tmp_path / "sim4"], timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "the roofline describes these runs worse" in " ".join(done.stderr.split())


def test_the_cli_fits_a_roofline_and_sim_replays_with_it(
    roofed: dict[int, Path], tmp_path: Path
) -> None:
    chip = tmp_path / "cpu.yaml"
    chip.write_text(yaml.safe_dump({"kind": "Chip", **_host_chip().model_dump(exclude_none=True)}))
    out = tmp_path / "roofline.yaml"
    done = launch.run([sys.executable, "-m", "speclens", "calibrate", roofed[1], roofed[4],
                       "--model", "smollm2-135m", "--hardware", chip, "-o", out],
                      timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "roofline of smollm2-135m on 1 x cpu: compute efficiency" in done.stdout
    assert "the roofline describes these runs worse" not in done.stdout + done.stderr
    document = yaml.safe_load(out.read_text())
    assert document["roofline"]["model"]["name"] == "smollm2-135m"
    assert document["roofline"]["chip"]["memory_bandwidth_tbps"] == 0.026  # stands alone
    cost, meta = read_cost_file(out)
    assert isinstance(cost, Roofline) and meta["fit"]["method"].startswith("roofline")
    done = launch.run([sys.executable, "-m", "speclens", "sim", "--trace", roofed[8],
                       "--step-cost", out, "--output-dir", tmp_path / "sim8"], timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    half = launch.run([sys.executable, "-m", "speclens", "calibrate", roofed[1], roofed[4],
                       "--model", "smollm2-135m", "-o", out], timeout=120)  # fmt: skip
    assert half.returncode == 2
    assert "--model and --hardware go together" in half.stderr


def test_host_measures_this_machine_as_a_chip_entry(tmp_path: Path) -> None:
    out = tmp_path / "host.yaml"
    done = launch.run([sys.executable, "-m", "speclens", "calibrate", "--host", "-o", out],
                      timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    chip = catalog.read_chip(out)
    assert chip.source == "measured" and chip.memory_bandwidth_tbps > 1e-4
    curve = chip.measured["matmul_tflops_by_tokens"]["bf16"]  # type: ignore[index]
    assert set(curve) == {"1", "4", "16", "64", "256"}
    assert chip.tflops["bf16"] == max(curve.values())
    # A CPU's matmul reaches its peak only at the widest batches: the curve rises.
    assert curve["256"] > 2 * curve["1"]


def test_a_roofline_pinned_at_full_efficiency_and_worse_than_linear_is_a_misfit() -> None:
    """llama.cpp on the peer tier: the linear fit's error 15.6%, so the 1.3x + 3 points bar is
    23.3%, and the roofline's error swung around it over runs (25.8% in one). Its memory
    efficiency sat at 100% (the runs went faster than a bf16 SmolLM2's bytes allow): with that,
    a roofline worse than the linear fit does not describe the engine, under the bar too. At
    100% and better than the linear fit, or worse within the bar and below 100%, it stands."""
    said = _misfit(0.22, 0.156, ["memory"])
    assert said is not None and "memory efficiency at 100%" in said and "22.0%" in said
    assert _misfit(0.22, 0.156, []) is None
    assert _misfit(0.14, 0.156, ["memory"]) is None
    over = _misfit(0.258, 0.156, [])  # over the bar, wherever the efficiencies are
    assert over is not None and "100%" not in over
