"""The virtual-time loop: the engine's own scheduler and acceptance machinery over the ``sim``
executor's step-cost model. Each replica runs its requests in its own virtual clock; arrivals
are Poisson (gamma with burstiness), closed-loop at a concurrency, or all at once.

Memory stays bounded by what is in flight: arrivals are drawn a chunk at a time as a replica
reaches them, and a finished request leaves only its latency samples behind."""

from __future__ import annotations

import functools
import math
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from speclens.acceptance import AcceptanceHistogram
from speclens.engine import Engine, EngineConfig, SamplingParams, SpeculativeConfig, StepCost
from speclens.engine.kv_cache import blocks_for
from speclens.engine.model import LlamaModel
from speclens.engine.tokenizer import Tokenizer
from speclens.engine.weights import load_model
from speclens.sim import limits
from speclens.sim.coverage import Coverage, cover
from speclens.sim.scenario import Lengths, Pool, Scenario, Workload, pool_cost

#: Keys the coverage stream apart from the arrival stream drawn from the same seed.
COVERAGE_STREAM = 0xC0FE

#: Requests drawn at a time. A workload of at most this many draws exactly what one batch
#: would (inputs, then outputs, then gaps), so its results do not depend on the chunking.
CHUNK = 65_536


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


def arrivals(workload: Workload, seed: int, slot: int = 0, every: int = 1) -> Iterator[SimRequest]:
    """The workload's requests ``slot, slot + every, ...`` (a replica's round-robin share) in
    arrival order, drawn ``CHUNK`` at a time: a request that has not arrived holds no state."""
    rng = np.random.default_rng(seed)
    clock = 0.0
    for first in range(0, workload.requests, CHUNK):
        count = min(CHUNK, workload.requests - first)
        inputs = _lengths(workload.input_tokens, count, rng)
        outputs = _lengths(workload.output_tokens, count, rng)
        if workload.rate is not None:
            shape = workload.burstiness
            gaps = rng.gamma(shape, 1.0 / (workload.rate * shape), size=count)
            times = clock + np.cumsum(gaps)
            clock = float(times[-1])
        else:
            times = np.zeros(count)
        for i in range((slot - first) % every, count, every):
            yield SimRequest(first + i, float(times[i]), int(inputs[i]), int(outputs[i]))


def _distribution(values: array[float], scale: float = 1000.0) -> dict[str, float] | None:
    data = np.frombuffer(values, dtype=np.float64) if len(values) else np.zeros(0)
    data = data[np.isfinite(data)] * scale
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


@dataclass
class _Tally:
    """What finished requests leave behind: latency samples (seconds) and totals."""

    ttft: array[float] = field(default_factory=lambda: array("d"))
    tpot: array[float] = field(default_factory=lambda: array("d"))
    itl: array[float] = field(default_factory=lambda: array("d"))
    e2e: array[float] = field(default_factory=lambda: array("d"))
    requests: int = 0
    output_tokens: int = 0
    start: float = math.inf
    end: float = 0.0

    def add(self, r: SimRequest) -> None:
        self.requests += 1
        self.output_tokens += r.output_tokens
        self.start = min(self.start, r.arrival)
        self.end = max(self.end, r.finish or 0.0)
        if r.first_token is not None:
            self.ttft.append(r.first_token - r.arrival)
        if r.finish is not None:
            self.e2e.append(r.finish - r.arrival)
            if r.first_token is not None and r.output_tokens > 1:
                self.tpot.append((r.finish - r.first_token) / (r.output_tokens - 1))
        for (t0, _), (t1, n) in zip(r.token_times, r.token_times[1:], strict=False):
            self.itl.extend([(t1 - t0) / n] * n)


def _engine(
    pool: Pool, base: Path, rates: list[float] | None, seed: int, longest: int, share: int
) -> Engine:
    """One replica's engine with the pool's stated limits. The KV pool is allocated only up to
    what this replica can ever hold (``share`` requests, or ``max_num_seqs`` of them, of at most
    ``longest`` tokens plus verify slots): a bound that cannot bind, so results are as stated."""
    spec = pool.engine.speculative
    speculative = (
        SpeculativeConfig(
            method=spec.method,
            num_speculative_tokens=spec.num_spec_tokens,
            acceptance_rates=rates,
            seed=seed,
        )
        if spec is not None
        else SpeculativeConfig()
    )
    k = spec.num_spec_tokens if spec is not None else 0
    block = EngineConfig.block_size
    held = blocks_for(longest + k + 1, block) * block * max(1, min(pool.engine.max_num_seqs, share))
    cost = pool_cost(pool, base)
    target, tokenizer = _dummy()
    return Engine(
        EngineConfig(
            model="dummy",
            executor="sim",
            speculative=speculative,
            max_num_seqs=pool.engine.max_num_seqs,
            max_model_len=min(pool.engine.max_model_len, longest),
            max_num_batched_tokens=max(pool.engine.max_model_len, 8192),
            kv_cache_tokens=min(pool.engine.kv_cache_tokens, held),
            seed=seed,
            step_cost=StepCost(**cost.model_dump()),
            detokenize=False,
        ),
        target=target,
        tokenizer=tokenizer,
    )


@functools.cache
def _dummy() -> tuple[LlamaModel, Tokenizer]:
    """The embedded dummy model, loaded once: the sim executor reads only its vocabulary."""
    return load_model("dummy")


