"""Fit a step cost from observed runs of any engine, black box: only what the client saw.

A streamed request's chunks show when its decode steps ended, and its acceptance says how many
there were (the server's ``num_decode_steps`` where it counts them; else completion tokens - 1 -
accepted drafts: every step emits one token plus the drafts it accepted). The batch around it is rebuilt from the run itself: over each chunk, the requests
decoding (first token to finish) and their context (prompt plus tokens so far), weighted by the
chunk's time; and the prompts prefilled while it decoded (requests whose first token arrived in
its span, those admitted together counted as one prefill step). Per request, then, its decode
time (E2E - TTFT) is

    n * (base + per_seq * w + per_context_token * c) + prefill_per_token * P + prefill_base * Q

for its n decode steps at mean batch width w and mean context c, with P prompt tokens computed
(less those the server took from its prefix cache, where it says: ``cached_tokens``) in Q
prefill steps run meanwhile. The three decode prices come first, from each request's chunks no
prefill ran in (no other request's first token came in them: the same sum over those chunks,
P = Q = 0, with the request's steps in the share of its chunks they are), and the two prefill
prices then from what the stalls added; least squares with non-negative coefficients over every
request. Fitted together, the decode terms took up whatever the prefill terms mispriced (on
speclens serve, a step 13% dear at batch 4 and 8). Where fewer than ``MIN_REQUESTS`` requests
have such chunks, the five are fitted together. Summed per request, the fit does not depend on
how the stream's events were grouped into reads. ``per_token`` is folded into ``per_seq`` (every speculating
request verifies K + 1 positions, so the two cannot be told apart from outside) and the drafter's
cost into the same terms (the client cannot see it apart). A prefill step is priced by the same
fit: what it cost the requests that decoded through it (prefill_base per prefill step,
prefill_per_token per prompt token), since in the simulator it holds up the whole batch. Where
fewer than ``MIN_STALLED`` requests decoded through one (a run at concurrency 1 only), it comes
from the TTFT of requests that found the server idle instead: TTFT = prefill_base +
prefill_per_token * prompt. Measured on speclens serve and vLLM (benchmarks/README.md), the
stall prices cut the held-out replays' median E2E error on every run (c8: 13.0% to 7.9% and
14.8% to 10.6%), where the idle prices, beside decode terms fitted with the stalls' prices,
left every replay fast.

Where the stalls leave ``prefill_per_token`` at its bound, 0 (every prefill a request decoded
through was of one prompt, so P and Q move together), it comes from the idle TTFTs' slope on the
prompt, and the other prices are refitted around it.

Where the stalls price a prefill above most idle requests' whole TTFT (which held that prefill
and nothing else), the idle prices are taken instead (and the decode terms refitted around them
where they were fitted with the stalls).

A fit needs two load points or more (two concurrencies or rates): from one, the per-request
cost cannot be told from the base, and it is refused rather than fitted.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from speclens.acceptance.errors import ValidationError
from speclens.acceptance.quantity import is_finite_number
from speclens.acceptance.schema import _Model
from speclens.cost import StepCost, _nonnegative_lstsq, seconds_problem
from speclens.runs import rundir
from speclens.runs.trace import counted_verify_steps
from speclens.sim.catalog import ChipSpec, ModelSpec
from speclens.sim.roofline import Efficiency, Roofline

#: The file kind ``calibrate`` writes; ``read_cost_file`` also takes a bare StepCost mapping.
KIND = "StepCostFit"
#: Fewest requests and load points a fit needs.
MIN_REQUESTS = 8
#: Fewest requests that decoded through another's prefill for the fit to price prefill steps
#: from those stalls (else from idle TTFTs).
MIN_STALLED = 4
MIN_LOAD_POINTS = 2


class CalibrationError(Exception):
    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = list(lines)


@dataclass
class _Request:
    start: float
    first: float
    end: float
    prompt: int
    computed: int  # its prompt tokens less those the server took from its prefix cache
    chunks: list[tuple[float, float, int]]  # (from, to, tokens) per chunk received
    steps: int  # its decode steps
    drafts: int  # draft tokens it verified (each decode step verifies 1 + its drafts)
    spec_steps: int  # its decode steps that drafted


@dataclass
class Observed:
    """What the fit reads of one run: its requests' steps, and its load point."""

    path: Path
    load: tuple[str, float]
    requests: list[_Request]
    engine: str | None
    version: str | None
    model: str | None
    k: int | None


def _spec(row: dict[str, Any], key: str) -> int:
    """A count of the record's acceptance (0 when it states none)."""
    spec = row.get("spec_decode_acceptance") or {}
    value = spec.get(key) if isinstance(spec, dict) else None
    return int(value or 0)


