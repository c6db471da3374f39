"""A disaggregated deployment's closed loop: prefill workers, a KV transfer, decode workers.

Prefill and decode run on separate workers (NVIDIA Dynamo, AMD Mori, llm-d): a request prefills
on a prefill worker (which emits its first token), its KV cache moves to a decode worker, and
it decodes there. The two pools run on their own clocks, so the single-node trick (schedule in
steps once, price afterwards: ``closed_loop``) does not apply; instead each point is solved in
its steady state, a few dozen step prices, well under a millisecond:

- Routing is round robin (Dynamo's and Mori's default): ``c`` clients spread evenly, each decode
  worker holds ``b`` requests on average, ``b`` the root of Little's law over the client cycle

      b = (c / W_d) · T_dec(b) / (TTFT(X) + T_dec(b)),   X = W_d · b / T_dec(b)

  with T_dec(b) a request's decode steps (⌈(O − 1) / AL⌉, K + 1 positions each when the decode
  pool speculates; only decode pools do) at the step price of a batch of max(b, 1).
- A prefill worker prefills waiting prompts in steps of up to ``budget`` tokens (m = budget /
  I prompts a step), so the pool serves at most μ = W_p · m / t(m) requests a second. At
  utilisation ρ = X / μ a prompt is prefilled in a step that carries between one prompt and m
  as ρ rises, after waiting half a busy step (t(m) · ρ / 2; in an open loop, a queue of
  deterministic batches: t(m) · ρ / (2(1 − ρ))). The closed loop's throughput stops just
  under μ: past it the clients queue for prefill. Its clients began at once, so they return in
  waves, each spread only over its decodes' spread W (the most decode steps less the fewest,
  at the step's price): where a wave takes the pool longer than that (c / μ > W), its median
  prompt waits (c / μ − W) / 2 instead, when that is longer.
- TTFT = front + wait + prefill + transfer: the prompt's KV (the model's KV bytes a token, MLA's
  latent included) over the link between the pools: scale-up when both pools fit in one
  scale-up domain (an NVL72 rack), else the prefill worker's GPUs' scale-out links.
- A decode worker holds at most its KV capacity in tokens: past it the clients queue (a worker
  whose weights leave no KV room by the catalog's accounting is not bounded: it ran).

What it leaves out: each request's own TTFT (one figure for all: the median's), and the first
wave's ramp (its decodes start together).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from speclens.sim.closed_loop import Figures, Load, lengths
from speclens.sim.roofline import Roofline

#: The decode batch's root: bracketed on a geometric grid of this many points (ratio 1.06 over
#: 10^6), then on a linear one within the bracket, then at most this many regula falsi steps.
_GRID, _NARROW = 256, 8
#: The most requests an open loop's decode worker is searched for, when its KV cache is unbounded.
_UNBOUNDED = 1e9
#: A prefill pool at this share of its capacity bounds the loop.
SATURATED = 0.95


@dataclass(frozen=True)
class Pools:
    """A disaggregated deployment: one prefill worker's roofline and one decode worker's (its
    method and K the decode pool's), and how many workers each pool runs."""

    prefill: Roofline
    decode: Roofline
    prefill_workers: int
    decode_workers: int

    @property
    def gpus(self) -> int:
        return (self.prefill_workers * self.prefill.parallel
                + self.decode_workers * self.decode.parallel)  # fmt: skip

    def link_bytes_per_s(self) -> float:
        """The KV transfer's bandwidth: the chips' scale-up links when both pools fit in one
        scale-up domain, else their scale-out links; as many in parallel as the narrower of a
        prefill and a decode worker has GPUs."""
        chip = self.prefill.chip
        domain, out = chip.scale_up_domain, chip.scale_out_gbps
        per_gpu = chip.interconnect_gbps
        if domain is not None and out is not None and self.gpus > domain:
            per_gpu = out
        lanes = min(self.prefill.parallel, self.decode.parallel)
        return 1e9 * per_gpu * lanes * self.prefill.efficiency.interconnect

    def describe(self) -> str:
        def one(roof: Roofline, workers: int) -> str:
            dpa = ", DP attention" if roof.dp_attention else ""
            return f"{workers} x (TP {roof.parallel}, EP {roof.expert_parallel}{dpa})"

        return (f"prefill {one(self.prefill, self.prefill_workers)}, decode "
                f"{one(self.decode, self.decode_workers)}")  # fmt: skip


@dataclass(frozen=True)
class Steady:
    """A point's steady state: the decode batch a worker holds, its step, the throughput in
    requests a second, the TTFT, and whether the prefill pool or the KV cache bounds it."""

    batch: float
    step_s: float
    requests_per_s: float
    ttft_s: float
    bound: str  # "decode", "prefill" or "kv cache"


class OverloadedError(ValueError):
    """An open loop's rate past what the deployment serves: its queues grow without bound."""


def steady(load: Load, pools: Pools, front: float, inputs: np.ndarray, outputs: np.ndarray,
           rate: float | None = None) -> Steady:  # fmt: skip
    """Solve the loop's steady state (see the module): closed at the load's concurrency, or,
    with ``rate``, open at that many requests a second (``OverloadedError`` past capacity)."""
    steps = _decode_steps(outputs, float(load.acceptance_length))
    return _solve(load, pools, front, float(inputs.mean()), float(outputs.mean()),
                  max(float(steps.mean()), 1.0), rate, float(steps.max() - steps.min()))  # fmt: skip


def _solve(load: Load, pools: Pools, front: float, mean_in: float, mean_out: float,
           mean_steps: float, rate: float | None, spread: float = 0.0) -> Steady:  # fmt: skip
    """The steady state from the draw's means (``spread``: its most decode steps less its
    fewest, the window a wave of clients returns in)."""
    k, al = load.num_spec_tokens, float(load.acceptance_length)
    width = k + 1 if k else 1
    context = mean_in + 1 + al * mean_steps / 2  # a decoding request's mean context
    # A worker whose weights the catalog's accounting cannot fit (its KV capacity 0) ran all the
    # same where a published point says so: its capacity is then left unbounded.
    kv = pools.decode.kv_tokens()
    held = kv / max(mean_in + mean_out, 1.0) if kv > 0 else math.inf

    def step(b: Any) -> Any:
        r = np.maximum(np.asarray(b, dtype=float), 1.0)
        return np.asarray(pools.decode.decode(r * width, r, r * context, r if k else 0.0 * r, k),
                          dtype=float)  # fmt: skip

    m = max(1, min(load.budget // max(round(mean_in), 1), load.concurrency if rate is None
                   else load.budget))  # fmt: skip
    full = float(pools.prefill.prefill(m * mean_in, m, m * mean_in / 2))
    one = float(pools.prefill.prefill(mean_in, 1, mean_in / 2))
    capacity = pools.prefill_workers * m / full
    transfer = mean_in * pools.prefill.kv_bytes_per_token() / pools.link_bytes_per_s()

    def ttft(x: Any, window: Any = 0.0) -> Any:
        """Open: a queue of deterministic batches (its wait grows without bound as rho nears
        1). Closed: no more clients wait than there are, so a prompt waits half a busy step
        and the throughput stops at the capacity, the clients queueing past it; and the
        clients return in waves (they all began at once, and a wave spreads only over
        ``window``, its decodes' spread): where a wave takes the prefill pool longer than that,
        its median prompt waits half the difference."""
        rho = np.asarray(x, dtype=float) / capacity
        with np.errstate(divide="ignore"):
            if rate is not None:
                wait = full * rho / (2 * (1 - rho))
            else:
                wave = (load.concurrency / capacity - np.asarray(window, dtype=float)) / 2
                wait = np.maximum(full * rho / 2, wave)
        out = front + one + (full - one) * rho + wait + transfer
        return np.where(rho >= 1, np.inf, out)

    if rate is not None:
        return _open(rate, pools, step, mean_steps, held, capacity, ttft)
    per_worker = load.concurrency / pools.decode_workers

    def excess(b: np.ndarray) -> np.ndarray:
        price = step(b)
        dec = mean_steps * price
        wait = ttft(pools.decode_workers * b / dec, spread * price)
        out: np.ndarray = b * (1 + wait / dec) - per_worker
        return out

    b = _root(excess, per_worker)
    bound = "decode"
    if b > held:
        b, bound = held, "kv cache"
    s = float(step(b))
    dec = mean_steps * s
    x = pools.decode_workers * b / dec
    base = float(ttft(x, spread * s))
    if bound == "decode" and x >= SATURATED * capacity:
        bound = "prefill"
    # Queued (the prefill pool or the KV cache full): the cycle beyond the decode. Else the
    # TTFT itself (the root's; the cycle's remainder is a small difference of large numbers).
    wait = base if bound == "decode" else max(base, load.concurrency / x - dec)
    return Steady(b, s, x, wait, bound)


def _root(excess: Any, top: float) -> float:
    """The decode batch in (0, ``top``] where ``excess`` (increasing) crosses 0: bracketed on a
    geometric grid (``_GRID`` points from ``top`` / 10^6), the bracket cut in ``_GRID`` again,
    then narrowed by regula falsi; the low end returned (its excess <= 0: the loop's identities
    hold there)."""
    lo, hi, e_lo, e_hi = _bracket(excess, top * np.geomspace(1e-6, 1.0, _GRID))
    if hi <= lo:
        return lo
    lo, hi, e_lo, e_hi = _bracket(excess, np.linspace(lo, hi, _GRID)[1:], lo, e_lo)
    if hi <= lo or not np.isfinite(e_hi):
        return lo
    side = 0
    for _ in range(_NARROW):  # regula falsi, Illinois: a side kept twice has its weight halved
        mid = lo + (hi - lo) * (-e_lo) / (e_hi - e_lo)
        e_mid = float(excess(np.array([mid]))[0])
        if e_mid > 0:
            hi, e_hi = mid, e_mid
            e_lo, side = (e_lo / 2 if side == 1 else e_lo), 1
        else:
            lo, e_lo = mid, e_mid
            e_hi, side = (e_hi / 2 if side == -1 else e_hi), -1
        if hi - lo <= 1e-12 * top:
            break
    return lo


def _bracket(excess: Any, grid: np.ndarray, lo: float = 0.0,
             e_lo: float = -math.inf) -> tuple[float, float, float, float]:  # fmt: skip
    """The first grid interval where ``excess`` turns positive: (lo, hi, excess at each); hi
    equal to lo where it never does (lo the grid's end) or does at once (lo its start)."""
    values = excess(grid)
    above = np.flatnonzero(values > 0)
    if not len(above):
        return float(grid[-1]), float(grid[-1]), float(values[-1]), float(values[-1])
    i = int(above[0])
    if i == 0 and e_lo == -math.inf:
        return float(grid[0]), float(grid[0]), float(values[0]), float(values[0])
    if i > 0:
        lo, e_lo = float(grid[i - 1]), float(values[i - 1])
    return lo, float(grid[i]), e_lo, float(values[i])


def _open(rate: float, pools: Pools, step: Any, mean_steps: float, held: float, capacity: float,
          ttft: Any) -> Steady:  # fmt: skip
    """An open loop at ``rate``: the decode batch from Little's law, b = X · T_dec(b) / W_d."""
    if rate >= capacity:
        raise OverloadedError(f"the prefill pool serves at most {capacity:.4g} requests/s, "
                              f"the rate is {rate:.4g}")  # fmt: skip
    top = held if math.isfinite(held) else _UNBOUNDED
    if top - rate * mean_steps * float(step(top)) / pools.decode_workers < 0:
        most = pools.decode_workers * top / (mean_steps * float(step(top)))
        raise OverloadedError(f"the decode pool serves at most {most:.4g} requests/s (its KV "
                              f"cache holds {top:.4g} requests a worker), the rate is "
                              f"{rate:.4g}")  # fmt: skip

    def excess(b: Any) -> Any:
        return b - rate * mean_steps * step(b) / pools.decode_workers

    while top / 2 > 1 and float(excess(top / 2)) > 0:  # a bracket as tight as the root allows
        top /= 2
    b = _root(excess, top)
    bound = "prefill" if rate >= SATURATED * capacity else "decode"
    return Steady(b, float(step(b)), rate, float(ttft(rate)), bound)


@functools.lru_cache(maxsize=1024)
def _benchmark_lengths(load: Load) -> tuple[np.ndarray, np.ndarray]:
    """``closed_loop.lengths``, drawn once a load (a fit prices each point hundreds of times);
    read-only, so no caller changes what another reads."""
    inputs, outputs = lengths(load)
    inputs.setflags(write=False)
    outputs.setflags(write=False)
    return inputs, outputs


def _decode_steps(outputs: np.ndarray, al: float) -> np.ndarray:
    out: np.ndarray = np.where(outputs > 1, np.ceil((outputs - 1) / al), 0.0)
    return out


def figures(load: Load, pools: Pools, front: float = 0.0, gpus: int | None = None,
            rate: float | None = None,
            drawn: tuple[np.ndarray, np.ndarray] | None = None) -> Figures:  # fmt: skip
    """The point's published figures in its steady state (``solve``'s, without the state)."""
    return solve(load, pools, front, gpus, rate, drawn)[0]


def solve(load: Load, pools: Pools, front: float = 0.0, gpus: int | None = None,
          rate: float | None = None,
          drawn: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[Figures, Steady]:  # fmt: skip
    """The point's published figures in its steady state (``steady``; open at ``rate``), per
    request, and that state: TTFT the same for every request, TPOT its own decode steps at the
    steady step price, over its tokens. The requests' (prompt, output) lengths are ``drawn``,
    else drawn as the benchmark draws them (``closed_loop.lengths``)."""
    problems = load.problems()
    if problems:
        raise ValueError("; ".join(problems))
    inputs, outputs = drawn if drawn is not None else _benchmark_lengths(load)
    state = steady(load, pools, front, inputs, outputs, rate)
    steps = _decode_steps(outputs, float(load.acceptance_length))
    decode = steps * state.step_s
    decoded = np.maximum(outputs - 1, 1)
    tpot = np.where(outputs > 1, decode / decoded, 0.0)
    ttft = np.full(len(outputs), state.ttft_s)
    duration = len(outputs) / state.requests_per_s
    out = Figures(
        ttft_s=ttft, tpot_s=tpot[outputs > 1], e2e_s=ttft + decode,
        itl_s=np.array([state.step_s]), itl_weights=np.array([1.0]), duration_s=duration,
        input_tokens=int(inputs.sum()), output_tokens=int(outputs.sum()),
        gpus=gpus or pools.gpus,
    )  # fmt: skip
    return out, state


@dataclass(frozen=True)
class Medians:
    """The three figures a fit reads (``fit_points.residuals``), without the per-request
    arrays: a fit prices each point hundreds of times."""

    median_tpot_s: float
    median_ttft_s: float
    throughput_per_gpu: float


@functools.lru_cache(maxsize=1024)
def _drawn_stats(load: Load) -> tuple[float, float, float, float, int, int, float]:
    """The benchmark's draw of ``load``, summed up: mean prompt and output, mean decode steps,
    the median of a request's steps over its decoded tokens, its tokens and its requests, and
    the spread of its decode steps."""
    inputs, outputs = _benchmark_lengths(load)
    steps = _decode_steps(outputs, float(load.acceptance_length))
    many = outputs > 1
    ratio = float(np.median(steps[many] / (outputs[many] - 1))) if many.any() else 0.0
    return (float(inputs.mean()), float(outputs.mean()), max(float(steps.mean()), 1.0), ratio,
            int(inputs.sum() + outputs.sum()), len(outputs),
            float(steps.max() - steps.min()))  # fmt: skip


def medians(load: Load, pools: Pools, front: float, gpus: int) -> Medians:
    """``figures(load, pools, front, gpus)``'s median TPOT, TTFT and throughput per GPU (equal
    to them: one step price for every request, so the median TPOT is it times the median of
    each request's steps over its tokens)."""
    mean_in, mean_out, mean_steps, ratio, tokens, count, spread = _drawn_stats(load)
    state = _solve(load, pools, front, mean_in, mean_out, mean_steps, None, spread)
    return Medians(state.step_s * ratio, state.ttft_s,
                   tokens * state.requests_per_s / count / gpus)  # fmt: skip


def describe(state: Steady) -> dict[str, Any]:
    return {"decode_batch": state.batch, "step_ms": state.step_s * 1e3,
            "requests_per_s": state.requests_per_s, "ttft_ms": state.ttft_s * 1e3,
            "bound": state.bound}  # fmt: skip
