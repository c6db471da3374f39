"""The event-level fast path against the step-exact loop, the latency sketch against numpy, and
the command's path choice and parallel sweeps."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from speclens.acceptance import minimum_variance_rates
from speclens.cost import StepCost
from speclens.sim import simulate as simulate_module
from speclens.sim.fast import run_replica
from speclens.sim.scenario import Scenario
from speclens.sim.simulate import simulate
from speclens.sim.sketch import RESOLUTION, Sketch, Tally, Totals

EXAMPLE = {
    "model": "kimi-k3",
    "deployment": {"pools": [{"engine": {"speculative": {"method": "dspark", "num_spec_tokens": 7},
                                         "max_num_seqs": 64},
                              "step_cost": {"base": 0.012, "per_token": 2e-5, "per_seq": 5e-5,
                                            "per_context_token": 1e-8, "draft_base": 8e-4,
                                            "draft_per_token": 4e-6}}]},
    "workload": {"input_tokens": {"min": 256, "max": 1024}, "output_tokens": {"min": 128, "max": 512},
                 "concurrency": 32, "requests": 400},
}  # fmt: skip


def _variant(name: str) -> tuple[dict, float]:
    data = copy.deepcopy(EXAMPLE)
    pool, workload = data["deployment"]["pools"][0], data["workload"]
    if name == "open-loop":  # gamma arrivals near capacity, 2 replicas, prefill priced apart
        del workload["concurrency"]
        workload.update(rate=9.0, burstiness=0.5, requests=500)
        pool.update(replicas=2)
        pool["engine"]["max_num_seqs"] = 16
        pool["step_cost"].update(prefill_base=0.004, prefill_per_token=1e-5)
        return data, 0.5
    if name == "all-at-once":  # no speculation, every request queued at 0, 8 sequences
        del workload["concurrency"]
        workload.update(requests=120, output_tokens={"min": 1, "max": 200})
        pool["engine"] = {"max_num_seqs": 8}
    return data, 1.0


METRICS = [("makespan_s",), ("realized_acceptance_length",), ("tokens_per_step",)] + [
    ("latency_ms", m, q) for m in ("ttft", "tpot", "itl", "e2e") for q in ("mean", "p50", "p90")
]


def _get(result: dict, path: tuple[str, ...]) -> float | None:
    for key in path:
        if result is None:
            return None
        result = result[key]
    return result  # type: ignore[return-value]


@pytest.mark.parametrize("name", ["closed-loop", "open-loop", "all-at-once"])
def test_fast_path_matches_the_step_exact_loop(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same scenario and seed (the same arrivals and lengths), both paths. Their acceptance
    and coverage draws come from different streams, so they agree in distribution: the exact
    run must lie within 4 standard deviations of the mean of 12 fast runs (12 streams of the
    fast path's draws), the deviation scaled by sqrt(1 + 1/12) for the mean's own error (false
    alarm about 6e-5 per figure if the paths agree); the band is at least 0.1% (figures that do
    not vary with the draws, like the first prefill's TTFT). And the band is narrow: AL,
    makespan, tokens per step and the TPOT, ITL and E2E means are within 1% of the exact run
    (TTFT is a queueing delay: at this size its spread over draws is a few percent, which the
    band allows; benchmarks/sim.py compares it at 100,000 requests)."""
    data, coverage = _variant(name)
    scenario = Scenario.model_validate(data)
    rates = minimum_variance_rates(3.78, 7)
    exact = simulate(scenario, tmp_path, rates, seed=7, draft_coverage=coverage)
    fast = []
    for stream in range(12):
        monkeypatch.setattr(simulate_module, "FAST_STREAM", 0xFA57 + stream)
        fast.append(simulate(scenario, tmp_path, rates, seed=7, draft_coverage=coverage, fast=True))
    assert exact["loop"] == "exact" and exact["fallback"] is None
    assert {r["loop"] for r in fast} == {"fast"} and fast[0]["fallback"] is None
    assert fast[0]["pools"].keys() == exact["pools"].keys()
    assert fast[0]["pools"]["0"]["requests"] == exact["pools"]["0"]["requests"]
    checked = 0
    for path in METRICS:
        want = _get(exact, path)
        if want is None:  # no speculation: no AL
            assert all(_get(r, path) is None for r in fast), path
            continue
        got = np.array([_get(r, path) for r in fast])
        band = max(4 * got.std(ddof=1) * math.sqrt(1 + 1 / got.size), 1e-3 * abs(want))
        assert abs(got.mean() - want) <= band, (path, got.mean(), want, band)
        if path[-1] not in ("p50", "p90") and "ttft" not in path:
            assert abs(got.mean() / want - 1) < 0.01, (path, got.mean(), want)
        checked += 1
    assert checked >= 12
    if coverage < 1:  # each decode request-step drafts with probability `coverage`
        for run in (fast[0], exact):
            se = math.sqrt(coverage * (1 - coverage) / run["decode_request_steps"])
            assert abs(run["draft_coverage"] - coverage) < 4 * se, (run["draft_coverage"], se)


