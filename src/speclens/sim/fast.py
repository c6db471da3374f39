"""The event-level fast path: the step-exact loop's schedule and prices, advanced a stretch of
decode steps at a time.

Under forced acceptance a request's draws do not depend on who shares its batch: each decode
request-step drafts with probability ``coverage`` and then accepts j drafts with probability
r_j - r_(j+1). So a request's whole trajectory (tokens per step, drafts, context) is drawn when it
is admitted, and what it adds to every future decode step (a sequence, its context, whether it
drafts: a drafting one verifies K + 1 slots) is added to windows indexed by decode step; a
stretch of steps is priced from those sums at once (``decode``), so any step cost works, affine
or a roofline. With every running request in every decode step (``unsupported`` says when that
holds), the batch changes only when a request finishes, is admitted or is preempted: between
those events the engine's clock is a cumulative sum over the window. Prefill steps, admission
(``max_num_seqs``, the token budget, room in the KV cache), preemption (a step's requests need
more KV blocks than the cache has: the last admitted goes back to the queue's front, to be
recomputed), closed and open loops and idle gaps follow the engine's scheduler and
``simulate._run_replica`` step for step: without speculation (nothing drawn) the two loops
give the same figures.

With a spread (``RequestSpread``) each request accepts at its own AL, the one the engine's
forced stream draws for the same request id (a pure function of the seed and the id), so both
loops give request i the same AL; only its steps' draws differ.

The draws are numpy's, not the engine's torch stream, so results match the exact loop in
distribution (tests/sim/test_fast.py), not draw for draw. No torch is imported here.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

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
#: Most window cells of requests' blocks (``_block``) held at a time: 16 MB.
BLOCK_CELLS = 1 << 21
#: Longest stretch of decode steps priced a step at a time, as Python numbers: pricing arrays
#: costs a roofline about what 20 steps a step at a time do (32 ran the example fastest).
SHORT = 32
#: The window's columns, a row a decode step: its sequences, context tokens, requests that
#: draft (each verifies K + 1 slots, the others 1), KV blocks needed, and from ``TOKENS`` on
#: its later-step requests by the tokens they emit (column ``TOKENS + e``, e = 0..K + 1).
SEQS, CONTEXT, DRAFTING, NEED, TOKENS = range(5)


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
    if max_num_batched_tokens // (k + 1) < seqs:
        return "a decode step's token budget below max_num_seqs (requests would wait a step)"
    return None


def may_preempt(
    k: int, max_num_seqs: int, kv_cache_tokens: int, longest: int, share: int
) -> str | None:
    """Why the KV cache may fill, whatever the draws (``max_num_seqs`` requests of the replica's
    ``share``, each at its ``longest`` with its K + 1 verify slots, hold more than it), or
    None: then no request is ever preempted or held back for room, and the fast path needs no
    check of the cache as it runs."""
    seqs = max(1, min(max_num_seqs, share))
    held = -(-(longest + k + 1) // BLOCK_SIZE) * BLOCK_SIZE * seqs
    if kv_cache_tokens < held:
        return (
            f"kv_cache_tokens {kv_cache_tokens:,} below {held:,} "
            "(the KV cache may preempt requests)"
        )
    return None


class Preempted(Exception):
    """The KV cache fills on this run's draws while every decode step's end is kept for the
    records (``traced``): a preempted request's steps would not be one stretch, which a
    ``Trace`` cannot hold, so the caller runs the step-exact loop. Raised as soon as found."""

    def __init__(self, step: int, need: int, blocks: int) -> None:
        self.pool: int | None = None  # the pool it ran in, set by the caller
        super().__init__(
            f"the KV cache fills at decode step {step:,} ({need:,} blocks needed of {blocks:,}), "
            "and a run that keeps records takes the step-exact loop where a request is preempted"
        )


#: A request (index, arrival, input tokens, output tokens) with its trajectory: per decode step
#: the tokens emitted, the context it attends over (drafts included), whether it drafted and the
#: drafts it accepted; and its ``_block``, what it adds to the window.
Item = tuple[int, float, int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
#: A request's trajectory as ``Trajectories`` draws it: emitted, context, drafted, accepted.
Drawn = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


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
    preemptions: int = 0


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


def _variance(cdf: np.ndarray, coverage: float) -> Any:
    """The variance of a decode step's tokens (1, plus the drafts accepted when it drafts, with
    probability ``coverage``) under each row of ``cdf`` (``_cdf``): from the tail sums
    E[a] = sum P(a > j) and E[a^2] = sum (2j + 1) P(a > j), j = 0..K - 1."""
    tail = 1.0 - cdf[..., :-1]
    accepted = tail.sum(axis=-1)
    squared = (tail * (2 * np.arange(tail.shape[-1]) + 1)).sum(axis=-1)
    return np.maximum(coverage * squared - (coverage * accepted) ** 2, 0.0)


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
        self.variance = _variance(self.cdf, self.coverage)
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
        cdfs, variance = None, self.variance
        mean_tokens: float | np.ndarray = self.mean_tokens
        if self.spread is not None:
            own = [self.spread.rates_of(i) for i in indices]
            cdfs = np.array([_cdf(r, self.k) for r in own]).reshape(need.size, self.k + 1)
            mean_tokens = 1.0 + self.coverage * np.array([math.fsum(r) for r in own])
            variance = _variance(cdfs, self.coverage)
        # Steps drawn: enough for all but about 1 in 30,000 requests (4 standard deviations of
        # the steps that emit ``need`` tokens, plus 8); one short is extended below.
        spread = 4 * np.sqrt(need * variance / mean_tokens**3)
        lengths = np.minimum(need, (need / mean_tokens + spread + 8).astype(int))
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
    requests: Iterable[tuple[int, float, int, int]],
    draws: Trajectories,
    longest_output: int,
    k: int,
) -> Iterator[Item]:
    """``requests`` in order, each with its trajectory and block, drawn a group at a time (at
    most about ``DRAW_STEPS`` request-steps held) and blocked a part at a time (at most about
    ``BLOCK_CELLS`` cells)."""
    stream = iter(requests)
    longest = max(1, longest_output)
    group = max(1, min(4096, DRAW_STEPS // longest))
    part = max(1, BLOCK_CELLS // (longest * (TOKENS + k + 2)))
    while chunk := list(itertools.islice(stream, group)):
        table = np.array([r[2:] for r in chunk], dtype=np.int64)
        indices = [r[0] for r in chunk]
        drawn = zip(chunk, draws.trajectories(table[:, 0], table[:, 1], indices), strict=True)
        while pairs := list(itertools.islice(drawn, part)):
            yield from _blocked(pairs, k)


def _blocked(pairs: list[tuple[tuple[int, float, int, int], Drawn]], k: int) -> Iterator[Item]:
    """Each request with its trajectory and its rows of one block built for them all (a
    block a request would cost several numpy calls each)."""
    sizes = [drawn[0].size for _, drawn in pairs]
    ends = np.cumsum(sizes)
    starts = ends - sizes
    emitted, context, drafted = (np.concatenate([d[j] for _, d in pairs]) for j in range(3))
    later = np.ones(emitted.size, dtype=bool)
    later[starts[np.asarray(sizes) > 0]] = False  # each request's first step
    block = _block(emitted, context, drafted, later, k)
    for (request, drawn), first, end in zip(pairs, starts.tolist(), ends.tolist(), strict=True):
        yield (*request, *drawn, block[first:end])


def _block(
    emitted: np.ndarray, context: np.ndarray, drafted: np.ndarray, later: np.ndarray, k: int
) -> np.ndarray:
    """What requests add to the window at their decode steps (the window's columns, a row a
    step): a sequence, its context, whether it drafts, the KV blocks it needs (its tokens so
    far plus K slots, as the engine's scheduler reserves them), and at its ``later`` steps (past
    its first) a count in its emitted tokens' column. Admitting a request is then one add."""
    block = np.zeros((emitted.size, TOKENS + k + 2), dtype=np.int64)
    block[:, SEQS] = 1
    block[:, CONTEXT] = context
    block[:, DRAFTING] = drafted
    block[:, NEED] = _blocks(context - k * drafted + k)
    rows = np.flatnonzero(later)
    block[rows, TOKENS + emitted[rows]] = 1
    return block


