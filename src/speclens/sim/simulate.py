"""The virtual-time loop: the engine's own scheduler and acceptance machinery over the ``sim``
executor's step-cost model. Each replica runs its requests in its own virtual clock; arrivals
are Poisson (gamma with burstiness), closed-loop at a concurrency, or all at once."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from speclens.acceptance import AcceptanceHistogram
from speclens.engine import Engine, EngineConfig, SamplingParams, SpeculativeConfig, StepCost
from speclens.sim.scenario import Lengths, Pool, Scenario, pool_cost


@dataclass
class SimRequest:
    index: int
    arrival: float
    input_tokens: int
    output_tokens: int
    first_token: float | None = None
    finish: float | None = None
    token_times: list[tuple[float, int]] = field(default_factory=list)


def _lengths(spec: int | Lengths, count: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(spec, int):
        return np.full(count, spec)
    return rng.integers(spec.min, spec.max + 1, size=count)


def _distribution(values: list[float], scale: float = 1000.0) -> dict[str, float] | None:
    data = np.array([v for v in values if math.isfinite(v)]) * scale
    if data.size == 0:
        return None
    return {
        "mean": float(data.mean()),
        "p50": float(np.percentile(data, 50)),
        "p90": float(np.percentile(data, 90)),
        "p99": float(np.percentile(data, 99)),
        "min": float(data.min()),
        "max": float(data.max()),
    }


def _engine(
    pool: Pool, base: Path, rates: list[float] | None, method: str | None, seed: int, max_len: int
) -> Engine:
    spec = pool.engine.speculative
    speculative = (
        SpeculativeConfig(
            method=method or spec.method,
            num_speculative_tokens=spec.num_spec_tokens,
            acceptance_rates=rates,
            seed=seed,
        )
        if spec is not None
        else SpeculativeConfig()
    )
    cost = pool_cost(pool, base)
    limit = max(pool.engine.max_model_len, max_len)
    return Engine(
        EngineConfig(
            model="dummy",
            executor="sim",
            speculative=speculative,
            max_num_seqs=pool.engine.max_num_seqs,
            max_model_len=limit,
            max_num_batched_tokens=max(limit, 8192),
            kv_cache_tokens=max(pool.engine.kv_cache_tokens, limit + 256),
            seed=seed,
            step_cost=StepCost(**cost.model_dump()),
            detokenize=False,
        )
    )


def _run_replica(engine: Engine, requests: list[SimRequest], concurrency: int | None) -> None:
    pending = sorted(requests, key=lambda r: r.arrival)
    by_id = {str(r.index): r for r in requests}
    in_flight = 0
    cursor = 0
    while cursor < len(pending) or engine.has_unfinished():
        while cursor < len(pending) and (
            (concurrency is None and pending[cursor].arrival <= engine.clock)
            or (concurrency is not None and in_flight < concurrency)
        ):
            r = pending[cursor]
            if concurrency is not None:
                r.arrival = engine.clock  # closed loop: the next request arrives as one leaves
            params = SamplingParams(max_tokens=r.output_tokens, temperature=0.0, ignore_eos=True)
            engine.add_request([1] * r.input_tokens, params, str(r.index))
            in_flight += 1
            cursor += 1
        if not engine.has_unfinished():
            engine.clock = max(engine.clock, pending[cursor].arrival)
            continue
        outputs = engine.step()
        now = engine.clock
        for out in outputs:
            r = by_id[out.request_id]
            n = len(out.new_token_ids[0])
            if n:
                if r.first_token is None:
                    r.first_token = now
                r.token_times.append((now, n))
            if out.finished:
                r.finish = now
                in_flight -= 1


def simulate(
    scenario: Scenario,
    base: Path,
    rates: list[float] | None,
    seed: int = 0,
    concurrency: int | None = None,
    num_spec_tokens: int | None = None,
) -> dict[str, Any]:
    """Run the scenario; returns throughput, latency percentiles and realized AL, per pool too."""
    workload = scenario.workload
    rng = np.random.default_rng(seed)
    count = workload.requests
    inputs = _lengths(workload.input_tokens, count, rng)
    outputs = _lengths(workload.output_tokens, count, rng)
    if workload.rate is not None:
        shape = workload.burstiness
        arrivals = np.cumsum(rng.gamma(shape, 1.0 / (workload.rate * shape), size=count))
    else:
        arrivals = np.zeros(count)
    requests = [
        SimRequest(i, float(arrivals[i]), int(inputs[i]), int(outputs[i])) for i in range(count)
    ]
    replicas: list[tuple[int, Pool]] = [
        (index, pool)
        for index, pool in enumerate(scenario.deployment.pools)
        for _ in range(pool.replicas)
        if pool.role != "prefill"
    ] or [(0, scenario.deployment.pools[0])]
    closed = concurrency or workload.concurrency
    per_replica = None if closed is None else max(1, math.ceil(closed / len(replicas)))
    max_len = int(inputs.max() + outputs.max() + 16)
    assigned: list[list[SimRequest]] = [[] for _ in replicas]
    for r in requests:
        assigned[r.index % len(replicas)].append(r)
    histogram = AcceptanceHistogram()
    per_pool: dict[int, dict[str, Any]] = {}
    for slot, ((pool_index, pool), mine) in enumerate(zip(replicas, assigned, strict=True)):
        if num_spec_tokens is not None and pool.engine.speculative is not None:
            pool = pool.model_copy(update={"engine": pool.engine.model_copy(update={
                "speculative": pool.engine.speculative.model_copy(update={"num_spec_tokens": num_spec_tokens})})})  # fmt: skip
        engine = _engine(pool, base, rates, None, seed + slot, max_len)
        _run_replica(engine, mine, per_replica)
        histogram.update(engine.stats.histogram)
        stats = per_pool.setdefault(
            pool_index, {"requests": 0, "output_tokens": 0, "end": 0.0, "start": math.inf}
        )
        stats["requests"] += len(mine)
        stats["output_tokens"] += sum(r.output_tokens for r in mine)
        stats["end"] = max(stats["end"], max((r.finish or 0.0) for r in mine) if mine else 0.0)
        stats["start"] = min(stats["start"], min((r.arrival for r in mine), default=0.0))
    start = min(r.arrival for r in requests)
    end = max(r.finish or 0.0 for r in requests)
    makespan = max(end - start, 1e-12)
    ttft = [r.first_token - r.arrival for r in requests if r.first_token is not None]
    e2e = [r.finish - r.arrival for r in requests if r.finish is not None]
    tpot = [
        (r.finish - r.first_token) / (r.output_tokens - 1)
        for r in requests
        if r.finish is not None and r.first_token is not None and r.output_tokens > 1
    ]
    itl: list[float] = []
    for r in requests:
        for (t0, _), (t1, n) in zip(r.token_times, r.token_times[1:], strict=False):
            itl.extend([(t1 - t0) / n] * n)
    output_tokens = sum(r.output_tokens for r in requests)
    return {
        "requests": count,
        "makespan_s": makespan,
        "throughput": {
            "requests_per_s": count / makespan,
            "output_tokens_per_s": output_tokens / makespan,
        },
        "latency_ms": {
            "ttft": _distribution(ttft),
            "tpot": _distribution(tpot),
            "itl": _distribution(itl),
            "e2e": _distribution(e2e),
        },
        "realized_acceptance_length": histogram.acceptance_length if histogram else None,
        "histogram": {str(j): n for j, n in histogram.counts.items()},
        "pools": {
            str(index): {
                "requests": s["requests"],
                "output_tokens_per_s": s["output_tokens"] / max(s["end"] - s["start"], 1e-12),
                "requests_per_s": s["requests"] / max(s["end"] - s["start"], 1e-12),
            }
            for index, s in sorted(per_pool.items())
        },
    }
