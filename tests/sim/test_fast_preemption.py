"""The fast path under a KV cache that fills: admission waits for room and a decode step that
needs more blocks than the cache holds preempts the last admitted requests, as the engine's
scheduler does. Without speculation nothing is drawn, so both loops must give the same figures;
with it they agree in distribution."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
from test_fast import EXAMPLE, METRICS, _get

from speclens.acceptance import minimum_variance_rates
from speclens.sim import limits
from speclens.sim import simulate as simulate_module
from speclens.sim.scenario import Scenario
from speclens.sim.simulate import simulate

FIGURES = [("makespan_s",), ("preemptions",)] + [
    ("latency_ms", m, q) for m in ("ttft", "tpot", "itl", "e2e") for q in ("mean", "p50", "p99")
]


def _filling(variant: str) -> Scenario:
    """No speculation, 16 sequences, a cache of 3,000 tokens: 16 requests of up to 1,280 tokens
    need up to 20,480, so it fills again and again."""
    data = copy.deepcopy(EXAMPLE)
    pool, workload = data["deployment"]["pools"][0], data["workload"]
    pool["engine"] = {"max_num_seqs": 16, "kv_cache_tokens": 3000, "max_model_len": 1600}
    workload.update(requests=60, output_tokens={"min": 64, "max": 256})
    if variant == "open-loop":
        del workload["concurrency"]
        workload.update(rate=9.0, burstiness=0.5)
        pool["step_cost"].update(prefill_base=0.004, prefill_per_token=1e-5)
    if variant == "all-at-once":  # one-token requests finish at their prefill
        del workload["concurrency"]
        workload.update(output_tokens={"min": 1, "max": 128})
    return Scenario.model_validate(data)


@pytest.mark.parametrize("variant", ["closed-loop", "open-loop", "all-at-once"])
def test_without_speculation_both_loops_preempt_the_same_requests(
    tmp_path: Path, variant: str
) -> None:
    """Nothing is drawn without speculation, so the fast path's schedule must be the engine's
    step for step: the same preemptions, makespan and every latency figure."""
    scenario = _filling(variant)
    exact = simulate(scenario, tmp_path, None, seed=3)
    fast = simulate(scenario, tmp_path, None, seed=3, fast=True)
    assert (fast["loop"], fast["fallback"], exact["loop"]) == ("fast", None, "exact")
    assert exact["preemptions"] >= 5
    for path in FIGURES:
        assert _get(fast, path) == pytest.approx(_get(exact, path), rel=1e-9), path


def test_speculating_under_a_filling_cache_the_loops_agree_in_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """K 7 at AL 3.78, 32 concurrent requests in a cache of 20,000 tokens (they need up to
    49,664): the step-exact run lies within 4 standard deviations of 12 fast runs' mean in every
    figure, preemptions included, and its means within 1% (as
    test_fast.test_fast_path_matches_the_step_exact_loop holds them)."""
    data = copy.deepcopy(EXAMPLE)
    data["deployment"]["pools"][0]["engine"].update(kv_cache_tokens=20_000, max_model_len=1600)
    scenario, rates = Scenario.model_validate(data), minimum_variance_rates(3.78, 7)
    exact = simulate(scenario, tmp_path, rates, seed=7)
    fast = []
    for stream in range(12):
        monkeypatch.setattr(simulate_module, "FAST_STREAM", 0xFA57 + stream)
        fast.append(simulate(scenario, tmp_path, rates, seed=7, fast=True))
    assert {r["loop"] for r in fast} == {"fast"} and exact["preemptions"] > 100
    for path in [*METRICS, ("preemptions",)]:
        want = _get(exact, path)
        got = np.array([_get(r, path) for r in fast], dtype=float)
        band = max(4 * got.std(ddof=1) * math.sqrt(1 + 1 / got.size), 1e-3 * abs(want))
        assert abs(got.mean() - want) <= band, (path, got.mean(), want, band)
        if path[-1] in ("mean", "makespan_s", "realized_acceptance_length") and "ttft" not in path:
            assert abs(got.mean() / want - 1) < 0.01, (path, got.mean(), want)


def test_prompt_tokens_are_bounded_only_where_every_request_is_kept() -> None:
    """A million requests of 1,024 prompt tokens: the fast path keeps a prompt as its length,
    so only a run that keeps requests whole (the step-exact loop, or records) is refused."""
    data = copy.deepcopy(EXAMPLE)
    data["workload"].update(requests=1_000_000, input_tokens=1024)
    scenario = Scenario.model_validate(data)
    kept = limits.problems(scenario, "s.yaml", max_request_steps=10**12)
    assert [p.path for p in kept] == ["workload.input_tokens"]
    assert "1,024,000,000 prompt tokens, over the limit of 200,000,000" in kept[0].message
    assert limits.problems(scenario, "s.yaml", max_request_steps=10**12, keeps_requests=False) == []


def test_a_step_that_needs_two_victims_queues_them_in_admission_order() -> None:
    """Three running requests need 4 blocks each at the step, the cache holds 5: the scheduler
    preempts the last admitted, then the one before (the first fits alone), and each goes to
    the queue's front, so they wait in admission order; their steps leave the windows."""
    from collections import deque

    from speclens.sim.fast import _Live, _preempt
    from speclens.sim.sketch import Tally

    class _Counted:
        histogram = np.zeros(1, dtype=np.int64)
        request_steps = drafting_steps = 0

    width = 8
    seqs, contexts, drafting, need = (np.zeros(width, dtype=np.int64) for _ in range(4))
    windows = (seqs, contexts, drafting, need, np.zeros((width, 2), dtype=np.int64))
    live: dict[int, _Live] = {}
    for index in (10, 11, 12):  # admitted in this order, each one step ago with 3 steps to go
        steps = 4
        emitted, drafted = np.ones(steps, dtype=np.int64), np.zeros(steps, dtype=bool)
        context = 40 + np.arange(steps)  # 40 prompt tokens and its first output token on
        item = (index, 0.0, 40, 5, emitted, context, drafted, np.zeros(steps, dtype=np.int64))
        r = _Live(0.0, 5, 0.0, 1, start=0, item=item, blocks=np.full(steps, 4), ticket=index)
        live[index] = r
        seqs[:steps] += 1
        contexts[:steps] += context
        need[:steps] += 4
    waiting: deque[tuple[object, ...]] = deque()
    freed = _preempt(live, {}, waiting, [], 1, 5, 0, _Counted(), windows, 0, 1.0,  # type: ignore[arg-type]
                     set(), Tally())  # fmt: skip
    assert list(live) == [10] and [w[0] for w in waiting] == [11, 12]
    assert freed == 8  # each held 4 blocks from its step before
    assert seqs[:5].tolist() == [3, 1, 1, 1, 0] and need[1] == 4
    assert [w[2] for w in waiting] == [41, 41]  # recomputed: the prompt and its output so far
