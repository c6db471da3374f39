"""Calibrate and replay on runs of an engine that counts its decode steps (``num_decode_steps``)
and whose n-gram drafts overshoot ``max_tokens``: a request whose output loops ends on a verify
step that accepted K drafts, of which ``max_tokens`` kept fewer. Counted from its tokens
(completion - 1 - accepted) such a request ran up to K steps more than it seems to.

The runs here are not the simulator's: ``engine_run`` is a closed loop written out below, step
by step (a prefill step for the requests that arrived, else one decode step of every running
request, each priced by a known ``StepCost``), so the fit and the replay are checked against
timings neither of them produced. The fit must price a step as the engine did (base, per
request and per context token, none at 0), and the replay of a held-out run at concurrency 8
must run each request's steps as the engine ran them and land on its timings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from speclens.cost import StepCost
from speclens.runs.report import RecordStream
from speclens.runs.request import RequestRecord
from speclens.runs.trace import Trace, TraceRequest, read_trace
from speclens.sim import run_output
from speclens.sim.calibrate import fit, observe
from speclens.sim.replay import replay, settings

K = 4
COMPLETION = 64
#: A CPU engine's step: dearer with every request and every context token in the batch.
TRUE = StepCost(base=0.030, per_token=0.0, per_seq=0.006, per_context_token=4e-6,
                draft_base=0.0, draft_per_token=0.0, prefill_base=0.02,
                prefill_per_token=2e-5)  # fmt: skip


def plan(rng: np.random.Generator, prompt: int) -> list[int]:
    """One request's decode steps, as the drafts each accepted (-1: it drafted nothing), the
    engine's order: a longer prompt gives the n-gram more to match, so more steps accept all K;
    the last step accepted K and ``max_tokens`` cut ``cut`` of them (0 to K - 1)."""
    full = 0.1 + 0.7 * prompt / 900
    weights = np.array([0.5, 0.2, 0.1, 0.1, 0.1, 0.0]) * (1 - full) + np.eye(6)[5] * full
    cut = int(rng.integers(0, K))
    left = COMPLETION - 1 - (1 + K - cut)
    steps = []
    while left > 0:
        accepted = min(int(rng.choice(np.arange(-1, K + 1), p=weights)), left - 1)
        steps.append(accepted)
        left -= 1 + max(accepted, 0)
    return [*steps, K]


class _Running:
    def __init__(self, index: int, start: float, prompt: int, steps: list[int]) -> None:
        self.index, self.start, self.prompt, self.steps = index, start, prompt, steps
        self.first: float | None = None
        self.tokens, self.done = 0, 0
        self.last = 0.0
        self.itl: list[tuple[float, int]] = []

    def emits(self) -> int:
        """The tokens its next step emits: 1 plus its accepted drafts, up to ``max_tokens``."""
        return min(1 + max(self.steps[self.done], 0), COMPLETION - self.tokens)


def engine_run(out: Path, prompts: list[int], concurrency: int, seed: int) -> Path:
    """A closed loop at ``concurrency`` against an engine priced by ``TRUE``: a step prefills
    every request that arrived (all of them in one step), else decodes every running request
    one step; a request that finishes is replaced at once. Written as bench writes a run."""
    rng = np.random.default_rng(seed)
    plans = [plan(rng, p) for p in prompts]
    pending = list(range(len(prompts)))
    waiting = [_Running(i, 0.0, prompts[i], plans[i]) for i in pending[:concurrency]]
    del pending[:concurrency]
    running: list[_Running] = []
    finished: list[_Running] = []
    clock = 0.0
    while waiting or running:
        if waiting:
            clock += TRUE.prefill(sum(r.prompt for r in waiting), len(waiting), 0)
            for r in waiting:
                r.first, r.last, r.tokens = clock, clock, 1
            running += waiting
            waiting = []
            continue
        context = sum(r.prompt + r.tokens for r in running)
        clock += TRUE.verify(len(running), len(running), context)
        for r in list(running):
            n = r.emits()
            r.itl.append(((clock - r.last) / n, n))
            r.tokens, r.done, r.last = r.tokens + n, r.done + 1, clock
            if r.tokens == COMPLETION:
                running.remove(r)
                finished.append(r)
                if pending:
                    i = pending.pop(0)
                    waiting.append(_Running(i, clock, prompts[i], plans[i]))
    records = [_record(r) for r in sorted(finished, key=lambda r: r.index)]
    requests = [TraceRequest(r.index, r.start, r.prompt_tokens or 0, COMPLETION, "engine")
                for r in records]  # fmt: skip
    trace = Trace(out, "run", requests, concurrency, K, "dummy",
                  {"model": "dummy", "max_tokens": COMPLETION, "ignore_eos": True,
                   "temperature": 0.0, "concurrency": concurrency})  # fmt: skip
    server = {"engine": "speclens", "version": "test", "model": "dummy",
              "acceptance": {"num_speculative_tokens": K, "forced": False}}  # fmt: skip
    summary = run_output.summary(records, clock, settings(trace, None, seed, K), server, {})
    run_output.write_run(RecordStream(out), summary, records)
    return out


def _record(r: _Running) -> RequestRecord:
    accepted = np.array([max(a, 0) for a in r.steps])
    drafting = np.array([a >= 0 for a in r.steps])
    assert r.first is not None
    return RequestRecord(index=r.index, category="engine", replica="engine", start=r.start,
                         end=r.last, ttft=r.first - r.start, itl_runs=r.itl,
                         prompt_tokens=r.prompt, completion_tokens=COMPLETION,
                         finish_reason="length", status=200,
                         spec=run_output.spec_record(K, drafting, accepted), spec_status="ok",
                         spec_adapter="engine")  # fmt: skip


def histogram(spec: dict[str, Any]) -> dict[int, int]:
    return {int(j): n for j, n in spec["acceptance_histogram"].items() if n}


def rows(run: Path) -> dict[int, dict[str, Any]]:
    lines = (run / "records.jsonl").read_text().splitlines()
    return {row["index"]: row for row in map(json.loads, lines)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Concurrency 1 (12 requests), 4 (24) and 8 (32), Spec-Bench-like prompts of 10 to 900
    tokens, 64 tokens out: replay.py's runs."""
    root = tmp_path_factory.mktemp("engine")
    rng = np.random.default_rng(24)
    return {c: engine_run(root / f"c{c}", rng.integers(10, 900, n).tolist(), c, seed=c)
            for c, n in ((1, 12), (4, 24), (8, 32))}  # fmt: skip