def _run_replica(
    engine: Engine,
    requests: Iterable[SimRequest],
    concurrency: int | None,
    finished: Callable[[SimRequest], None] | None = None,
    keep_steps: bool = True,
) -> None:
    """Drive ``engine`` over ``requests`` (in arrival order, consumed as they arrive); each
    finished request goes to ``finished`` and is forgotten. ``keep_steps=False`` drops the
    engine's per-step records as it goes (a long run would otherwise keep one per step)."""
    stream = iter(requests)
    upcoming = next(stream, None)
    live: dict[str, SimRequest] = {}
    while upcoming is not None or engine.has_unfinished():
        while upcoming is not None and (
            (concurrency is None and upcoming.arrival <= engine.clock)
            or (concurrency is not None and len(live) < concurrency)
        ):
            r = upcoming
            if concurrency is not None:
                r.arrival = engine.clock  # closed loop: the next request arrives as one leaves
            params = SamplingParams(max_tokens=r.output_tokens, temperature=0.0, ignore_eos=True)
            engine.add_request([1] * r.input_tokens, params, str(r.index))
            live[str(r.index)] = r
            upcoming = next(stream, None)
        if not engine.has_unfinished():
            assert upcoming is not None
            engine.clock = max(engine.clock, upcoming.arrival)
            continue
        outputs = engine.step()
        if not keep_steps:
            engine.steps.clear()
        now = engine.clock
        for out in outputs:
            r = live[out.request_id]
            n = len(out.new_token_ids[0])
            if n:
                if r.first_token is None:
                    r.first_token = now
                r.token_times.append((now, n))
            if out.finished:
                r.finish = now
                del live[out.request_id]
                if finished is not None:
                    finished(r)


def simulate(
    scenario: Scenario,
    base: Path,
    rates: list[float] | None,
    seed: int = 0,
    concurrency: int | None = None,
    num_spec_tokens: int | None = None,
    max_request_steps: int = limits.MAX_REQUEST_STEPS,
    source: str = "scenario",
    draft_coverage: float = 1.0,
) -> dict[str, Any]:
    """Run the scenario; returns throughput, latency percentiles, realized AL, draft coverage
    and tokens per decode step, per pool too. A speculating request-step drafts with
    probability ``draft_coverage`` (``speclens.sim.coverage``). Raises ``ValidationError``
    (naming ``source``) for what ``limits`` refuses, before any work."""
    limits.check(scenario, source, [num_spec_tokens], max_request_steps)
    workload = scenario.workload
    count = workload.requests
    longest = limits.longest(workload.input_tokens) + limits.longest(workload.output_tokens)
    replicas = [
        (index, pool)
        for index, pool in limits.simulated_pools(scenario)
        for _ in range(pool.replicas)
    ]
    closed = concurrency or workload.concurrency
    per_replica = None if closed is None else max(1, math.ceil(closed / len(replicas)))
    histogram = AcceptanceHistogram()
    coverage = Coverage()
    accepted = 0
    tally = _Tally()
    per_pool: dict[int, _Tally] = {}
    for slot, (pool_index, pool) in enumerate(replicas):
        pooled = per_pool.setdefault(pool_index, _Tally())
        share = count // len(replicas) + (slot < count % len(replicas))
        if not share:
            continue  # more replicas than requests: this one stays idle
        if num_spec_tokens is not None and pool.engine.speculative is not None:
            pool = pool.model_copy(update={"engine": pool.engine.model_copy(update={
                "speculative": pool.engine.speculative.model_copy(update={"num_spec_tokens": num_spec_tokens})})})  # fmt: skip
        engine = _engine(pool, base, rates, seed + slot, longest, share)
        rng = np.random.default_rng([COVERAGE_STREAM, seed, slot])
        drafted = cover(engine, draft_coverage, rng)

        def done(r: SimRequest, pooled: _Tally = pooled) -> None:
            tally.add(r)
            pooled.requests += 1
            pooled.output_tokens += r.output_tokens
            pooled.start = min(pooled.start, r.arrival)
            pooled.end = max(pooled.end, r.finish or 0.0)

        requests = arrivals(workload, seed, slot, len(replicas))
        _run_replica(engine, requests, per_replica, done, keep_steps=False)
        histogram.update(engine.stats.histogram)
        if drafted is not None:
            coverage.add(drafted)
            accepted += engine.stats.num_accepted_tokens
    makespan = max(tally.end - tally.start, 1e-12)
    return {
        "requests": count,
        "makespan_s": makespan,
        "throughput": {
            "requests_per_s": count / makespan,
            "output_tokens_per_s": tally.output_tokens / makespan,
        },
        "latency_ms": {
            "ttft": _distribution(tally.ttft),
            "tpot": _distribution(tally.tpot),
            "itl": _distribution(tally.itl),
            "e2e": _distribution(tally.e2e),
        },
        "realized_acceptance_length": histogram.acceptance_length if histogram else None,
        "histogram": {str(j): n for j, n in histogram.counts.items()},
        # Speculating replicas only: the share of decode request-steps that drafted, and the
        # tokens each gained (AL counts only the steps that drafted; this counts them all).
        "draft_coverage": coverage.realized,
        "tokens_per_step": 1 + accepted / coverage.request_steps
        if coverage.request_steps
        else None,
        "pools": {
            str(index): {
                "requests": s.requests,
                "output_tokens_per_s": s.output_tokens / max(s.end - s.start, 1e-12),
                "requests_per_s": s.requests / max(s.end - s.start, 1e-12),
            }
            for index, s in sorted(per_pool.items())
        },
    }