@dataclass
class _Live:
    arrival: float
    output_tokens: int
    first: float
    first_tokens: int  # emitted at its first decode step (since it was last admitted)
    first_decode_time: float = 0.0
    last: float = 0.0  # when it emitted its latest token before that step
    start: int = 0  # that step
    item: Item | None = None  # its decode steps from there
    blocks: np.ndarray | None = None  # with a KV check: the blocks it needs at each of them
    ticket: int = 0  # which admission it is in


def _blocks(tokens: int | np.ndarray) -> Any:
    """KV blocks that hold ``tokens`` positions."""
    return -(-tokens // BLOCK_SIZE)


class _Itl:
    """ITL samples of requests past their first decode step: each decode step's end is kept
    until its window rows leave (a slide, or the run's end); then each step's gap, over the
    tokens each of its requests emitted (its row's counts by tokens), is a sample per token."""

    def __init__(self, tally: Tally, k: int) -> None:
        self.tally = tally
        self.per = np.arange(1, k + 2)
        self.ends: list[float] = []  # the kept decode steps' ends
        self.last = 0.0  # the end of the decode step before them

    def flush(self, counts: np.ndarray) -> None:
        """Sample the kept steps, ``counts`` their rows' counts by tokens 1..K + 1."""
        if self.ends:
            gaps = np.diff(np.array(self.ends), prepend=self.last)
            self.last, self.ends = self.ends[-1], []
            self.tally.itl.add((gaps[:, None] / self.per).ravel(), (counts * self.per).ravel())


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
    kv_blocks: int | None = None,
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
    each request draws at its own AL (``RequestSpread``) instead of every one at ``rates``;
    ``kv_blocks``: the engine's KV blocks (``BLOCK_SIZE`` tokens each): a request is admitted
    only with room for its prompt and first verify slots, and at a decode step whose requests
    need more (each its tokens so far plus K slots, as the engine's scheduler reserves them)
    the last admitted are preempted (``_preempt``; with ``traced``, ``Preempted`` is raised
    instead). A request's need only grows until it finishes, so it is checked per decode step
    from a window like the others. None: not checked (``may_preempt`` proved it fits on any
    draws)."""
    if draws is None:
        draws = _Draws(k, rates, coverage, rng, spread)
    span = longest_output + 2
    width = 4 * span
    window = np.zeros((width, TOKENS + k + 2), dtype=np.int64)  # a row a decode step
    # Its columns (views): what ``_preempt`` takes a victim's steps out of.
    columns = (window[:, SEQS], window[:, CONTEXT], window[:, DRAFTING], window[:, NEED],
               window[:, TOKENS:])  # fmt: skip
    price_rows = _row_pricer(cost, k)
    # A prefill's price by its counts, kept: a closed loop's prefills take one prompt of a
    # length the workload draws from a range, so few counts recur.
    prefill = functools.lru_cache(maxsize=1 << 16)(cost.prefill)
    base = 0  # the decode step at row 0 of the window
    decoded = 0  # decode steps run so far
    clock = 0.0
    last_decode = 0.0  # when the latest decode step ended
    stream: Iterator[Item] = _prepared(requests, draws, longest_output, k)
    upcoming = next(stream, None)
    waiting: deque[Item] = deque()
    held: list[Item] = []  # closed loop: arrived just after the step boundary another left at
    running: list[tuple[int, int, int]] = []  # heap of (last decode step, index, ticket)
    live: dict[int, _Live] = {}  # the running requests, in the order they were admitted
    paused: dict[int, _Live] = {}  # preempted, waiting to be recomputed
    fresh: list[_Live] = []  # admitted since the last decode step
    itl = _Itl(tally, k)
    clocks: list[float] = []  # with ``traced``: when each decode step ended
    traces: dict[int, tuple[Item, int, float]] = {}  # with ``traced``: item, first step, first
    warm: set[int] = set()  # the warm-up's request indices
    holding = 0  # with ``kv_blocks``: the blocks the running requests hold
    preemptions = 0
    tickets = itertools.count()
    while upcoming is not None or waiting or live or held:
        while upcoming is not None and (
            (concurrency is None and upcoming[1] + front <= clock)
            or (concurrency is not None and len(waiting) + len(held) + len(live) < concurrency)
        ):
            if len(warm) < warmup:
                warm.add(upcoming[0])
            if concurrency is not None:  # closed loop: it arrives as another leaves
                held.append((upcoming[0], clock, *upcoming[2:]))
            else:
                waiting.append(upcoming)
            upcoming = next(stream, None)
        if held and not live and not waiting:  # an idle engine takes them as they come
            clock = max(clock, held[0][1] + front)
            _seen(held, waiting, clock, front)
        if not waiting and not live:
            assert upcoming is not None
            clock = max(clock, upcoming[1] + front)
            continue
        batch: list[Item] = []
        if waiting and len(live) < max_num_seqs:  # a prefill step, if one fits
            budget = max_num_batched_tokens
            while waiting and len(live) + len(batch) < max_num_seqs:
                if waiting[0][2] > budget:
                    break
                if kv_blocks is not None:  # room for the prompt and its first verify slots
                    if _blocks(waiting[0][2] + k + 1) > kv_blocks - holding:
                        break
                    holding += _blocks(waiting[0][2])
                budget -= waiting[0][2]
                batch.append(waiting.popleft())
            assert batch or live, "a prompt never exceeds the token budget or the cache"
        if batch:
            prompt = sum(r[2] for r in batch)
            computed = prompt - sum(cached.get(r[0], 0) for r in batch) if cached else prompt
            clock += prefill(computed, len(batch), prompt)  # as the sim executor's prefill
            if decoded - base >= 2 * span:  # slide the window: no live request reaches back
                shift = decoded - base
                itl.flush(window[:shift, TOKENS + 1 :])
                window[: width - shift] = window[shift:]
                window[width - shift :] = 0
                base = decoded
            for item in batch:
                index, arrival, inputs, outputs, emitted, _, _, _, block = item
                n = emitted.size
                r = paused.pop(index, None)
                if r is not None and index not in warm:  # its recompute emits a token
                    tally.itl.add_one(clock - r.last, 1)
                if not n:  # its last output token: done at its prefill
                    holding -= _blocks(inputs) if kv_blocks is not None else 0
                    first = clock if r is None else r.first
                    _tallied(tally, index in warm, arrival, first, clock, outputs)
                    pooled.record(arrival, clock, outputs)
                    if traced is not None:
                        traced(_trace(item, clock, np.empty(0)))
                    continue
                if traced is not None:
                    traces[index] = (item, decoded, clock)
                rows = window[decoded - base : decoded - base + n]
                if index in warm:  # no later steps' ITL samples
                    rows[:, :TOKENS] += block[:, :TOKENS]
                else:
                    rows += block
                if r is None:
                    r = _Live(arrival, outputs, clock, 0)
                r.last, r.first_tokens, r.start = clock, int(emitted[0]), decoded
                r.item, r.ticket = item, next(tickets)
                r.blocks = block[:, NEED] if kv_blocks is not None else None
                live[index] = r
                fresh.append(r)
                heapq.heappush(running, (decoded + n - 1, index, r.ticket))
            _seen(held, waiting, clock, front)  # arrived as this step began: join after it
            continue
        at = decoded - base
        if kv_blocks is not None and window[at, NEED] > kv_blocks:  # the engine preempts to fit
            if traced is not None:
                raise Preempted(decoded, int(window[at, NEED]), kv_blocks)
            before = len(live)
            holding -= _preempt(live, paused, waiting, fresh, decoded, kv_blocks, k, draws,
                                columns, base, last_decode, warm, tally)  # fmt: skip
            preemptions += before - len(live)
        while running[0][1] not in live or live[running[0][1]].ticket != running[0][2]:
            heapq.heappop(running)  # a preempted request's old finish
        # A stretch of decode steps with the same requests: to the next finish, or to the
        # next arrival when it could be admitted at once (open loop, a sequence free), or to
        # the step before the cache would fill.
        m = running[0][0] - decoded + 1
        if kv_blocks is not None:
            over = np.flatnonzero(window[at : at + m, NEED] > kv_blocks)
            m = int(over[0]) if over.size else m
        times = _ends(window[at : at + m], clock, cost, price_rows, k)
        if concurrency is None and upcoming is not None and len(live) < max_num_seqs:
            m = min(m, bisect.bisect_left(times, upcoming[1] + front) + 1)
        if held:  # they join after the step under way when the engine sees them
            m = min(m, bisect.bisect_left(times, held[0][1] + front) + 1)
        del times[m:]
        itl.ends += times
        for r in fresh:
            r.first_decode_time = times[0]
        fresh = []
        clock = last_decode = times[-1]
        decoded += m
        if kv_blocks is not None:  # what the requests of the last step reserved
            holding = int(window[at + m - 1, NEED])
        _seen(held, waiting, clock, front)
        if traced is not None:
            clocks += times
        while running and running[0][0] < decoded:
            _, index, ticket = heapq.heappop(running)
            r = live[index] if index in live and live[index].ticket == ticket else None
            if r is None:
                continue  # preempted since
            del live[index]
            if r.blocks is not None:
                holding -= int(r.blocks[-1])
            if index not in warm:
                tally.itl.add_one((r.first_decode_time - r.last) / r.first_tokens, r.first_tokens)
            _tallied(tally, index in warm, r.arrival, r.first, clock, r.output_tokens)
            pooled.record(r.arrival, clock, r.output_tokens)
            if traced is not None:
                item, step, first = traces.pop(index)
                traced(_trace(item, first, np.array(clocks[step : step + item[4].size])))
    itl.flush(window[: decoded - base, TOKENS + 1 :])
    return Counts(draws.histogram, draws.request_steps, draws.drafting_steps, preemptions)


def _row_pricer(cost: Pricing, k: int) -> Callable[[list[list[int]]], list[float]]:
    """What prices a short stretch's steps, given as rows of (requests, context tokens,
    drafting requests): the cost's own ``decode_rows`` where it has one (a roofline: one call
    for them all), else ``decode`` a step at a time."""
    rows_priced = getattr(cost, "decode_rows", None)
    if rows_priced is not None:
        return lambda rows: rows_priced(rows, k)
    return lambda rows: [float(cost.decode(s + k * d, s, c, d, k)) for s, c, d in rows]


def _ends(
    rows: np.ndarray, clock: float, cost: Pricing, price_rows: Callable[..., list[float]], k: int
) -> list[float]:
    """When each of a stretch's decode steps (``rows`` of the window) ends, from ``clock``,
    added step by step as the engine's clock is. Up to ``SHORT`` steps are priced as Python
    numbers (an array call's fixed cost is many steps' own), a longer stretch as arrays."""
    if len(rows) <= SHORT:
        times, end = [], clock
        for price in price_rows(rows[:, :NEED].tolist()):
            end += price
            times.append(end)
        return times
    seqs, drafting = rows[:, SEQS], rows[:, DRAFTING]
    priced = cost.decode(seqs + k * drafting, seqs, rows[:, CONTEXT], drafting, k)
    prices = np.array(priced, dtype=float) if np.ndim(priced) else np.full(len(rows), priced)
    prices[0] += clock
    return list(prices.cumsum().tolist())


def _preempt(
    live: dict[int, _Live], paused: dict[int, _Live], waiting: deque[Item], fresh: list[_Live],
    step: int, kv_blocks: int, k: int, draws: Trajectories,
    windows: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], base: int,
    last_decode: float, warm: set[int], tally: Tally,
) -> int:  # fmt: skip
    """The engine's scheduler at decode step ``step`` when its requests need more than
    ``kv_blocks``: in admission order each reserves its need, and while one cannot, the most
    recently admitted is preempted (its blocks freed, back to the front of the queue to be
    recomputed from its prompt and output so far, which emits its next token). Each victim
    leaves the windows from ``step`` and waits with the rest of its drawn steps, capped anew
    (steps it no longer takes leave the draws' counts). Returns the blocks freed."""
    seqs, contexts, drafting, need, tokens = windows
    order = list(live)
    needs, holds = [], []
    for index in order:
        r = live[index]
        assert r.blocks is not None and r.item is not None
        rel = step - r.start
        needs.append(int(r.blocks[rel]))
        holds.append(int(r.blocks[rel - 1]) if rel else int(_blocks(r.item[2])))
    n, j, used, rest = len(order), 0, 0, sum(holds[1:])
    while j < n:
        while used + needs[j] + rest > kv_blocks:
            n -= 1
            if n == j:
                break
            rest -= holds[n]
        if n == j:
            break
        used, j = used + needs[j], j + 1
        if j < n:
            rest -= holds[j]
    freed = 0
    for index in reversed(order[n:]):  # the last admitted first, each to the queue's front
        r = live.pop(index)
        assert r.blocks is not None and r.item is not None
        _, arrival, _, outputs, emitted, context, drafted, accepted, *_ = r.item  # no block
        rel, size = step - r.start, emitted.size
        freed += int(r.blocks[rel - 1]) if rel else int(_blocks(r.item[2]))
        a, e = step - base, r.start - base + size
        seqs[a:e] -= 1
        contexts[a:e] -= context[rel:]
        drafting[a:e] -= drafted[rel:]
        need[a:e] -= r.blocks[rel:]
        if index not in warm:
            later = max(rel, 1)
            tokens[np.arange(r.start - base + later, e), emitted[later:]] -= 1
        if rel:  # its first decode step since admission ran: its ITL sample now
            if index not in warm:
                tally.itl.add_one((r.first_decode_time - r.last) / r.first_tokens, r.first_tokens)
            r.last = last_decode
        else:
            fresh.remove(r)
        tokens_now = int(context[rel] - k * drafted[rel])  # its prompt and output so far
        remaining = int(emitted[rel:].sum()) - 1  # after the recompute's token
        gained = 1 + accepted[rel:]
        total = np.cumsum(gained)
        steps = int(np.searchsorted(total, remaining, side="left")) + 1 if remaining else 0
        dropped = slice(rel + steps, size)
        if k and dropped.start < dropped.stop:  # drawn, counted, and now never taken
            counted = drafted[dropped].astype(bool)
            draws.histogram -= np.bincount(accepted[dropped][counted], minlength=k + 1)
            draws.request_steps -= dropped.stop - dropped.start
            draws.drafting_steps -= int(counted.sum())
        own = gained[:steps].copy()
        if steps:
            own[-1] -= int(total[steps - 1]) - remaining
        before = (total - gained)[:steps]
        context = tokens_now + 1 + before + drafted[rel : rel + steps] * k
        drafted = drafted[rel : rel + steps]
        block = _block(own, context, drafted, np.arange(steps) > 0, k)
        waiting.appendleft((index, arrival, tokens_now, outputs, own, context, drafted,
                            accepted[rel : rel + steps], block))  # fmt: skip
        paused[index] = r
    return freed


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
    index, arrival, inputs, outputs, emitted, _, drafting, accepted, _ = item
    return Trace(index, arrival, inputs, outputs, first, step_times, emitted, drafting, accepted)
