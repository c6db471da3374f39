"""The event-level fast path: the step-exact loop's schedule and prices, advanced a stretch of
decode steps at a time.

Under forced acceptance a request's draws do not depend on who shares its batch: each decode
request-step drafts with probability ``coverage`` and then accepts j drafts with probability
r_j - r_(j+1). So a request's whole trajectory (tokens per step, drafts, context) is drawn when it
is admitted, and what it adds to every future decode step (a sequence, its context, whether it
drafts: a drafting one verifies K + 1 slots) is added to windows indexed by decode step; a
stretch of steps is priced from those sums at once (``decode``), so any step cost works, affine
or a roofline. With no preemption and every running request in every decode step
(``unsupported`` says when that holds), the batch changes only when a request finishes or is admitted: between
those events the engine's clock is a cumulative sum over the window. Prefill steps, admission
(``max_num_seqs``, the token budget), closed and open loops and idle gaps follow the engine's
scheduler and ``simulate._run_replica`` step for step.

With a spread (``RequestSpread``) each request accepts at its own AL, the one the engine's
forced stream draws for the same request id (a pure function of the seed and the id), so both
loops give request i the same AL; only its steps' draws differ.

The draws are numpy's, not the engine's torch stream, so results match the exact loop in
distribution (tests/sim/test_fast.py), not draw for draw. No torch is imported here.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from speclens.acceptance.quantity import (
    is_minimum_variance,
    length_from_rates,
)
from speclens.acceptance.spread import RequestDraw, request_rates, request_uniform
from speclens.cost import BLOCK_SIZE, Pricing
from speclens.sim.sketch import Tally, Totals

#: Most request-step draws held at a time (a group of admitted requests is drawn together).
DRAW_STEPS = 1 << 20


def unsupported(
    k: int,
    rates: list[float] | None,
    max_num_seqs: int,
    kv_cache_tokens: int,
    max_num_batched_tokens: int,
    longest: int,
    share: int,
) -> str | None:
    """Why the fast path cannot run this replica exactly as the engine would, or None."""
    if k and rates is None:
        return "speculation without a forced acceptance schedule"
    seqs = max(1, min(max_num_seqs, share))
    held = -(-(longest + k + 1) // BLOCK_SIZE) * BLOCK_SIZE * seqs
    if kv_cache_tokens < held:
        return (
            f"kv_cache_tokens {kv_cache_tokens:,} below {held:,} "
            "(the KV cache may preempt requests)"
        )
    if max_num_batched_tokens // (k + 1) < seqs:
        return "a decode step's token budget below max_num_seqs (requests would wait a step)"
    return None


#: A request (index, arrival, input tokens, output tokens) with its trajectory: per decode step
#: the tokens emitted, the context it attends over (drafts included), whether it drafted and the
#: drafts it accepted.
Item = tuple[int, float, int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass
class Trace:
    """One finished request as the fast path ran it, for a per-request record: when it
    arrived and emitted its first token (the prefill's), and per decode step when the step
    ended, the tokens emitted, whether it drafted and the drafts accepted."""

    index: int
    arrival: float
    input_tokens: int
    output_tokens: int
    first: float
    step_times: np.ndarray
    emitted: np.ndarray
    drafting: np.ndarray
    accepted: np.ndarray


@dataclass
class Counts:
    """A replica's speculation: the accepted-count histogram (dense over 0..K) of the steps
    that drafted, decode request-steps, and those that drafted."""

    histogram: np.ndarray
    request_steps: int
    drafting_steps: int


class RequestSpread:
    """Acceptance that differs between requests: request ``index``'s AL is
    ``RequestDraw(quantiles, AL, K).al(request_uniform(seed, str(index)))`` and its rates
    ``request_rates`` at that AL, as the engine's forced stream draws them for request id
    ``str(index)`` with seed ``seed`` (the exact loop's ids and its replica's seed). As the
    engine reads forced rates, they are derived (each request's own schedule is the
    minimum-variance one at its AL) when they are the minimum-variance schedule of their AL."""

    def __init__(
        self, quantiles: Sequence[float], rates: Sequence[float], seed: int, coverage: float = 1.0
    ) -> None:
        self.rates, self.seed = list(rates), seed
        length, k = length_from_rates(self.rates), len(self.rates)
        self.derived = is_minimum_variance(self.rates)
        self.draw = RequestDraw(quantiles, length, k, coverage)

    def al(self, index: int) -> float:
        """Request ``index``'s own AL."""
        return self.draw.al(request_uniform(self.seed, str(index)))

    def rates_of(self, index: int) -> list[float]:
        """Request ``index``'s per-position rates at its own AL."""
        return request_rates(self.al(index), self.rates, self.derived)


def _cdf(rates: Sequence[float], k: int) -> np.ndarray:
    """P(accepted <= j) for j = 0..K from per-position rates (position j reached with r_j)."""
    reach = [1.0, *list(rates)[:k], 0.0] if k else [1.0, 0.0]
    return np.cumsum([reach[j] - reach[j + 1] for j in range(len(reach) - 1)])


class _Draws:
    """Trajectories for admitted requests: per decode step the tokens gained (uncapped), whether
    it drafted, and the context it attends over. With ``spread`` each request draws at its own
    rates (``RequestSpread``); without, every request at ``rates``."""

    def __init__(
        self,
        k: int,
        rates: list[float] | None,
        coverage: float,
        rng: np.random.Generator,
        spread: RequestSpread | None = None,
    ) -> None:
        self.k = k
        self.cdf = _cdf(rates or [], k)
        self.coverage = coverage if k else 0.0
        self.rng = rng
        self.spread = spread if k else None
        mean_tokens = 1.0 + self.coverage * float(sum(rates or [])) if k else 1.0
        self.mean_tokens = mean_tokens
        self.histogram = np.zeros(k + 1, dtype=np.int64)
        self.request_steps = 0
        self.drafting_steps = 0

    def _draw(
        self, count: int, owners: np.ndarray | None = None, cdfs: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``count`` request-steps: accepted drafts (0 when not drafting) and drafting flags;
        with ``cdfs`` (a row a request), step j draws from row ``owners[j]``."""
        if not self.k:
            return np.zeros(count, dtype=np.int64), np.zeros(count, dtype=bool)
        drafting = (
            self.rng.random(count) < self.coverage
            if self.coverage < 1.0
            else np.ones(count, dtype=bool)
        )
        if cdfs is None or owners is None:
            drawn = np.searchsorted(self.cdf, self.rng.random(count), side="right")
        else:  # searchsorted per row: how many of the step's own CDF values lie at or below u
            u = self.rng.random(count)
            drawn = np.zeros(count, dtype=np.int64)
            for j in range(cdfs.shape[1]):
                drawn += cdfs[owners, j] <= u
        return np.where(drafting, np.minimum(drawn, self.k), 0), drafting

    def trajectories(
        self, inputs: np.ndarray, outputs: np.ndarray, indices: Sequence[int] = ()
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """Each request's decode steps, drawn together: tokens emitted (the last step's capped
        at the request's length), the context each step attends over (its drafts included),
        whether it drafted, and the drafts it accepted (uncapped, as the histogram counts them).
        The draws are counted in the statistics."""
        need = np.maximum(outputs - 1, 0)  # the prefill emits the first token
        cdfs, mean_tokens = None, np.full(need.size, self.mean_tokens)
        if self.spread is not None:
            own = [self.spread.rates_of(i) for i in indices]
            cdfs = np.array([_cdf(r, self.k) for r in own]).reshape(need.size, self.k + 1)
            mean_tokens = 1.0 + self.coverage * np.array([math.fsum(r) for r in own])
        lengths = np.minimum(need, (need / mean_tokens + 6 * np.sqrt(need) + 8).astype(int))
        owners = np.repeat(np.arange(need.size), lengths) if cdfs is not None else None
        accepted, drafting = self._draw(int(lengths.sum()), owners, cdfs)
        while True:
            total = np.concatenate([[0], np.cumsum(1 + accepted)])
            ends = np.cumsum(lengths)
            starts = ends - lengths
            before = total[starts]
            short = total[ends] - before < need
            if not short.any():
                break
            # Extend a request that drew too few (never redraw: its steps stay i.i.d.).
            extra = need[short] - (total[ends] - before)[short]
            more = np.repeat(np.flatnonzero(short), extra) if cdfs is not None else None
            more_a, more_d = self._draw(int(extra.sum()), more, cdfs)
            at = np.repeat(ends[short], extra)
            accepted, drafting = np.insert(accepted, at, more_a), np.insert(drafting, at, more_d)
            lengths[short] += extra
        steps = np.where(need > 0, np.searchsorted(total[1:], before + need) - starts + 1, 0)
        request = np.repeat(np.arange(lengths.size), lengths)
        taken = np.arange(accepted.size) - starts[request] < steps[request]
        emitted = 1 + accepted
        done = steps > 0
        last = (starts + steps - 1)[done]
        emitted[last] -= (total[last + 1] - before[done]) - need[done]
        context = inputs[request] + 1 + total[:-1] - before[request] + drafting * self.k
        if self.k:
            counted = taken & drafting
            self.histogram += np.bincount(accepted[counted], minlength=self.k + 1)
            self.request_steps += int(steps.sum())
            self.drafting_steps += int(counted.sum())
        for first, n in zip(starts.tolist(), steps.tolist(), strict=True):
            end = first + n
            yield emitted[first:end], context[first:end], drafting[first:end], accepted[first:end]


class Trajectories(Protocol):
    """What draws the admitted requests' decode steps (``_Draws``, or a replay's recorded
    ones) and counts the drafting steps it handed out."""

    histogram: np.ndarray
    request_steps: int
    drafting_steps: int

    def trajectories(
        self, inputs: np.ndarray, outputs: np.ndarray, indices: Sequence[int]
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]: ...


def _prepared(
    requests: Iterable[tuple[int, float, int, int]], draws: Trajectories, longest_output: int
) -> Iterator[Item]:
    """``requests`` in order, each with its trajectory, drawn a group at a time (at most about
    ``DRAW_STEPS`` request-steps held)."""
    stream = iter(requests)
    group = max(1, min(4096, DRAW_STEPS // max(1, longest_output)))
    while chunk := list(itertools.islice(stream, group)):
        table = np.array([r[2:] for r in chunk], dtype=np.int64)
        drawn_all = draws.trajectories(table[:, 0], table[:, 1], [r[0] for r in chunk])
        for r, drawn in zip(chunk, drawn_all, strict=True):
            yield (*r, *drawn)


@dataclass
class _Live:
    arrival: float
    output_tokens: int
    first: float
    first_tokens: int  # emitted at its first decode step
    first_decode_time: float = 0.0


class _Gaps:
    """ITL samples of requests past their first decode step, a buffer of steps at a time: each
    step's gap, and how many of its requests emitted 1..K + 1 tokens (a token's ITL is the gap
    over the tokens its request emitted)."""

    def __init__(self, tally: Tally, k: int) -> None:
        self.tally = tally
        self.per = np.arange(1, k + 2)
        self.gaps: list[np.ndarray] = []
        self.counts: list[np.ndarray] = []
        self.held = 0

    def add(self, gaps: np.ndarray, counts: np.ndarray) -> None:
        self.gaps.append(gaps)
        self.counts.append(counts.copy())  # the window is reused
        self.held += gaps.size
        if self.held >= 1 << 16:
            self.flush()

    def flush(self) -> None:
        if self.held:
            gaps, counts = np.concatenate(self.gaps), np.concatenate(self.counts)
            self.tally.itl.add((gaps[:, None] / self.per).ravel(), (counts * self.per).ravel())
            self.gaps, self.counts, self.held = [], [], 0


def run_replica(
    requests: Iterable[tuple[int, float, int, int]],
    k: int,
    rates: list[float] | None,
    coverage: float,
    cost: Pricing,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    longest_output: int,
    concurrency: int | None,
    rng: np.random.Generator,
    tally: Tally,
    pooled: Totals,
    traced: Callable[[Trace], None] | None = None,
    draws: Trajectories | None = None,
    cached: Mapping[int, int] | None = None,
    front: float = 0.0,
    warmup: int = 0,
    spread: RequestSpread | None = None,
) -> Counts:
    """Run one replica over ``requests`` (index, arrival, input tokens, output tokens) in
    arrival order, as ``simulate._run_replica`` drives the engine; finished requests go to
    ``tally`` (and ``pooled``), and, given ``traced``, each one's ``Trace`` to it (then every
    decode step's end time is kept: memory grows with the run, bounded by the caller).
    ``draws``: the requests' decode steps as given (a replay), instead of drawn from
    ``rates`` and ``coverage``; ``cached``: by request index, the prompt tokens its prefill
    takes from a prefix cache (a replay of a server that said so): not computed, so not priced,
    though they sit in its context; ``front``: seconds from a request's arrival to the engine
    seeing it (a server's front end: HTTP, tokenizing, handing it over), which no step pays;
    ``warmup``: the first requests taken (a closed loop's admissions into the idle engine) count
    in ``pooled`` and ``tally``'s totals (throughput) but in none of its latencies; ``spread``:
    each request draws at its own AL (``RequestSpread``) instead of every one at ``rates``."""
    if draws is None:
        draws = _Draws(k, rates, coverage, rng, spread)
    span = longest_output + 2
    width = 4 * span
    # Per decode step: its sequences, context tokens, and requests that draft (each verifies
    # K + 1 slots, the others 1).
    seqs = np.zeros(width, dtype=np.int64)
    contexts = np.zeros(width, dtype=np.int64)
    drafting = np.zeros(width, dtype=np.int64)
    tokens = np.zeros((width, k + 2), dtype=np.int64)  # its later-step requests by tokens
    base = 0  # the decode step at index 0 of the window
    decoded = 0  # decode steps run so far
    clock = 0.0
    last_decode = 0.0  # when the latest decode step ended
    stream: Iterator[Item] = _prepared(requests, draws, longest_output)
    upcoming = next(stream, None)
    waiting: deque[Item] = deque()
    held: list[Item] = []  # closed loop: arrived just after the step boundary another left at
    running: list[tuple[int, int]] = []  # heap of (last decode step, request index)
    live: dict[int, _Live] = {}
    fresh: list[_Live] = []  # admitted since the last decode step
    gaps = _Gaps(tally, k)
    clocks: list[float] = []  # with ``traced``: when each decode step ended
    traces: dict[int, tuple[Item, int, float]] = {}  # with ``traced``: item, first step, first
    warm: set[int] = set()  # the warm-up's request indices
    while upcoming is not None or waiting or running or held:
        while upcoming is not None and (
            (concurrency is None and upcoming[1] + front <= clock)
            or (concurrency is not None and len(waiting) + len(held) + len(running) < concurrency)
        ):
            if len(warm) < warmup:
                warm.add(upcoming[0])
            if concurrency is not None:  # closed loop: it arrives as another leaves
                held.append((upcoming[0], clock, *upcoming[2:]))
            else:
                waiting.append(upcoming)
            upcoming = next(stream, None)
        if held and not running and not waiting:  # an idle engine takes them as they come
            clock = max(clock, held[0][1] + front)
            _seen(held, waiting, clock, front)
        if not waiting and not running:
            assert upcoming is not None
            clock = max(clock, upcoming[1] + front)
            continue
        if waiting and len(running) < max_num_seqs:  # a prefill step
            budget = max_num_batched_tokens
            batch: list[Item] = []
            while waiting and len(running) + len(batch) < max_num_seqs:
                if waiting[0][2] > budget:
                    break
                budget -= waiting[0][2]
                batch.append(waiting.popleft())
            assert batch, "a prompt never exceeds the token budget (max_model_len at most)"
            prompt = sum(r[2] for r in batch)
            computed = prompt - sum(cached.get(r[0], 0) for r in batch) if cached else prompt
            clock += cost.prefill(computed, len(batch), prompt)  # as the sim executor's prefill
            if decoded - base >= 2 * span:  # slide the window: no live request reaches back
                shift = decoded - base
                for array in (seqs, contexts, drafting, tokens):
                    array[: width - shift] = array[shift:]
                    array[width - shift :] = 0
                base = decoded
            for item in batch:
                index, arrival, _, outputs, emitted, context, drafted, _ = item
                n = emitted.size
                if not n:  # one output token: done at its prefill
                    _tallied(tally, index in warm, arrival, clock, clock, outputs)
                    pooled.record(arrival, clock, outputs)
                    if traced is not None:
                        traced(_trace(item, clock, np.empty(0)))
                    continue
                if traced is not None:
                    traces[index] = (item, decoded, clock)
                at = decoded - base
                seqs[at : at + n] += 1
                contexts[at : at + n] += context
                drafting[at : at + n] += drafted
                if index not in warm:  # the later steps' ITL samples
                    tokens[np.arange(at + 1, at + n), emitted[1:]] += 1
                r = _Live(arrival, outputs, clock, int(emitted[0]))
                live[index] = r
                fresh.append(r)
                heapq.heappush(running, (decoded + n - 1, index))
            _seen(held, waiting, clock, front)  # arrived as this step began: join after it
            continue
        # A stretch of decode steps with the same requests: to the next finish, or to the
        # next arrival when it could be admitted at once (open loop, a sequence free).
        at = decoded - base
        m = running[0][0] - decoded + 1
        window = slice(at, at + m)
        slots = seqs[window] + k * drafting[window]
        priced = cost.decode(slots, seqs[window], contexts[window], drafting[window], k)
        prices = np.array(priced, dtype=float) if np.ndim(priced) else np.full(m, priced)
        prices[0] += clock
        times = prices.cumsum()  # the clock after each step, added step by step
        if concurrency is None and upcoming is not None and len(running) < max_num_seqs:
            m = min(m, int(np.searchsorted(times, upcoming[1] + front, side="left")) + 1)
        if held:  # they join after the step under way when the engine sees them
            m = min(m, int(np.searchsorted(times, held[0][1] + front, side="left")) + 1)
        gaps.add(np.diff(times[:m], prepend=last_decode), tokens[at : at + m, 1:])
        for r in fresh:
            r.first_decode_time = float(times[0])
        fresh = []
        clock = last_decode = float(times[m - 1])
        decoded += m
        _seen(held, waiting, clock, front)
        if traced is not None:
            clocks.extend(times[:m].tolist())
        while running and running[0][0] < decoded:
            index = heapq.heappop(running)[1]
            r = live.pop(index)
            if index not in warm:
                tally.itl.add_one((r.first_decode_time - r.first) / r.first_tokens, r.first_tokens)
            _tallied(tally, index in warm, r.arrival, r.first, clock, r.output_tokens)
            pooled.record(r.arrival, clock, r.output_tokens)
            if traced is not None:
                item, step, first = traces.pop(index)
                traced(_trace(item, first, np.array(clocks[step : step + item[4].size])))
    gaps.flush()
    return Counts(draws.histogram, draws.request_steps, draws.drafting_steps)


def _tallied(
    tally: Tally, warm: bool, arrival: float, first: float, finish: float, outputs: int
) -> None:
    """A finished request in ``tally``: a warm-up one in its totals only."""
    if warm:
        tally.record(arrival, finish, outputs)
    else:
        tally.add(arrival, first, finish, outputs)


def _seen(held: list[Item], waiting: deque[Item], clock: float, front: float) -> None:
    """Move the held requests the engine has seen by ``clock`` (arrived ``front`` before it;
    in arrival order) to waiting."""
    while held and held[0][1] + front <= clock:
        waiting.append(held.pop(0))


def _trace(item: Item, first: float, step_times: np.ndarray) -> Trace:
    index, arrival, inputs, outputs, emitted, _, drafting, accepted = item
    return Trace(index, arrival, inputs, outputs, first, step_times, emitted, drafting, accepted)