def _decode_steps(row: dict[str, Any]) -> int:
    """The request's decode steps: as the server counted them (``num_decode_steps``: speclens
    serve, sim); else from its tokens, each step emitting one plus the drafts it accepted. The
    count from tokens is short where ``max_tokens`` cut the last step's accepted drafts (by up
    to K steps: on speclens serve at K 4 and 48 tokens, 10 counted of 14 run)."""
    stated = _spec(row, "num_decode_steps")
    if stated:
        return stated
    accepted = _spec(row, "num_accepted_draft_tokens")
    return max(1, int(row["completion_tokens"]) - 1 - accepted)


def _spec_steps(row: dict[str, Any], k: int | None) -> int:
    """Its decode steps that drafted: as stated, or counted from its tokens where the engine
    counts tokens only and the run states K."""
    spec = row.get("spec_decode_acceptance") or {}
    if isinstance(spec, dict) and spec.get("num_spec_steps") is None and k:
        return counted_verify_steps(_spec(row, "num_accepted_draft_tokens"),
                                    _spec(row, "num_draft_tokens"), k)  # fmt: skip
    return _spec(row, "num_spec_steps")


def _requests(rows: Sequence[dict[str, Any]], k: int | None) -> list[_Request]:
    out = []
    for row in rows:
        times = [row.get(key) for key in ("start_s", "ttft_s", "latency_s")]
        if None in times or row.get("prompt_tokens") is None or not row.get("completion_tokens"):
            continue
        start, ttft, latency = (float(t) for t in times if t is not None)
        first, t = start + ttft, start + ttft
        chunks = []
        for gap, n in row.get("itl_runs_s") or []:
            chunks.append((t, t + gap * n, int(n)))
            t += gap * n
        if chunks:
            prompt = int(row["prompt_tokens"])
            computed = prompt - min(prompt, int(row.get("cached_tokens") or 0))
            out.append(_Request(start, first, start + latency, prompt, computed, chunks,
                                _decode_steps(row), _spec(row, "num_draft_tokens"),
                                _spec_steps(row, k)))  # fmt: skip
    return out


#: The fields of a records.jsonl row the fit reads (``observe``); the rest, raw payloads
#: included, are dropped as each line is read.
FIELDS = ("index", "success", "row_error", "warmup", "start_s", "ttft_s", "latency_s",
          "prompt_tokens", "completion_tokens", "cached_tokens", "itl_runs_s",
          "spec_decode_acceptance")  # fmt: skip
#: Of its summary: the settings and the server (engine, version, K).
SUMMARY_FIELDS = ("settings", "server", "figures")


def observe(path: Path) -> Observed:
    try:
        run = rundir.read_run(
            path, rundir.fields(FIELDS), rundir.fields_but_acceptance(SUMMARY_FIELDS)
        )
    except rundir.InputError as exc:
        raise CalibrationError(exc.lines) from None
    settings = run.settings
    load = ("request_rate", float(settings["request_rate"])) if settings.get("request_rate") \
        else ("concurrency", float(settings.get("concurrency") or 1))  # fmt: skip
    ks = run.ks()
    k = next(iter(ks)) if len(ks) == 1 else None
    requests = _requests(run.completed, k)  # those with inter-token timings only
    if not requests:
        raise CalibrationError([f"{path / 'records.jsonl'}: no request has inter-token timings "
                                "(itl_runs_s): a calibration needs a streamed run"])  # fmt: skip
    raw = run.summary.get("server")
    server: dict[str, Any] = raw if isinstance(raw, dict) else {}
    return Observed(path, load, requests, server.get("engine") or run.engine,
                    server.get("version"), settings.get("model"), k)  # fmt: skip


@dataclass
class _Sample:
    """Every request the fits read, over all runs: per request [n, n * w, n * c, P, Q] (see the
    module), its decode seconds, its mean batch width w, and the request; and per request with
    chunks no prefill ran in, the same three decode columns and seconds over those chunks only
    (``clean_x``, ``clean_y``)."""

    x: np.ndarray
    y: np.ndarray
    widths: np.ndarray
    requests: list[_Request]
    clean_x: np.ndarray
    clean_y: np.ndarray


