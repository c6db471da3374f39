"""A published benchmark point's load, simulated in steps and priced afterwards.

A serving benchmark at concurrency c keeps c requests in flight: each client sends its next
request the moment its last one finishes. The engine's schedule (which requests prefill and
decode in each step) then depends on step counts only, never on how long a step takes: a request
arrives at the end of the step that finished its predecessor. So ``schedule`` runs the loop once,
in steps, and ``Schedule.price`` prices it under any step cost as numpy arrays: a fit that tries a
thousand parameter sets schedules once and prices a thousand times.

The loop is the benchmark's (InferenceX runs vLLM's ``benchmark_serving``): ``10 c`` requests
from an idle engine, prompt and output lengths uniform on [0.8 L, L] (``--random-range-ratio
0.8``: the published points' token throughputs put the mean at 0.9 L), every request measured
(the warm-up requests ran before and are not part of it). Two schedulers:

- ``separate`` (SGLang's and ATOM's default): waiting prompts are prefilled in steps of their own,
  up to ``budget`` tokens a step (a longer prompt in chunks), while the decodes wait;
- ``mixed`` (TensorRT-LLM's and vLLM's chunked prefill): every step decodes every running request
  and fills what is left of its ``budget`` with prompt chunks.

A speculating request verifies K + 1 positions a step and emits ``acceptance_length`` tokens a
step on average (the forced schedule's mean), so it needs ceil((output - 1) / AL) decode steps.

What the client adds beyond the engine's steps (HTTP, tokenizing: ``front`` seconds) is added to
each request's TTFT and E2E, and to each client's cycle when the throughput is worked out.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from speclens.cost import Pricing

#: Requests a point sends per unit of concurrency (``--num-prompts 10 x conc``).
PROMPTS_PER_CLIENT = 10
#: The lengths' spread: uniform on [RANGE_RATIO x L, L].
RANGE_RATIO = 0.8
#: Prompt tokens a step may carry (SGLang's chunked-prefill size on these chips).
BUDGET = 16384
#: The most requests, and the most steps, one point may schedule (bounds time and memory).
MAX_REQUESTS = 200_000
MAX_STEPS = 20_000_000

Scheduler = Literal["separate", "mixed"]


@dataclass(frozen=True)
class Load:
    """One benchmark point's load."""

    concurrency: int
    input_tokens: int
    output_tokens: int
    num_spec_tokens: int = 0
    acceptance_length: float = 1.0
    scheduler: Scheduler = "separate"
    budget: int = BUDGET
    requests: int | None = None  # None: PROMPTS_PER_CLIENT x concurrency
    seed: int = 0

    def problems(self) -> list[str]:
        out = []
        for name in ("concurrency", "input_tokens", "output_tokens", "budget"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                out.append(f"{name}: expected an integer >= 1, got {value!r}")
        k, al = self.num_spec_tokens, self.acceptance_length
        if not isinstance(k, int) or k < 0:
            out.append(f"num_spec_tokens: expected an integer >= 0, got {k!r}")
        elif not (isinstance(al, int | float) and 1.0 <= al <= k + 1):
            out.append(f"acceptance_length: expected a number in [1, {k + 1}], got {al!r}")
        if self.count > MAX_REQUESTS:
            out.append(f"requests: {self.count:,}, at most {MAX_REQUESTS:,}")
        return out

    @property
    def count(self) -> int:
        return self.requests if self.requests is not None else PROMPTS_PER_CLIENT * self.concurrency


@dataclass(frozen=True)
class Schedule:
    """The steps a point's load runs, in stretches, and where each request's life falls in them.

    A stretch is ``n`` steps of one composition: the decoding requests, their verify tokens and
    context (at its first step, growing by ``growth`` a step), the prompt tokens prefilled (and
    their causal pairs: each chunk's tokens times the prompt before it plus half the chunk), and
    the prefilling requests. A step's price is affine in its context for a fixed composition
    (a roofline's attention is a max of two terms proportional to it; a linear cost is linear),
    so a stretch is priced at its first and last step. Per request: the stretches ended at its
    arrival, the stretch that emitted its first token, and the one that emitted its last: every
    request's arrival, first and last token fall on a stretch's end."""

    load: Load
    n: np.ndarray
    decoding: np.ndarray
    verify_tokens: np.ndarray
    context: np.ndarray
    growth: np.ndarray
    prefill_tokens: np.ndarray
    prefill_requests: np.ndarray
    prefill_pairs: np.ndarray
    prefill_before: np.ndarray  # prompt tokens already in KV before the chunk, summed
    arrival: np.ndarray
    first: np.ndarray
    last: np.ndarray
    inputs: np.ndarray
    outputs: np.ndarray

    @property
    def steps(self) -> int:
        return int(self.n.sum())

    def _step(self, cost: Pricing, context: np.ndarray) -> np.ndarray:
        """One step's seconds of each stretch at the given context (a decode step with its K
        drafter forwards; a prefill step; a mixed step)."""
        k = self.load.num_spec_tokens
        d, p = self.decoding, self.prefill_tokens
        seconds = np.zeros(len(d))
        drafting = d * (k > 0)
        decode_only, prefill_only, both = (d > 0) & (p == 0), (d == 0) & (p > 0), (d > 0) & (p > 0)
        if decode_only.any():
            m = decode_only
            seconds[m] = cost.decode(self.verify_tokens[m], d[m], context[m], drafting[m], k)
        if prefill_only.any():
            m = prefill_only
            seconds[m] = cost.prefill(p[m], self.prefill_requests[m], self._prompt_context(m))
        if both.any():
            m = both
            mixed = getattr(cost, "mixed", None)
            if mixed is not None:
                before = self.prefill_before[m] / np.maximum(self.prefill_requests[m], 1.0)
                seconds[m] = mixed(self.verify_tokens[m], d[m], context[m], p[m],
                                   self.prefill_requests[m], before, drafting[m], k)  # fmt: skip
            else:
                seconds[m] = cost.decode(
                    self.verify_tokens[m] + p[m], d[m] + self.prefill_requests[m],
                    context[m] + self._prompt_context(m), drafting[m], k)  # fmt: skip
        return seconds

    def _prompt_context(self, m: np.ndarray) -> np.ndarray:
        """The prefilled prompts' context as a step cost takes it (their requests times the mean
        context a prompt token attends over, causal: the prompt before it)."""
        p = np.maximum(self.prefill_tokens[m], 1.0)
        context: np.ndarray = self.prefill_requests[m] * self.prefill_pairs[m] / p
        return context

    def price(self, cost: Pricing) -> np.ndarray:
        """Each stretch's seconds under ``cost``: its steps at their mean price (the mean of its
        first and last step's, the price being affine in context within a stretch)."""
        head = self._step(cost, self.context)
        many = self.n > 1
        tail = head.copy()
        if many.any():
            tail[many] = self._step(cost, self.context + self.growth * (self.n - 1))[many]
        out: np.ndarray = self.n * (head + tail) / 2
        return out

    def figures(self, cost: Pricing, front: float = 0.0, gpus: int = 1) -> Figures:
        """The point's published figures under ``cost``."""
        return self.figures_of(self.price(cost), front, gpus)

    def figures_of(self, seconds: np.ndarray, front: float = 0.0, gpus: int = 1) -> Figures:
        ends = np.cumsum(seconds)
        starts = np.where(self.arrival > 0, ends[np.maximum(self.arrival - 1, 0)], 0.0)
        first, last = ends[self.first], ends[self.last]
        ttft = first - starts + front
        decoded = np.maximum(self.outputs - 1, 1)
        tpot = np.where(self.outputs > 1, (last - first) / decoded, 0.0)
        e2e = last - starts + front
        cycles = math.ceil(len(self.outputs) / self.load.concurrency)
        duration = float(ends[-1]) + front * cycles
        decode = self.decoding > 0
        itl = (seconds[decode] / self.n[decode], self.n[decode]) if decode.any() else (
            seconds / self.n, self.n)  # fmt: skip
        return Figures(
            ttft_s=ttft, tpot_s=tpot[self.outputs > 1], e2e_s=e2e, itl_s=itl[0], itl_weights=itl[1],
            duration_s=duration, input_tokens=int(self.inputs.sum()),
            output_tokens=int(self.outputs.sum()), gpus=gpus,
        )  # fmt: skip


@dataclass(frozen=True)
class Figures:
    """A simulated point's per-request latencies (seconds), its duration and its tokens."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray
    itl_s: np.ndarray  # a decode step's mean seconds, per stretch
    itl_weights: np.ndarray  # the stretch's steps
    duration_s: float
    input_tokens: int
    output_tokens: int
    gpus: int

    @property
    def median_tpot_s(self) -> float:
        return float(np.median(self.tpot_s)) if len(self.tpot_s) else 0.0

    @property
    def median_ttft_s(self) -> float:
        return float(np.median(self.ttft_s))

    @property
    def throughput_per_gpu(self) -> float:
        """Input and output tokens a second, per GPU (InferenceX's ``tput_per_gpu``)."""
        return (self.input_tokens + self.output_tokens) / self.duration_s / self.gpus

    def summary_figures(self) -> dict[str, Any]:
        """The figures block of an aggregate-only run's summary.json (milliseconds)."""

        def stats(values: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float]:
            """Mean and quantiles in ms: numpy's (the median the fit reads), or, for ITL's
            per-stretch step times, weighted by the stretch's steps."""
            ms = 1e3 * np.asarray(values, dtype=float)
            if not len(ms):
                return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
            if weights is None:
                p50, p90, p99 = np.quantile(ms, [0.5, 0.9, 0.99]).tolist()
                return {"mean": float(ms.mean()), "p50": p50, "p90": p90, "p99": p99}
            w = np.asarray(weights, dtype=float)
            order = np.argsort(ms)
            share = np.cumsum(w[order]) / w.sum()

            def q(level: float) -> float:
                return float(ms[order][min(int(np.searchsorted(share, level)), len(ms) - 1)])

            return {"mean": float(np.average(ms, weights=w)), "p50": q(0.5), "p90": q(0.9),
                    "p99": q(0.99)}  # fmt: skip

        total = (self.input_tokens + self.output_tokens) / self.duration_s
        output = self.output_tokens / self.duration_s
        tpot = self.tpot_s[self.tpot_s > 0]
        users = 1.0 / tpot if len(tpot) else np.zeros(0)
        return {
            "aggregate_only": True,
            "latency_ms": {"ttft": stats(self.ttft_s), "tpot": stats(self.tpot_s),
                           "itl": stats(self.itl_s, self.itl_weights), "e2e": stats(self.e2e_s)},
            "throughput": {
                "output_tokens_per_s": output, "total_tokens_per_s": total,
                "output_tokens_per_s_per_gpu": output / self.gpus,
                "total_tokens_per_s_per_gpu": total / self.gpus,
            },
            "interactivity": {"p50": float(np.median(users)) if len(users) else 0.0,
                              "mean": float(users.mean()) if len(users) else 0.0},
        }  # fmt: skip


def lengths(load: Load) -> tuple[np.ndarray, np.ndarray]:
    """The point's prompt and output lengths, drawn as its benchmark drew them (seeded)."""
    rng = np.random.default_rng(load.seed)
    n = load.count

    def draw(length: int) -> np.ndarray:
        low = max(1, math.floor(RANGE_RATIO * length))
        return rng.integers(low, length + 1, size=n)

    return draw(load.input_tokens), draw(load.output_tokens)


class _Stretches:
    """The growing per-stretch columns: a stretch is ``n`` steps of one composition, its context
    growing by ``growth`` a step."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, ...]] = []
        self.steps = 0

    def add(self, n: int, decoding: int, verify: int, context: float, growth: float,
            prefill: tuple[int, int, float, float] = (0, 0, 0.0, 0.0)) -> None:  # fmt: skip
        if self.steps + n > MAX_STEPS:
            raise ValueError(f"steps: more than {MAX_STEPS:,} (a point this long is refused)")
        self.rows.append((n, decoding, verify, context, growth, *prefill))
        self.steps += n

    @property
    def count(self) -> int:
        return len(self.rows)

    def arrays(self) -> np.ndarray:
        return np.array(self.rows, dtype=float).reshape(-1, 9)


def schedule(load: Load) -> Schedule:
    """Run ``load``'s closed loop in steps (see the module)."""
    problems = load.problems()
    if problems:
        raise ValueError("; ".join(problems))
    inputs, outputs = lengths(load)
    k, al = load.num_spec_tokens, float(load.acceptance_length)
    width = k + 1 if k else 1
    n, c = load.count, load.concurrency
    arrival, first, last = (np.zeros(n, dtype=np.int64) for _ in range(3))
    # Per slot: its request (-1: idle), prompt tokens left to prefill, decode steps left, context.
    slot_req = np.full(c, -1, dtype=np.int64)
    left_prompt = np.zeros(c, dtype=np.int64)
    left_steps = np.zeros(c, dtype=np.int64)
    context = np.zeros(c, dtype=float)
    waiting: deque[int] = deque()
    steps = _Stretches()
    sent = 0

    def send(slot: int) -> None:
        nonlocal sent
        if sent >= n:
            slot_req[slot] = -1
            return
        slot_req[slot], arrival[sent] = sent, steps.count
        left_prompt[slot], context[slot] = inputs[sent], 0.0
        waiting.append(slot)
        sent += 1

    def finish(slots: np.ndarray) -> None:
        for slot in slots.tolist():
            last[slot_req[slot]] = steps.count - 1
            send(slot)

    for slot in range(c):
        send(slot)
    decoding = np.zeros(c, dtype=bool)
    while (slot_req >= 0).any():
        if waiting:
            mixed = load.scheduler == "mixed"
            d = int(decoding.sum()) if mixed else 0
            room = max(load.budget - (d * width if mixed else 0), 1)
            tokens, requests, pairs, prior, done = 0, 0, 0.0, 0.0, []
            while waiting and room > 0:
                slot = waiting[0]
                chunk = int(min(left_prompt[slot], room))
                before = inputs[slot_req[slot]] - left_prompt[slot]
                pairs += chunk * (before + chunk / 2)
                prior += before
                tokens, requests, room = tokens + chunk, requests + 1, room - chunk
                left_prompt[slot] -= chunk
                if left_prompt[slot] == 0:
                    done.append(waiting.popleft())
            ctx = float(context[decoding].sum()) if mixed else 0.0
            steps.add(1, d, d * width, ctx, 0.0, (tokens, requests, pairs, prior))
            ended = []
            if mixed and d:
                left_steps[decoding] -= 1
                context[decoding] += al
                ended = np.flatnonzero(decoding & (left_steps <= 0)).tolist()
                decoding[ended] = False
            for slot in done:
                r = slot_req[slot]
                first[r] = steps.count - 1
                context[slot] = inputs[r] + 1
                left_steps[slot] = math.ceil((outputs[r] - 1) / al) if outputs[r] > 1 else 0
                if left_steps[slot] > 0:
                    decoding[slot] = True
                else:
                    ended.append(slot)
            finish(np.array(ended, dtype=np.int64))
            continue
        live = np.flatnonzero(decoding)
        stretch = int(left_steps[live].min())
        d = len(live)
        steps.add(stretch, d, d * width, float(context[live].sum()), al * d)
        left_steps[live] -= stretch
        context[live] += al * stretch
        ended_mask = decoding & (left_steps <= 0)
        decoding &= ~ended_mask
        finish(np.flatnonzero(ended_mask))
    n_, d_, v_, c_, g_, pt, pr, pp, pb = steps.arrays().T
    return Schedule(load, n_, d_, v_, c_, g_, pt, pr, pp, pb, arrival, first, last, inputs,
                    outputs)  # fmt: skip
