"""The virtual-time loop: the engine's own scheduler and acceptance machinery over the ``sim``
executor's step-cost model. Each replica runs its requests in its own virtual clock; arrivals
are Poisson (gamma with burstiness), closed-loop at a concurrency, or all at once.

Memory stays bounded by what is in flight: arrivals are drawn a chunk at a time as a replica
reaches them, and a finished request leaves only its latency samples behind.

With a spread (the resolution's ``AcceptanceSpread``) each request accepts at its own AL, drawn
from the request's id and its replica's forced-acceptance seed: both loops draw the same AL for
the same request (``fast.RequestSpread``; the engine's ``SpeculativeConfig.acceptance_spread``)."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from speclens.acceptance import AcceptanceHistogram, Problem, ValidationError, acceptance_length
from speclens.cost import BLOCK_SIZE, Pricing
from speclens.sim import fast as fast_path
from speclens.sim import limits, run_output
from speclens.sim.request import SimRequest
from speclens.sim.scenario import Lengths, Pool, Scenario, Workload, cost_source, pool_cost
from speclens.sim.sketch import Tally, Totals

if TYPE_CHECKING:  # torch loads only for the step-exact loop
    from speclens.acceptance import AcceptanceSpread
    from speclens.engine import Engine
    from speclens.engine.model import LlamaModel
    from speclens.engine.tokenizer import Tokenizer
    from speclens.runs.request import RequestRecord

#: Keys the fast path's draws apart from the arrival and coverage streams of the same seed.
FAST_STREAM = 0xFA57

#: Keys the coverage stream apart from the arrival stream drawn from the same seed.
COVERAGE_STREAM = 0xC0FE

#: Requests drawn at a time. A workload of at most this many draws exactly what one batch
#: would (inputs, then outputs, then gaps), so its results do not depend on the chunking.
CHUNK = 65_536


def _lengths(spec: int | Lengths, count: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(spec, int):
        return np.full(count, spec)
    if spec.values is not None:
        return np.asarray(spec.values, dtype=np.int64)[rng.integers(0, len(spec.values), count)]
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


@dataclass
class _Ran:
    """What a run of every replica leaves: its tallies, records and speculation counts."""

    tally: Tally
    per_pool: dict[int, Totals]
    records: list[RequestRecord]
    histogram: AcceptanceHistogram
    request_steps: int
    drafting_steps: int
    accepted: int
    preemptions: int


def _record_exact(tally: Tally, r: SimRequest, warm: bool = False) -> None:
    """A request the step-exact loop finished: its latencies, and an ITL sample per token (a
    warm-up one in the totals only)."""
    if warm:
        tally.record(r.arrival, r.finish if r.finish is not None else 0.0, r.output_tokens)
        return
    first = r.first_token if r.first_token is not None else math.nan
    tally.add(r.arrival, first, r.finish if r.finish is not None else math.nan, r.output_tokens)
    if len(r.token_times) > 1:
        times = np.array(r.token_times, dtype=np.float64)
        tally.itl.add(np.diff(times[:, 0]) / times[1:, 1], times[1:, 1])


def _engine(
    pool: Pool, cost: Pricing, rates: list[float] | None, seed: int, longest: int, share: int,
    spread: AcceptanceSpread | None = None, coverage: float = 1.0,
) -> Engine:  # fmt: skip
    """One replica's engine with the pool's stated limits (``spread``: each request forced at its
    own AL). The KV pool is allocated only up to what this replica can ever hold (``share``
    requests, or ``max_num_seqs`` of them, of at most ``longest`` tokens plus verify slots): a
    bound that cannot bind, so results are as stated."""
    from speclens.engine import Engine, EngineConfig, SpeculativeConfig
    from speclens.engine.kv_cache import blocks_for

    spec = pool.engine.speculative
    spreading: dict[str, Any] = (
        {} if spread is None else {"acceptance_spread": spread, "spread_coverage": coverage}
    )
    speculative = (
        SpeculativeConfig(
            method=spec.method,
            num_speculative_tokens=spec.num_spec_tokens,
            acceptance_rates=rates,
            seed=seed,
            **spreading,
        )
        if spec is not None
        else SpeculativeConfig()
    )
    k = spec.num_spec_tokens if spec is not None else 0
    block = EngineConfig.block_size
    held = blocks_for(longest + k + 1, block) * block * max(1, min(pool.engine.max_num_seqs, share))
    target, tokenizer = _dummy()
    with _engine_banner_held():
        return Engine(
            EngineConfig(
                model="dummy",
                executor="sim",
                speculative=speculative,
                max_num_seqs=pool.engine.max_num_seqs,
                max_model_len=min(pool.engine.max_model_len, longest),
                max_num_batched_tokens=limits.batched_tokens(pool),
                kv_cache_tokens=min(pool.engine.kv_cache_tokens, held),
                seed=seed,
                step_cost=cost,
                detokenize=False,
            ),
            target=target,
            tokenizer=tokenizer,
        )


class _BelowWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


@contextlib.contextmanager
def _engine_banner_held() -> Iterator[None]:
    """The engine's start-up lines (forced acceptance ON: "throughput numbers from this run are
    synthetic") are a server's, for its operator; a simulation's output says what it ran
    itself, so they are dropped while its engine is built (warnings still pass)."""
    logger, held = logging.getLogger("speclens.engine.engine"), _BelowWarning()
    logger.addFilter(held)
    try:
        yield
    finally:
        logger.removeFilter(held)


@functools.cache
def _dummy() -> tuple[LlamaModel, Tokenizer]:
    """The embedded dummy model, loaded once: the sim executor reads only its vocabulary."""
    from speclens.engine.weights import load_model

    return load_model("dummy")


def _run_replica(
    engine: Engine,
    requests: Iterable[SimRequest],
    concurrency: int | None,
    finished: Callable[[SimRequest, bool], None] | None = None,
    keep_steps: bool = True,
    warmup: int = 0,
) -> None:
    """Drive ``engine`` over ``requests`` (in arrival order, consumed as they arrive); each
    finished request goes to ``finished`` (with whether it is one of the first ``warmup``
    taken) and is forgotten. ``keep_steps=False`` drops the engine's per-step records as it
    goes (a long run would otherwise keep one per step)."""
    from speclens.engine import SamplingParams

    def add(r: SimRequest) -> None:
        params = SamplingParams(max_tokens=r.output_tokens, temperature=0.0, ignore_eos=True)
        engine.add_request([1] * r.input_tokens, params, str(r.index))

    stream = iter(requests)
    upcoming = next(stream, None)
    live: dict[str, SimRequest] = {}
    held: list[SimRequest] = []  # closed loop: arrived just after the step boundary one left at
    warm: set[str] = set()  # the warm-up's request ids
    while upcoming is not None or engine.has_unfinished() or held:
        while upcoming is not None and (
            (concurrency is None and upcoming.arrival <= engine.clock)
            or (concurrency is not None and len(live) < concurrency)
        ):
            r = upcoming
            if len(warm) < warmup:
                warm.add(str(r.index))
            if concurrency is not None:
                r.arrival = engine.clock  # closed loop: the next request arrives as one leaves
                held.append(r)
            else:
                add(r)
            live[str(r.index)] = r
            upcoming = next(stream, None)
        if held and not engine.has_unfinished():  # an idle engine takes them at once
            for r in held:
                add(r)
            held.clear()
        if not engine.has_unfinished():
            assert upcoming is not None
            engine.clock = max(engine.clock, upcoming.arrival)
            continue
        outputs = engine.step()
        for r in held:  # they arrived as that step began, and join after it
            add(r)
        held.clear()
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
                r.acceptance = out.outputs[0].acceptance
                del live[out.request_id]
                if finished is not None:
                    finished(r, out.request_id in warm)


def _with_k(pool: Pool, num_spec_tokens: int | None) -> Pool:
    """The pool with a sweep's K in place of its own (when it speculates)."""
    spec = pool.engine.speculative
    if num_spec_tokens is None or spec is None:
        return pool
    engine = pool.engine.model_copy(
        update={"speculative": spec.model_copy(update={"num_spec_tokens": num_spec_tokens})}
    )
    return pool.model_copy(update={"engine": engine})