def _gather(runs: Sequence[Observed]) -> _Sample:
    x: list[list[float]] = []
    y: list[float] = []
    widths: list[float] = []
    kept: list[_Request] = []
    clean_x: list[list[float]] = []
    clean_y: list[float] = []
    for run in runs:
        requests = run.requests
        firsts = np.array([r.first for r in requests])
        prompts = np.array([r.computed for r in requests])  # a prefill computes these
        for r in requests:
            span = r.end - r.first
            if span <= 0:
                continue
            # Per chunk: seconds, batch width and context, and whether a prefill ran in it
            # (another request's first token came in it).
            parts = np.array([_chunk(requests, firsts, begin, end) for begin, end, _ in r.chunks])
            seconds, clean = parts[:, 0], parts[:, 3] == 0
            width, context = parts[:, 1:3].T @ seconds / span
            inside = (firsts > r.first) & (firsts <= r.end)
            prefills = len(set(firsts[inside].tolist()))  # requests admitted together share one
            n = float(r.steps)
            x.append([n, n * width, n * context, float(prompts[inside].sum()), float(prefills)])
            y.append(span)
            widths.append(width)
            kept.append(r)
            clean_span = seconds[clean].sum()
            if clean_span > 0:
                # Its steps in those chunks: a chunk is a step where the stream sends one event
                # a step, a token where it sends one a token (llama.cpp); either way their share.
                steps = n * float(clean.mean())
                clean_w, clean_c = parts[clean, 1:3].T @ seconds[clean] / clean_span
                clean_x.append([steps, steps * clean_w, steps * clean_c])
                clean_y.append(clean_span)
    if len(y) < MIN_REQUESTS:
        raise CalibrationError([f"calibrate: {len(y)} requests with inter-token timings, at "
                                f"least {MIN_REQUESTS} needed"])  # fmt: skip
    return _Sample(np.array(x), np.array(y), np.array(widths), kept,
                   np.array(clean_x).reshape(-1, 3), np.array(clean_y))  # fmt: skip


def _chunk(
    requests: Sequence[_Request], firsts: np.ndarray, begin: float, end: float
) -> tuple[float, float, float, int]:
    """A chunk's seconds, the batch decoding at its midpoint (width, and its context: prompt
    plus tokens so far each), and how many first tokens came in it (prefills run in it)."""
    mid = (begin + end) / 2
    batch = [q for q in requests if q.first <= mid <= q.end]
    context = sum(q.prompt + _tokens_by(q, mid) for q in batch)
    return end - begin, len(batch), context, int(((firsts > begin) & (firsts <= end)).sum())


def _report(
    method: str, sample: _Sample, predicted: np.ndarray, loads: Sequence[tuple[str, float]]
) -> dict[str, Any]:
    """What every fit says of itself: its data, the widths it saw, its residuals."""
    y = sample.y
    relative = np.abs(predicted - y) / y
    low, high = sample.widths.min(), sample.widths.max()
    return {
        "method": method,
        "requests": len(y),
        "decode_steps": int(sample.x[:, 0].sum()),
        "batch_widths": [max(1, round(float(low))), round(float(high))],
        "residual_rms_s": float(np.sqrt(np.mean((predicted - y) ** 2))),
        "decode_time_error_median": float(np.median(relative)),
        "decode_time_error_p90": float(np.quantile(relative, 0.9)),
        "load_points": [{name: value} for name, value in loads],
        "unusable": _unusable(float(np.median(relative))),
    }


#: A fit whose median decode-time error on its own runs exceeds this predicts nothing.
UNUSABLE = 0.25


def _unusable(median: float) -> str | None:
    """Why a fit cannot be used for prediction (its median decode-time error on the very runs
    it was fitted on is over ``UNUSABLE``), or None."""
    if median <= UNUSABLE:
        return None
    return (f"unusable for prediction: the fit's median decode-time error on its own runs is "
            f"{median:.1%}, over {UNUSABLE:.0%}; the runs do not follow one step cost (a loaded "
            "machine, runs of different servers, too few requests)")  # fmt: skip


def _tokens_by(r: _Request, t: float) -> int:
    return 1 + sum(n for _, end, n in r.chunks if end <= t)


def _idle_ttfts(run: Observed) -> list[tuple[int, float]]:
    """(prompt tokens computed, TTFT) of requests alone on the server from their arrival to
    their first token: none in flight when they came, none come before that token. (Alone at
    arrival only, the first of a closed loop's four read 2.7 s, the prefill of a 1,084-token
    prompt that came 1 ms after its own 11, and the idle prices went from 0 + 2.0 ms a token
    to 285 ms + 1.6 ms; the replay at concurrency 8 from 8.8% to 27% E2E error.)"""
    out = []
    for r in run.requests:
        busy = any(q is not r and q.start < r.first and q.end > r.start for q in run.requests)
        if not busy:
            out.append((r.computed, r.first - r.start))
    return out


def fit(runs: Sequence[Observed]) -> tuple[StepCost, dict[str, Any]]:
    """The step cost and what the fit says of itself (steps, widths seen, residuals). A front
    latency its readers would refuse (over ``MAX_FRONT_LATENCY``) is refused here, not written."""
    cost, report = _fit(runs, _check_loads(runs), _gather(runs))
    front = report["front_latency_s"]
    if not front <= MAX_FRONT_LATENCY:
        raise CalibrationError([
            f"calibrate: fit.front_latency_s: the requests that found the server idle waited a "
            f"median {front:.4g} s beyond their prefill's price, expected at most "
            f"{MAX_FRONT_LATENCY:g} s (a server's front end: HTTP, tokenizing); their TTFTs hold "
            "a wait no step pays: check the runs' TTFTs"
        ])  # fmt: skip
    return cost, report