@pytest.mark.parametrize("coverage", [0.3, 0.8])
def test_a_decode_step_without_drafts_pays_no_drafter(coverage: float) -> None:
    """One request at a time (each decode step holds one request), most steps drafting
    nothing: the clock is exactly the sum of each step's price, so the makespan is
    prefills x prefill_base + request-steps x (base + per_token + per_seq) + drafting steps x
    K x (draft_base + per_token + draft_per_token), with the counts the run reports.

    Kills the mutation: ``sim/fast.py`` charging the drafter's fixed price (K x draft_base)
    on every decode step when coverage < 1 (``np.ones_like(drafting[window])`` for
    ``drafting[window]`` in ``run_replica``'s prices), which a run of 16 concurrent sequences
    hides because nearly every step then has a request that drafts."""
    k = 7
    cost = StepCost(base=1e-3, per_token=2e-5, per_seq=3e-5, per_context_token=0.0,
                    draft_base=0.1, draft_per_token=4e-6, prefill_base=0.5,
                    prefill_per_token=0.0)  # fmt: skip
    tally, pooled = Tally(), Totals()
    requests = [(i, 0.0, 16, 40 + i % 7) for i in range(60)]
    counts = run_replica(
        requests, k, minimum_variance_rates(3.0, k), coverage, cost, 8, 8192, 46, 1,
        np.random.default_rng(3), tally, pooled,
    )  # fmt: skip
    assert 0 < counts.drafting_steps < counts.request_steps  # steps with and without drafts
    without = counts.request_steps - counts.drafting_steps
    assert without > 0.15 * counts.request_steps
    expected = (
        len(requests) * cost.prefill_base  # type: ignore[operator]
        + counts.request_steps * (cost.base + cost.per_token + cost.per_seq)
        + counts.drafting_steps * k * (cost.draft_base + cost.per_token + cost.draft_per_token)
    )
    assert tally.end - tally.start == pytest.approx(expected, rel=1e-9)


def test_a_run_that_keeps_records_steps_exactly_where_the_kv_cache_fills(tmp_path: Path) -> None:
    """A KV cache smaller than every running request at its longest preempts: the fast path
    runs it as the engine would (tests/sim/test_fast_preemption.py), but a run that keeps each
    request's steps for its records cannot hold a preempted one's, so there the step-exact loop
    runs and the result says why."""
    data = copy.deepcopy(EXAMPLE)
    data["workload"].update(requests=8, output_tokens=16, input_tokens=16)
    data["deployment"]["pools"][0]["engine"].update(kv_cache_tokens=200, max_model_len=64)
    scenario, rates = Scenario.model_validate(data), minimum_variance_rates(3.0, 7)
    fast = simulate(scenario, tmp_path, rates, fast=True)
    assert (fast["loop"], fast["fallback"]) == ("fast", None) and fast["preemptions"] > 0
    result = simulate(scenario, tmp_path, rates, fast=True, keep_records=True)
    assert result["loop"] == "exact"
    assert result["fallback"] == (
        "deployment.pools[0]: the KV cache fills at decode step 0 (16 blocks needed of 13), and "
        "a run that keeps records takes the step-exact loop where a request is preempted"
    )
    assert result["pools"]["0"]["requests"] == 8 and len(result["records"]) == 8
    assert result["preemptions"] > 0