def test_the_runs_overshoot_as_an_ngram_engine_does(runs: dict[int, Path]) -> None:
    """The premise: the engine ran more steps than the tokens count, by up to K a request."""
    for run in runs.values():
        short = [row["spec_decode_acceptance"]["num_decode_steps"]
                 - (row["completion_tokens"] - 1
                    - row["spec_decode_acceptance"]["num_accepted_draft_tokens"])
                 for row in rows(run).values()]  # fmt: skip
        assert min(short) >= 0 and max(short) <= K - 1 and sum(short) >= len(short), short


def test_the_fit_prices_a_step_as_the_engine_did(runs: dict[int, Path]) -> None:
    """Each request's decode steps as the server counted them: the fit finds the price per
    request and per context token (not 0) and the base, as the engine priced its steps."""
    cost, report = fit([observe(runs[1]), observe(runs[4])])
    steps = sum(row["spec_decode_acceptance"]["num_decode_steps"]
                for c in (1, 4) for row in rows(runs[c]).values())  # fmt: skip
    assert report["decode_steps"] == steps
    assert cost.base == pytest.approx(TRUE.base, rel=0.05)
    assert cost.per_seq == pytest.approx(TRUE.per_seq, rel=0.1)
    assert cost.per_context_token == pytest.approx(TRUE.per_context_token, rel=0.1)
    for width in (1, 4, 8):
        step = cost.verify(width, width, 600 * width)
        assert step == pytest.approx(TRUE.verify(width, width, 600 * width), rel=0.02), width


def test_a_replay_runs_each_request_s_steps_as_the_engine_ran_them(
    runs: dict[int, Path], tmp_path: Path
) -> None:
    """Every verify step the engine ran, and its steps that drafted nothing, and the last step
    cut by ``max_tokens``: the replay's step counts and histograms are the engine's."""
    replayed = replay(read_trace(runs[8]), TRUE, K, 256, 8192, seed=3)
    observed = rows(runs[8])
    for record in replayed.records:
        theirs, ours = observed[record.index]["spec_decode_acceptance"], record.spec
        assert ours is not None
        for key in ("num_decode_steps", "num_spec_steps"):
            assert ours[key] == theirs[key], (record.index, key)
        assert histogram(ours) == histogram(theirs), record.index
        assert record.completion_tokens == COMPLETION


def test_a_fit_at_concurrency_1_and_4_predicts_a_run_at_8(runs: dict[int, Path]) -> None:
    """replay.py's flow on the engine's runs: fitted on c1 and c4, the c8 replay's median E2E
    error within 3% and its makespan within 2.5%: the truth is linear, and the replay's own
    floor (each request's steps in a seeded order, not the engine's) is 2% and 1.3% with the
    true prices."""
    cost, _ = fit([observe(runs[1]), observe(runs[4])])
    replayed = replay(read_trace(runs[8]), cost, K, 256, 8192, seed=5)
    observed = rows(runs[8])
    errors = [abs(r.latency - observed[r.index]["latency_s"]) / observed[r.index]["latency_s"]
              for r in replayed.records]  # fmt: skip
    assert float(np.median(errors)) < 0.03, float(np.median(errors))
    makespan = max(row["start_s"] + row["latency_s"] for row in observed.values())
    assert replayed.makespan == pytest.approx(makespan, rel=0.025)