def _fit(
    runs: Sequence[Observed], loads: Sequence[tuple[str, float]], sample: _Sample
) -> tuple[StepCost, dict[str, Any]]:
    """``fit`` on the runs' load points and requests already gathered (the roofline's fit
    compares itself with it on the same ones)."""
    xa, ya = sample.x, sample.y
    idle = [p for run in runs for p in _idle_ttfts(run)]
    # The five prices, in the columns' order: base, per_seq, per_context, per_prompt, per_prefill.
    # The decode terms come from the chunks no prefill ran in, where the fit has them: fitted
    # beside the stalls, they take up whatever the prefill terms misprice (on speclens serve,
    # 13% dear a step at batch 4 and 8, the prefill a third of its price). The prefill prices
    # are then what the stalls added.
    decode = _decode_terms(sample)
    prices = _refit(xa, ya, decode)
    idle_fit = _idle_slope(idle)
    slope = idle_fit if prices[PROMPT] == 0 else None
    if slope is not None:
        # A prompt token is never free: a 0 is the bound the fit hit, where every prefill the
        # requests decoded through was of one prompt (a closed loop past its start) and the
        # stalls could not tell a token's price from the step's. It then priced concurrency
        # 8's first prefill, of 8 prompts, as one. The idle TTFTs' slope measures it instead.
        prices = _refit(xa, ya, {**decode, PROMPT: slope[1]})
    idle_base, idle_per_token = _prefill(idle, idle_fit, prices[PROMPT], prices[PREFILL])
    stalled = int(np.count_nonzero(xa[:, PREFILL]))
    over = stalled >= MIN_STALLED and _over_idle(idle, prices[PREFILL], prices[PROMPT])
    if over:
        # The stalls priced a prefill above the whole TTFT of a request that waited for nothing
        # else: not a price but the fit's slack (seen on llama.cpp, 16 requests at
        # concurrency 4: 546 ms a prefill step, idle TTFTs of 0.1 to 0.5 s). The idle prices
        # bound it; the decode terms, where the stalls' chunks priced them too, are refitted.
        prices = _refit(xa, ya, {**decode, PROMPT: idle_per_token, PREFILL: idle_base})
    base, per_seq, per_context, per_prompt, per_prefill = prices
    from_stalls = stalled >= MIN_STALLED and not over
    # A prefill step holds up the whole batch: priced by what it cost the requests decoding
    # through it, where the runs show that, rather than by what an idle request waited (its
    # HTTP and tokenizing included, and no batch to hold up).
    prefill_base, prefill_per_token = (
        (per_prefill, per_prompt) if from_stalls else (idle_base, idle_per_token)
    )
    front = _front_latency(idle, prefill_base, prefill_per_token) if from_stalls else 0.0
    cost = StepCost(base=base, per_token=0.0, per_seq=per_seq, per_context_token=per_context,
                    draft_base=0.0, draft_per_token=0.0, prefill_base=prefill_base,
                    prefill_per_token=prefill_per_token)  # fmt: skip
    predicted = xa @ np.array([base, per_seq, per_context, per_prompt, per_prefill])
    report = _report(
        "linear: each request's decode time over its decode steps, batch and context as the "
        "client saw them, and the prefills it decoded through (non-negative least squares)",
        sample, predicted, loads,
    )  # fmt: skip
    report.update({
        "decode_from": f"{len(sample.clean_y)} requests' chunks no prefill ran in" if decode
                       else "every chunk (too few ran without a prefill)",
        "idle_requests": len(idle),
        "prefill_from": "decode stalls" if from_stalls else "idle TTFTs"
                        + (" (the stalls priced a prefill above them)" if over else ""),
        "prefill_per_token_from": "idle TTFT slope" if slope is not None else "decode stalls",
        "requests_stalled_by_a_prefill": stalled,
        "idle_prefill": {"base": idle_base, "per_token": idle_per_token},
        "front_latency_s": front,
    })  # fmt: skip
    return cost, report


#: The most front-end latency a cost file may state (a minute: more is not a server's).
MAX_FRONT_LATENCY = 60.0

#: The stall fit's columns of the prompt-token and prefill-step prices.
PROMPT, PREFILL = 3, 4


def _refit(xa: np.ndarray, ya: np.ndarray, held: dict[int, float]) -> list[float]:
    """The stall fit's five prices with those ``held`` (column: price) fixed and the others
    refitted around them (non-negative least squares)."""
    free = [j for j in range(xa.shape[1]) if j not in held]
    rest = ya - sum(price * xa[:, j] for j, price in held.items())
    solved = dict(zip(free, _nonnegative_lstsq(xa[:, free], rest), strict=True)) if free else {}
    return [held[j] if j in held else solved[j] for j in range(xa.shape[1])]


def _decode_terms(sample: _Sample) -> dict[int, float]:
    """base, per_seq and per_context (columns 0 to 2) fitted on the chunks no prefill ran in,
    where at least ``MIN_REQUESTS`` requests have some; else none (the joint fit prices them)."""
    if len(sample.clean_y) < MIN_REQUESTS:
        return {}
    return dict(enumerate(_nonnegative_lstsq(sample.clean_x, sample.clean_y)))


