"""The simulator's arrival processes, replicas, pools and the concurrency sweep.

Statistical claims use fixed seeds and bands of 4 standard errors (a normal false-alarm rate of
about 6e-5 each); the standard errors are derived in each docstring."""

from __future__ import annotations

import json
import math
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from speclens.sim.scenario import Scenario, Workload
from speclens.sim.simulate import arrivals, simulate


def _gaps(workload: Workload, seed: int) -> np.ndarray:
    times = np.array([r.arrival for r in arrivals(workload, seed)])
    return np.diff(np.concatenate([[0.0], times]))


@pytest.mark.parametrize(("rate", "burstiness"), [(5.0, 1.0), (40.0, 0.25), (0.5, 4.0)])
def test_rate_based_arrivals_have_the_stated_rate_and_burstiness(
    rate: float, burstiness: float
) -> None:
    """Inter-arrival gaps are gamma with shape k = burstiness and mean 1/rate (k = 1: Poisson),
    so their coefficient of variation is 1/sqrt(k). Over n gaps the mean's SE is
    CV / (rate sqrt(n)); the sample CV's SE, by the delta method on the gamma's moments
    (mu3 = 2k, mu4 = 3k^2 + 6k at unit scale), is sqrt((k + 1) / (2 k^2 n)), 1/sqrt(n) for
    Poisson."""
    n, k = 20_000, burstiness
    gaps = _gaps(Workload(requests=n, rate=rate, burstiness=k), seed=7)
    assert len(gaps) == n and (gaps >= 0).all()  # bursts can tie in float
    cv = 1 / math.sqrt(k)
    assert abs(gaps.mean() - 1 / rate) < 4 * cv / (rate * math.sqrt(n))
    sample_cv = gaps.std(ddof=1) / gaps.mean()
    assert abs(sample_cv - cv) < 4 * math.sqrt((k + 1) / (2 * k * k * n))


def test_without_rate_or_concurrency_everything_arrives_at_once() -> None:
    assert {r.arrival for r in arrivals(Workload(requests=50), seed=1)} == {0.0}


def _scenario(pools: list[dict[str, Any]], **workload: Any) -> Scenario:
    return Scenario.model_validate(
        {
            "model": "m",
            "deployment": {"pools": pools},
            "workload": {"input_tokens": 32, "output_tokens": 32} | workload,
        }
    )


def test_an_open_loop_run_spans_its_arrivals(tmp_path: Path) -> None:
    """Light Poisson load (rate 20/s, each request served in well under a gap): the makespan is
    the span of the arrivals after the first, a sum of n - 1 exponential gaps (mean
    (n - 1)/rate, SE sqrt(n - 1)/rate), plus the last request's time in the system."""
    n, rate = 200, 20.0
    scenario = _scenario([{}], requests=n, rate=rate, output_tokens=8)
    result = simulate(scenario, tmp_path, None, seed=2)
    last = result["latency_ms"]["e2e"]["max"] / 1000
    span = (n - 1) / rate
    assert abs(result["makespan_s"] - span) < 4 * math.sqrt(n - 1) / rate + last
    assert result["latency_ms"]["ttft"]["p50"] < 1000 / rate  # no queue builds at this load


def test_two_replicas_halve_the_makespan_of_one_at_the_same_load(tmp_path: Path) -> None:
    """All 32 requests at once, 4 running at a time per replica, no speculation (so nothing is
    random): each of two replicas runs half the waves of one, in half the time exactly, and a
    request waits for half as many waves before its first token."""
    pool = {"engine": {"max_num_seqs": 4}}
    one = simulate(_scenario([pool], requests=32), tmp_path, None)
    two = simulate(_scenario([{**pool, "replicas": 2}], requests=32), tmp_path, None)
    half = simulate(_scenario([pool], requests=16), tmp_path, None)
    assert two["makespan_s"] == pytest.approx(one["makespan_s"] / 2, rel=1e-12)
    assert two["makespan_s"] == pytest.approx(half["makespan_s"], rel=1e-12)
    assert two["latency_ms"]["ttft"]["max"] < 0.5 * one["latency_ms"]["ttft"]["max"]
    assert two["throughput"]["requests_per_s"] == pytest.approx(
        2 * one["throughput"]["requests_per_s"], rel=1e-12
    )


def test_pools_take_requests_in_proportion_to_their_replicas(tmp_path: Path) -> None:
    """Round robin over replicas: a 1-replica and a 3-replica pool split 40 requests 10 / 30,
    and every replica runs the same work, so the bigger pool's rate is 3 times the smaller's."""
    pools = [{"name": "a", "replicas": 1}, {"name": "b", "role": "decode", "replicas": 3}]
    result = simulate(_scenario(pools, requests=40), tmp_path, None)
    assert {i: p["requests"] for i, p in result["pools"].items()} == {"0": 10, "1": 30}
    a, b = result["pools"]["0"], result["pools"]["1"]
    assert b["output_tokens_per_s"] == pytest.approx(3 * a["output_tokens_per_s"], rel=1e-12)


def test_the_concurrency_sweep_runs_its_points_in_order(run_cli, tmp_path: Path) -> None:
    """Closed loop at 1..32 on one replica (max_num_seqs 64): a bigger batch costs more per step
    (per-request terms) but far less than proportionally (the step's base), so throughput rises
    and time per output token rises with concurrency."""
    path = tmp_path / "scenario.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": "m",
                "deployment": {"pools": [{"engine": {"max_num_seqs": 64, "speculative":
                               {"method": "ngram", "num_spec_tokens": 3}}}]},
                "workload": {"input_tokens": 64, "output_tokens": 64, "requests": 64,
                             "concurrency": 4},
                "acceptance": {"value": {"num_spec_tokens": 3, "acceptance_length": 2.5}},
            }
        )
    )  # fmt: skip
    points = [1, 2, 4, 8, 16, 32]
    code, out, err = run_cli("sim", path, "--sweep", "concurrency=1,2,4,8,16,32", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["sweep"] for r in rows] == [{"concurrency": c} for c in points]
    throughput = [r["throughput"]["output_tokens_per_s"] for r in rows]
    tpot = [r["latency_ms"]["tpot"]["p50"] for r in rows]
    assert all(a < b for a, b in pairwise(throughput))
    assert all(a < b for a, b in pairwise(tpot))
    assert throughput[-1] > 4 * throughput[0]