def _replicas(scenario: Scenario, num_spec_tokens: int | None) -> list[tuple[int, Pool]]:
    return [
        (index, _with_k(pool, num_spec_tokens))
        for index, pool in limits.simulated_pools(scenario)
        for _ in range(pool.replicas)
    ]


def _k(pool: Pool) -> int:
    spec = pool.engine.speculative
    return spec.num_spec_tokens if spec is not None else 0


def fast_fallback(
    scenario: Scenario,
    rates: list[float] | None,
    num_spec_tokens: int | None = None,
    kv: bool = True,
) -> str | None:
    """Why the fast path cannot run this scenario as the step-exact loop would (naming the
    pool), or None when it can. ``kv``: also where the KV cache may fill (``may_preempt``): the
    fast path preempts as the engine does, but a run that keeps records takes the step-exact
    loop where its draws fill the cache (``fast.Preempted``), so a caller bounding such a run's
    work counts it as the step-exact loop's."""
    workload = scenario.workload
    longest = limits.longest(workload.input_tokens) + limits.longest(workload.output_tokens)
    replicas = _replicas(scenario, num_spec_tokens)
    for slot, (index, pool) in enumerate(replicas):
        share = workload.requests // len(replicas) + (slot < workload.requests % len(replicas))
        engine = pool.engine
        reason = fast_path.unsupported(
            _k(pool), rates, engine.max_num_seqs, engine.kv_cache_tokens,
            limits.batched_tokens(pool), longest, share,
        )  # fmt: skip
        if reason is None and kv:
            reason = fast_path.may_preempt(
                _k(pool), engine.max_num_seqs, engine.kv_cache_tokens, longest, share
            )
        if reason is not None:
            return f"deployment.pools[{index}]: {reason}"
    return None


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
    fast: bool = False,
    keep_records: bool = False,
    spread: AcceptanceSpread | None = None,
    slo: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Run the scenario; returns throughput, latency percentiles, realized AL, draft coverage
    and tokens per decode step, per pool too. A speculating request-step drafts with
    probability ``draft_coverage`` (``speclens.sim.coverage``). ``fast`` takes the event-level
    path (``speclens.sim.fast``) where it applies, the step-exact loop otherwise; ``loop`` and
    ``fallback`` in the result say which ran and why. ``keep_records``: ``records`` holds one
    ``RequestRecord`` per request, in index order, as bench records a measured one (the caller
    bounds the run: they grow with its tokens). ``spread``: each request accepts at its own AL
    drawn from it, at its own rates (``fast.RequestSpread``, as the engine forces them); None:
    every request at ``rates``. ``slo`` (seconds by
    ttft, tpot, e2e): ``goodput`` as bench counts it. Raises ``ValidationError`` (naming
    ``source``) for what ``limits`` refuses, before any work."""
    # The fast path keeps no prompt and no finished request (unless it keeps records), and it
    # runs unless a pool needs the exact loop: only a run that may keep requests whole bounds
    # their prompt tokens.
    static = fast_fallback(scenario, rates, num_spec_tokens, kv=False) if fast else None
    keeps = not fast or keep_records or static is not None
    limits.check(scenario, source, [num_spec_tokens], max_request_steps, base=base,
                 keeps_requests=keeps)  # fmt: skip
    workload = scenario.workload
    count = workload.requests
    longest = limits.longest(workload.input_tokens) + limits.longest(workload.output_tokens)
    replicas = _replicas(scenario, num_spec_tokens)
    # Each pool's prices, once (a replica's K does not change them; a roofline reads its
    # catalog entries and works out its constants when built).
    pools = scenario.deployment.pools
    costs = {i: pool_cost(p, base, scenario, index=i) for i, p in enumerate(pools)}
    fallback = static
    use_fast = fast and fallback is None
    closed = concurrency or workload.concurrency
    per_replica = None if closed is None else max(1, math.ceil(closed / len(replicas)))
    # A closed loop's warm-up: each replica's first admissions, all at once into its idle
    # engine (the start-up burst), are left out of the latencies, as a benchmark's would be.
    # A run too short for one (every request admitted at once) keeps them, and says so.
    warm = warmup_requests(scenario, concurrency)
    warmup = (per_replica or 0) if warm < count else 0

    def run(use_fast: bool) -> _Ran:
        """Every replica on one loop; the fast path raises ``Preempted`` where it cannot
        follow the engine."""
        histogram = AcceptanceHistogram()
        request_steps = drafting_steps = accepted = preemptions = 0
        tally = GoodTally(slo) if slo else Tally()
        per_pool: dict[int, Totals] = {}
        records: list[RequestRecord] = []
        category = workload.category or run_output.DEFAULT_CATEGORY
        for slot, (pool_index, pool) in enumerate(replicas):
            pooled = per_pool.setdefault(pool_index, Totals())
            share = count // len(replicas) + (slot < count % len(replicas))
            if not share:
                continue  # more replicas than requests: this one stays idle
            requests = arrivals(workload, seed, slot, len(replicas))
            k = _k(pool)
            replica = f"sim://pools/{pool_index}/replicas/{slot}"
            if spread is not None and k and spread.num_spec_tokens != k:
                raise ValueError(
                    f"a spread stated at K {spread.num_spec_tokens} cannot drive K {k}"
                )
            # The exact loop's engine forces acceptance with seed + slot: the same request draws
            # the same AL on either loop.
            own = (
                fast_path.RequestSpread(spread.values, rates, seed + slot, draft_coverage)
                if spread is not None and k and rates is not None
                else None
            )
            if use_fast:
                traced = (
                    (
                        lambda t, k=k, at=replica: records.append(
                            run_output.from_trace(t, k, category, at)
                        )
                    )
                    if keep_records
                    else None
                )
                kv = pool.engine.kv_cache_tokens
                fills = fast_path.may_preempt(k, pool.engine.max_num_seqs, kv, longest, share)
                try:
                    counts = fast_path.run_replica(
                        ((r.index, r.arrival, r.input_tokens, r.output_tokens) for r in requests),
                        k, rates, draft_coverage, costs[pool_index], pool.engine.max_num_seqs,
                        limits.batched_tokens(pool), limits.longest(workload.output_tokens),
                        per_replica, np.random.default_rng([FAST_STREAM, seed, slot]), tally,
                        pooled, traced, warmup=warmup, spread=own,
                        kv_blocks=-(-kv // BLOCK_SIZE) if fills else None,
                    )  # fmt: skip
                except fast_path.Preempted as exc:
                    exc.pool = pool_index
                    raise
                preemptions += counts.preemptions
                if k:
                    histogram.update(AcceptanceHistogram.from_dense(counts.histogram.tolist()))
                    request_steps += counts.request_steps
                    drafting_steps += counts.drafting_steps
                    accepted += int(counts.histogram @ np.arange(k + 1))
                continue
            from speclens.sim.coverage import cover

            engine = _engine(pool, costs[pool_index], rates, seed + slot, longest, share,
                             spread if own is not None else None, draft_coverage)  # fmt: skip
            drafted = cover(
                engine, draft_coverage, np.random.default_rng([COVERAGE_STREAM, seed, slot])
            )

            def done(
                r: SimRequest, warm: bool, pooled: Totals = pooled, k: int = k, at: str = replica
            ) -> None:
                _record_exact(tally, r, warm)
                pooled.record(r.arrival, r.finish or 0.0, r.output_tokens)
                if keep_records:
                    records.append(run_output.from_exact(r, k, category, at))

            _run_replica(engine, requests, per_replica, done, keep_steps=False, warmup=warmup)
            histogram.update(engine.stats.histogram)
            preemptions += engine.scheduler.num_preemptions
            if drafted is not None:
                request_steps += drafted.request_steps
                drafting_steps += drafted.drafting_steps
                accepted += engine.stats.num_accepted_tokens
        return _Ran(tally, per_pool, records, histogram, request_steps, drafting_steps,
                    accepted, preemptions)  # fmt: skip

    try:
        ran = run(use_fast)
    except fast_path.Preempted as exc:  # on these draws the cache fills: the exact loop runs
        fallback, use_fast = f"deployment.pools[{exc.pool}]: {exc}", False
        ran = run(False)
    tally, per_pool, records = ran.tally, ran.per_pool, ran.records
    histogram, request_steps = ran.histogram, ran.request_steps
    drafting_steps, accepted = ran.drafting_steps, ran.accepted
    makespan = _makespan(tally, source)
    extra: dict[str, Any] = {}
    if isinstance(tally, GoodTally):
        extra["goodput"] = tally.goodput(makespan)
    if keep_records:
        extra["records"] = sorted(records, key=lambda r: r.index)
    return {
        "requests": count,
        "warmup": warmup_note(count, warm),
        "loop": "fast" if use_fast else "exact",
        "fallback": fallback,
        "makespan_s": makespan,
        "throughput": {
            "requests_per_s": count / makespan,
            "output_tokens_per_s": tally.output_tokens / makespan,
        },
        "latency_ms": tally.latency_ms(),
        "realized_acceptance_length": histogram.acceptance_length if histogram else None,
        "histogram": {str(j): n for j, n in sorted(histogram.counts.items())},
        # Speculating replicas only: the share of decode request-steps that drafted, and the
        # tokens each gained (AL counts only the steps that drafted; this counts them all).
        "draft_coverage": drafting_steps / request_steps if request_steps else None,
        "decode_request_steps": request_steps if request_steps else None,
        "tokens_per_step": acceptance_length(accepted, request_steps) if request_steps else None,
        # Requests the KV cache pushed out to be recomputed (a request twice counts twice).
        "preemptions": ran.preemptions,
        "pricing": {
            str(i): {**costs[i].describe(), "source": cost_source(pool, scenario)}
            for i, pool in enumerate(pools)
        },
        "pools": {
            str(index): {
                "requests": s.requests,
                "output_tokens_per_s": _per_second(s.output_tokens, s),
                "requests_per_s": _per_second(s.requests, s),
            }
            for index, s in sorted(per_pool.items())
        },
        **extra,
    }


#: The SLO metrics a simulated request is held to: each finished request keeps its TTFT, TPOT
#: and E2E; its worst inter-token gap is not kept (the fast path prices steps, not requests).
SLO_METRICS = ("ttft", "tpot", "e2e")


class GoodTally(Tally):
    """``Tally`` that also counts the measured requests meeting every limit of ``slo`` (seconds
    by metric), as bench's goodput does (``runs.figures``): a request of one output token has
    no TPOT, so it misses a TPOT limit."""

    def __init__(self, slo: dict[str, float]) -> None:
        super().__init__()
        unknown = sorted(set(slo) - set(SLO_METRICS))
        if unknown:
            raise ValueError(f"no per-request {', '.join(unknown)} is simulated")
        self.slo = dict(slo)
        self.good = self.measured = 0

    def add(self, arrival: float, first: float, finish: float, output_tokens: int) -> None:
        super().add(arrival, first, finish, output_tokens)
        self.measured += 1
        tpot = (finish - first) / (output_tokens - 1) if output_tokens > 1 else math.nan
        values = {"ttft": first - arrival, "tpot": tpot, "e2e": finish - arrival}
        # NaN compares False: a figure the request lacks misses its limit
        if all(values[name] <= limit for name, limit in self.slo.items()):
            self.good += 1

    def goodput(self, makespan: float) -> dict[str, Any]:
        """bench's ``figures.goodput`` for the run, plus the requests that met the SLO."""
        return {
            "slo_ms": {name: limit * 1000 for name, limit in self.slo.items()},
            "requests": self.good,
            "requests_per_s": self.good / makespan if self.good else 0.0,
            "fraction": self.good / self.measured if self.measured else 0.0,
        }