def _check_loads(runs: Sequence[Observed]) -> list[tuple[str, float]]:
    loads = sorted({run.load for run in runs})
    if len(loads) < MIN_LOAD_POINTS:
        shown = ", ".join(f"{name} {value:g}" for name, value in loads)
        raise CalibrationError([f"calibrate: runs at one load point only ({shown}): the "
                                "per-request cost cannot be told from the base; add a run at "
                                "another concurrency or rate"])  # fmt: skip
    return loads


#: The grid of efficiencies a roofline fit searches first (each from 0.1% to 100% of peak).
EFFICIENCIES = np.geomspace(1e-3, 1.0, 61)


def _binomial(m: np.ndarray, share: np.ndarray, j: np.ndarray) -> np.ndarray:
    """P(J = j) for J ~ Binomial(m, share), per row (rows of m and share; columns of j)."""
    comb = np.array([[math.comb(int(mi), int(k)) for k in j] for mi in m], dtype=float)
    fail = np.maximum(m[:, None] - j[None, :], 0)
    pmf: np.ndarray = comb * share[:, None] ** j[None, :] * (1 - share[:, None]) ** fail
    return pmf


class _Priced:
    """The decode time the roofline gives each request of the fit: its n decode steps in
    batches of its mean width w (floor(w) and floor(w) + 1, mixed to w), each batch with a
    binomial count of drafting requests at the request's own share of drafting steps and
    drafts per drafting step (so the roofline's max is taken step by step, not of a mean
    step); plus the Q prefill steps of P prompt tokens it decoded through."""

    def __init__(self, sample: _Sample) -> None:
        x, requests = sample.x, sample.requests
        self.n, self.q, self.y = x[:, 0], x[:, 4], sample.y
        self.w, self.c = x[:, 1] / self.n, x[:, 2] / self.n
        self.prompt = np.where(self.q > 0, x[:, 3] / np.maximum(self.q, 1), 0.0)
        drafted = np.array([r.spec_steps for r in requests], dtype=float)
        share = np.minimum(1.0, drafted / self.n)
        drafts = np.array([r.drafts for r in requests], dtype=float)
        per_draft = np.where(drafted > 0, drafts / np.maximum(drafted, 1), 0.0)
        low = np.maximum(np.floor(self.w), 1.0)
        j = np.arange(int(low.max()) + 2)
        self.parts = []  # (width, weight per row and drafting count, positions)
        for m, weight in ((low, 1.0 - (self.w - low)), (low + 1, self.w - low)):
            pmf = _binomial(m, share, j) * np.clip(weight, 0, 1)[:, None]
            self.parts.append((m[:, None], pmf, m[:, None] + per_draft[:, None] * j[None, :]))

    def work(self, roof: Roofline) -> np.ndarray:
        """Each request's decode time but the overheads."""
        steps = sum(
            (pmf * roof.forward(tokens, m, self.c[:, None] * m / self.w[:, None])).sum(axis=1)
            for m, pmf, tokens in self.parts
        )
        prefills = self.q * roof.forward(self.prompt, 1, self.prompt)
        out: np.ndarray = np.asarray(self.n * steps + prefills, dtype=float)
        return out


def fit_roofline(runs: Sequence[Observed], roof: Roofline) -> tuple[Roofline, dict[str, Any]]:
    """The roofline's compute and memory efficiencies and its overheads (per step, per sequence
    in a step), fitted to the same per-request decode times as ``fit``, priced by ``_Priced``.
    The efficiencies are searched on a grid (the roofline's max makes the error piecewise),
    then on a finer one around the best; the overheads are solved at each point (non-negative
    least squares on the relative error)."""
    loads = _check_loads(runs)
    sample = _gather(runs)
    priced = _Priced(sample)
    n, w, q, y = priced.n, priced.w, priced.q, priced.y
    # Per step, and per sequence in a step: the overheads' columns, scaled to relative error.
    paid = np.column_stack([n + q, n * w + q]) / y[:, None]

    def trial(compute: float, memory: float) -> tuple[float, float, float, list[float]]:
        work = priced.work(replace(roof, efficiency=roof.efficiency.model_copy(
            update={"compute": compute, "memory": memory})))  # fmt: skip
        overheads = _nonnegative_lstsq(paid, 1.0 - work / y)
        return float(np.sum((paid @ overheads + work / y - 1.0) ** 2)), compute, memory, overheads

    best = min((trial(float(a), float(b)) for a in EFFICIENCIES for b in EFFICIENCIES),
               key=lambda t: t[0])  # fmt: skip
    # Then a finer grid within one step of the best (the coarse one moves 12% a step).
    step = float(EFFICIENCIES[1] / EFFICIENCIES[0])
    fine = [np.geomspace(v / step, min(1.0, v * step), 21) for v in best[1:3]]
    best = min([best, *(trial(float(a), float(b)) for a in fine[0] for b in fine[1])],
               key=lambda t: t[0])  # fmt: skip
    _, compute, memory, (overhead, per_sequence) = best
    efficiency = roof.efficiency.model_copy(update={
        "compute": compute, "memory": memory, "overhead": float(overhead),
        "per_sequence": float(per_sequence)})  # fmt: skip
    fitted = replace(roof, efficiency=efficiency)
    predicted = priced.work(fitted) + overhead * (n + q) + per_sequence * (n * w + q)
    report = _report(
        "roofline: efficiencies (grid) and overheads (least squares) fitted to each request's "
        "decode time over its decode steps, batch and context as the client saw them, and the "
        "prefills it decoded through", sample, predicted, loads,
    )  # fmt: skip
    report["at_the_grid_edge"] = [
        name for name, value in (("compute", compute), ("memory", memory))
        if value in (EFFICIENCIES[0], EFFICIENCIES[-1])
    ]  # fmt: skip
    linear = _fit(runs, loads, sample)[1]["decode_time_error_median"]
    report["linear_decode_time_error_median"] = linear
    pinned = [name for name, value in (("compute", compute), ("memory", memory))
              if value >= EFFICIENCIES[-1]]  # fmt: skip
    report["misfit"] = _misfit(report["decode_time_error_median"], linear, pinned)
    return fitted, report