def test_sketch_percentiles_match_numpy_on_the_expanded_samples() -> None:
    """Weighted samples (integer weights, as ITL's tokens): every percentile is within the
    sketch's resolution of ``numpy.percentile`` over the samples repeated by weight; mean, min
    and max are exact."""
    rng = np.random.default_rng(0)
    for size in (1, 2, 7, 1000, 200_000):
        values = rng.lognormal(-4, 1.5, size)
        weights = rng.integers(1, 9, size)
        sketch = Sketch()
        sketch.add(values[: size // 2], weights[: size // 2])
        for v, w in zip(values[size // 2 :], weights[size // 2 :], strict=True):
            if size < 1000:
                sketch.add_one(float(v), float(w))
        if size >= 1000:
            sketch.add(values[size // 2 :], weights[size // 2 :])
        expanded = np.repeat(values, weights)
        summary = sketch.summary(scale=1.0)
        assert summary is not None
        for q in (50, 90, 99):
            want = np.percentile(expanded, q)
            assert abs(summary[f"p{q}"] / want - 1) <= RESOLUTION / 2 * 1.001, (size, q)
        assert summary["mean"] == pytest.approx(expanded.mean(), rel=1e-9)
        assert (summary["min"], summary["max"]) == (values.min(), values.max())
    assert Sketch().summary() is None


SMALL = {
    "model": "kimi-k3",
    "deployment": {"pools": [{"engine": {"speculative": {"method": "dspark", "num_spec_tokens": 7}}}]},
    "workload": {"category": "coding", "thinking": "on", "input_tokens": 64,
                 "output_tokens": {"min": 16, "max": 96}, "concurrency": 8, "requests": 64},
}  # fmt: skip


def test_the_command_takes_the_fast_path_unless_told_exact(run_cli, tmp_path: Path) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    code, out, err = run_cli("sim", path, "--json")
    assert code == 0, err
    assert (json.loads(out)["loop"], json.loads(out)["fallback"]) == ("fast", None)
    code, out, err = run_cli("sim", path, "--json", "--exact")
    assert code == 0, err
    assert json.loads(out)["loop"] == "exact"
    code, out, err = run_cli("sim", path)
    assert code == 0, err
    assert "fast path (--exact for the step-exact loop)" in out
    data = copy.deepcopy(SMALL)
    data["deployment"]["pools"][0]["engine"].update(kv_cache_tokens=300, max_model_len=200)
    path.write_text(yaml.safe_dump(data))
    code, out, err = run_cli("sim", path)  # a cache that fills: the fast path preempts
    assert code == 0, err
    assert "fast path (--exact for the step-exact loop)" in out
    assert "the KV cache filled: " in out and " preemptions (requests recomputed" in out
    code, out, err = run_cli("sim", path, "--output-dir", tmp_path / "run")
    assert code == 0, err
    assert "step-exact loop: the fast path cannot represent deployment.pools[0]: the KV " in out
    code, _, err = run_cli("sim", path, "--jobs", "0")
    assert code == 2 and "--jobs: expected an integer >= 1, got 0" in err


def test_a_parallel_sweep_gives_the_rows_of_a_serial_one(run_cli, tmp_path: Path) -> None:
    """``--jobs 2`` runs the points in two processes; the rows are those of ``--jobs 1``, in
    the sweep's order."""
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    rows = []
    for jobs in ("1", "2"):
        code, out, err = run_cli(
            "sim", path, "--sweep", "concurrency=8,1,4", "--json", "--jobs", jobs
        )
        assert code == 0, err
        rows.append(json.loads(out))
    assert rows[0] == rows[1]
    assert [r["sweep"]["concurrency"] for r in rows[0]] == [8, 1, 4]
    assert len({r["makespan_s"] for r in rows[0]}) == 3