def warmup_requests(scenario: Scenario, concurrency: int | None = None) -> int:
    """How many requests a run's warm-up takes (before the cap at the workload's requests): a
    closed loop's concurrency (``concurrency``, else the workload's) rounded up to a multiple
    of the replicas, each taking its share at once; 0 for an open loop."""
    closed = concurrency or scenario.workload.concurrency
    if closed is None:
        return 0
    replicas = len(_replicas(scenario, None))
    return max(1, math.ceil(closed / replicas)) * replicas


def closed_loop_problem(scenario: Scenario, concurrency: int | None = None) -> str | None:
    """Why a closed loop at ``concurrency`` (else the workload's) would not run as stated: over
    the workload's requests it never holds more than it sends, so it would repeat the run at
    that many; or None."""
    closed, requests = concurrency or scenario.workload.concurrency, scenario.workload.requests
    if closed is None or closed <= requests:
        return None
    return (
        f"concurrency {closed} is over workload.requests {requests}: a closed loop never holds "
        f"more requests than it sends, so it would repeat concurrency {requests}'s run; raise "
        f"workload.requests above {closed} (a warm-up of {closed} is left out of the latencies)"
    )


def warmup_note(requests: int, warmup: int) -> dict[str, Any] | None:
    """What a run's latencies leave out: the closed loop's first ``warmup`` requests (by index:
    each replica's first admissions into its idle engine), none where that would be every
    request (said so), or None (an open loop: no warm-up)."""
    if not warmup:
        return None
    if warmup >= requests:
        return {
            "requests": 0,
            "left_out_of": [],
            "line": f"latencies include the start-up burst: a warm-up of {warmup:,} (the "
            f"concurrency) would leave none of the {requests:,} requests; raise "
            f"workload.requests above {warmup:,} to leave it out",
        }
    return {
        "requests": warmup,
        "left_out_of": ["ttft", "tpot", "itl", "e2e"],
        "line": f"latencies leave out the warm-up: requests 0..{warmup - 1} ({warmup:,} of "
        f"{requests:,}), admitted at once into idle engines at the start; throughput and "
        "acceptance count every request",
    }


def _makespan(tally: Tally, source: str) -> float:
    """First arrival to last finish, refused unless it is a positive, finite time: a figure
    divided by 0 s or by an overflowed clock would be printed as a throughput."""
    makespan = tally.end - tally.start
    if math.isfinite(makespan) and makespan > 0:
        return makespan
    if makespan == 0:
        why = "the run took 0 s of virtual time (every step it ran was priced at 0 s)"
    else:
        why = f"the run's virtual time is {makespan!r} s (its clock overflowed)"
    raise ValidationError([Problem(source, "deployment.pools", (
        f"{why}: no throughput can be computed; price the steps (step_cost)"
    ))])  # fmt: skip


def _per_second(count: int, pooled: Totals) -> float | None:
    """``count`` over the pool's span; 0.0 for a pool that ran nothing, None for one whose
    requests all finished in no time (the whole run's makespan is checked apart)."""
    span = pooled.end - pooled.start
    if not pooled.requests:
        return 0.0
    return count / span if span > 0 else None