def _misfit(roofline: float, linear: float, pinned: Sequence[str] = ()) -> str | None:
    """Why the roofline does not describe the runs; else None. Either its median decode-time
    error on them exceeds 1.3 times the linear fit's plus 3 points, or it is worse than the
    linear's with an efficiency ``pinned`` at 100% (the runs go faster than the model's bytes
    or FLOPs allow on the chip). Then the engine is not running what the model and chip entries
    say: on llama.cpp (Q4_1 weights, its own CPU kernels, against a bf16 model on a chip
    measured with torch's bf16 matmuls) the roofline's error was 26% to 42% against the
    linear's 4% to 18% over 13 runs, its memory efficiency at 100% in the closest (26% against
    16%), and its c8 replays 7% to 41% off (throughput to 77%); on vLLM and speclens serve it
    was 0.84 to 1.15 times the linear's over 14 run sets."""
    if roofline <= 1.3 * linear + 0.03 and not (pinned and roofline > linear):
        return None
    why = (f"; its {' and '.join(pinned)} efficiency at 100%, the runs are faster than the "
           f"model's size allows on the chip" if pinned else "")  # fmt: skip
    return (f"the roofline describes these runs worse than the linear cost (median decode-time "
            f"error {roofline:.1%} against {linear:.1%}{why}): the engine does not run what the "
            f"model and chip entries say (quantized weights, other kernels); fit without --model "
            f"and --hardware")  # fmt: skip


def _front_latency(
    idle: Sequence[tuple[int, float]], prefill_base: float, prefill_per_token: float
) -> float:
    """What an idle request waited beyond its prefill's price (median; 0 with fewer than 3
    idle requests): the server's front end (HTTP, tokenizing, handing the request to the
    engine), which no step pays. On vLLM's CPU build 157 ms (its API server is another
    process): without it the replays' TTFTs were 60% to 80% short."""
    if len(idle) < 3:
        return 0.0
    waits = [t - (prefill_base + prefill_per_token * p) for p, t in idle]
    return max(0.0, float(np.median(waits)))


def _over_idle(idle: Sequence[tuple[int, float]], per_prefill: float, per_prompt: float) -> bool:
    """Whether the stall prices put most idle requests' prefill above their whole TTFT (which
    held that prefill and nothing else: an upper bound on it)."""
    if len(idle) < 3:
        return False
    ratios = [(per_prefill + per_prompt * p) / t for p, t in idle if t > 0]
    return bool(ratios) and float(np.median(ratios)) > 1.0


#: An idle TTFT further off the robust line than this many robust standard deviations of the
#: log ratios (1.4826 median absolute deviations) and ``OUTLIER_RATIO`` times over or under it
#: is left out of the fit: a request the server paused for, not a prefill's price. The robust
#: line's pairs are of at most ``ROBUST_POINTS`` idle requests.
OUTLIER_SDS = 4.0
OUTLIER_RATIO = 2.0
ROBUST_POINTS = 1000


def _idle_slope(idle: Sequence[tuple[int, float]]) -> tuple[float, float] | None:
    """(intercept, slope) of idle TTFT on prompt tokens, where at least 3 idle requests with
    prompts that vary (by over 5% of their mean) identify it; else None. Least squares, without
    the TTFTs far off the Theil-Sen line by their ratio to it (a TTFT's noise grows with it):
    least squares alone follows one outlier, and priced each prefill 285 ms over one TTFT of
    2.7 s among 13."""
    prompts = np.array([p for p, _ in idle], dtype=float)
    if len(idle) < 3 or prompts.std() <= 0.05 * prompts.mean():
        return None
    ttfts = np.array([t for _, t in idle], dtype=float)
    design = np.column_stack([np.ones_like(prompts), prompts])
    if (ttfts > 0).all():
        line = np.maximum(_theil_sen(prompts, ttfts), 1e-3 * float(np.median(ttfts)))
        logs = np.log(ttfts / line)
        off = np.abs(logs - np.median(logs))
        kept = off <= max(OUTLIER_SDS * 1.4826 * float(np.median(off)), math.log(OUTLIER_RATIO))
        if kept.sum() >= 3 and prompts[kept].std() > 0.05 * prompts[kept].mean():
            design, ttfts = design[kept], ttfts[kept]
    intercept, slope = _nonnegative_lstsq(design, ttfts)
    return float(intercept), float(slope)


def _theil_sen(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The Theil-Sen line's values at ``x`` (scipy's, on at most ``ROBUST_POINTS`` points evenly
    spaced in ``x``: its pairs take memory quadratic in them)."""
    from scipy.stats import theilslopes

    order = np.argsort(x, kind="stable")
    pick = order[np.linspace(0, len(x) - 1, min(len(x), ROBUST_POINTS)).astype(int)]
    slope, intercept, _, _ = theilslopes(y[pick], x[pick], method="joint")
    return float(slope) * x + float(intercept)


def _prefill(
    idle: Sequence[tuple[int, float]],
    slope: tuple[float, float] | None,
    per_prompt: float,
    per_prefill: float,
) -> tuple[float, float]:
    """(prefill_base, prefill_per_token) from idle TTFTs (they include what the client waits
    for beyond the engine's step): their ``slope`` (``_idle_slope(idle)``, which the fit has
    already worked out); the step fit's prices where no request found the server idle, and its
    per-prompt-token price where the prompts do not vary enough for a slope."""
    if not idle:
        return per_prefill, per_prompt
    if slope is not None:
        return slope
    prompts = np.array([p for p, _ in idle], dtype=float)
    ttfts = np.array([t for _, t in idle], dtype=float)
    return max(0.0, float(np.median(ttfts - per_prompt * prompts))), per_prompt


def document(
    runs: Sequence[Observed], cost: StepCost | Roofline, report: dict[str, Any]
) -> dict[str, Any]:
    """The file ``calibrate`` writes: the step cost (or the roofline, its model and chip entries
    in full, so the file stands alone), the fit's report, and its provenance."""
    from dataclasses import asdict

    priced: dict[str, Any] = (
        {"roofline": _RooflineFile.of(cost).model_dump(exclude_none=True)}
        if isinstance(cost, Roofline)
        else {"step_cost": asdict(cost)}
    )
    engines = sorted({f"{r.engine or 'unknown'}=={r.version or 'unknown'}" for r in runs})
    models = sorted({r.model for r in runs if r.model})
    ks = sorted({r.k for r in runs if r.k is not None})
    return {
        "kind": KIND,
        **priced,
        "fit": report,
        "provenance": {
            "runs": [str(r.path) for r in runs], "engine": ", ".join(engines),
            "model": ", ".join(models) or None, "num_spec_tokens": ks[0] if len(ks) == 1 else None,
            "fitted_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    }  # fmt: skip


class _RooflineFile(_Model):
    """A fitted roofline as its file holds it: the entries in full, so the file stands alone."""

    model: ModelSpec
    chip: ChipSpec
    parallel: Annotated[int, Field(ge=1, le=1024)] = 1
    method: str | None = None
    draft_layers: Annotated[int, Field(ge=1, le=64)] = 1
    expert_parallel: Annotated[int, Field(ge=1, le=1024)] = 1
    dp_attention: bool = False
    efficiency: Efficiency = Field(default_factory=Efficiency)

    @classmethod
    def of(cls, roof: Roofline) -> _RooflineFile:
        return cls(model=roof.model, chip=roof.chip, parallel=roof.parallel, method=roof.method,
                   draft_layers=roof.draft_layers, expert_parallel=roof.expert_parallel,
                   dp_attention=roof.dp_attention, efficiency=roof.efficiency)  # fmt: skip

    def roofline(self) -> Roofline:
        return Roofline(self.model, self.chip, self.parallel, self.method, self.draft_layers,
                        expert_parallel=self.expert_parallel, dp_attention=self.dp_attention,
                        efficiency=self.efficiency)  # fmt: skip


def read_cost_file(path: Path) -> tuple[StepCost | Roofline, dict[str, Any]]:
    """A step cost from a YAML file: ``calibrate``'s output (its ``step_cost`` or ``roofline``,
    with ``fit`` and ``provenance`` returned beside it) or a bare mapping of StepCost fields,
    validated as a scenario's ``step_cost`` is."""
    from speclens.acceptance import read_yaml
    from speclens.acceptance.files import validate

    data = read_yaml(path)
    if isinstance(data, dict) and data.get("kind") == KIND:
        meta = {k: data.get(k) for k in ("fit", "provenance")}
        meta["front_latency_s"] = _front_in(data.get("fit"), path)
        _fit_in(data.get("fit"), data.get("provenance"), path)
        if "roofline" in data:
            spec = validate(_RooflineFile, data.get("roofline"), str(path), "roofline")
            return spec.roofline(), meta
        return validate(StepCost, data.get("step_cost"), str(path), "step_cost"), meta
    return validate(StepCost, data, str(path)), {}


def _front_in(fit: Any, path: Path) -> float:
    """The fit's ``front_latency_s`` (0 where it has none), checked: the replay waits it."""
    value = fit.get("front_latency_s", 0.0) if isinstance(fit, dict) else 0.0
    if seconds_problem(value) is not None or value > MAX_FRONT_LATENCY:
        raise ValidationError.single("fit.front_latency_s", f"expected seconds from 0 to "
                                     f"{MAX_FRONT_LATENCY:g}, got {value!r}", str(path))  # fmt: skip
    return float(value)


def _fit_in(fit: Any, provenance: Any, path: Path) -> None:
    """The fields of ``fit`` and ``provenance`` a replay reads, checked: ``fit`` a mapping,
    its ``batch_widths`` two whole numbers of requests, low to high, its warnings text; the
    ``provenance`` a mapping whose ``model`` and ``hardware`` are names."""
    problem = None
    if fit is not None and not isinstance(fit, dict):
        problem = ("fit", f"expected a mapping (what calibrate writes), got {type(fit).__name__}")
    elif isinstance(fit, dict):
        widths = fit.get("batch_widths")
        if widths is not None and not (
            isinstance(widths, list) and len(widths) == 2
            and all(isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in widths)
            and widths[0] <= widths[1]
        ):  # fmt: skip
            problem = ("fit.batch_widths", f"expected [low, high] requests, got {widths!r}")
        for key in ("misfit", "unusable"):
            if fit.get(key) is not None and not isinstance(fit.get(key), str):
                problem = (f"fit.{key}", f"expected text or null, got {fit.get(key)!r}")
    if provenance is not None and not isinstance(provenance, dict):
        problem = ("provenance", f"expected a mapping, got {type(provenance).__name__}")
    elif isinstance(provenance, dict):
        for key in ("model", "hardware"):
            if provenance.get(key) is not None and not isinstance(provenance.get(key), str):
                problem = (f"provenance.{key}", f"expected a name, got {provenance.get(key)!r}")
    if problem is not None:
        raise ValidationError.single(problem[0], problem[1], str(path))


def extrapolation(meta: dict[str, Any], widths: tuple[int, int]) -> str | None:
    """A note when a replay runs batches wider or narrower than the fit saw, or None."""
    fit = meta.get("fit")
    seen = fit.get("batch_widths") if isinstance(fit, dict) else None
    if not (isinstance(seen, list) and len(seen) == 2 and all(is_finite_number(w) for w in seen)):
        return None
    low, high = seen
    if widths[0] >= low and widths[1] <= high:
        return None
    return (f"the step cost was fitted on batches of {low} to {high} requests and this run "
            f"reaches {widths[0]} to {widths[1]}: outside them it extrapolates")  # fmt: skip


def defaults_extrapolation(chip: Any, widths: tuple[int, int],
                           disaggregated: bool | None = None) -> list[str]:  # fmt: skip
    """Notes when a prediction at a chip's catalog defaults runs past what they were fitted on
    (``ChipSpec.fitted_on``): concurrencies outside its span, or a kind of run (single-node or
    disaggregated) it never saw."""
    fitted = getattr(chip, "fitted_on", None)
    if fitted is None:
        return []
    notes = []
    low, high = fitted.concurrency
    if widths[0] < low or widths[1] > high:
        notes.append(f"{chip.name}'s catalog defaults were fitted on {fitted.runs} points at "
                     f"concurrency {low} to {high} and this run reaches {widths[0]} to "
                     f"{widths[1]}: outside them it extrapolates")  # fmt: skip
    if disaggregated is not None and disaggregated != (fitted.runs == "disaggregated"):
        kind = "disaggregated" if disaggregated else "single-node"
        notes.append(f"{chip.name}'s catalog defaults were fitted on {fitted.runs} runs and this "
                     f"one is {kind}: it extrapolates")  # fmt: skip
    return notes


def fit_warnings(meta: dict[str, Any], source: str) -> list[str]:
    """What the fit said of itself that every replay with it repeats (``<source>: <warning>``):
    a roofline that does not describe its own runs (``misfit``), a step cost whose error on
    them makes it predict nothing (``unusable``)."""
    fit = meta.get("fit")
    found = (fit.get("misfit"), fit.get("unusable")) if isinstance(fit, dict) else ()
    return [f"{source}: {problem}" for problem in found if isinstance(problem, str) and problem]
