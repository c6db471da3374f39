"""Fit a step cost from observed runs of any engine, black box: only what the client saw.

A streamed request's chunks show when its decode steps ended, and its acceptance says how many
there were (completion tokens - 1 - accepted drafts: every step emits one token plus the drafts
it accepted). The batch around it is rebuilt from the run itself: over each chunk, the requests
decoding (first token to finish) and their context (prompt plus tokens so far), weighted by the
chunk's time; and the prompts prefilled while it decoded (requests whose first token arrived in
its span, those admitted together counted as one prefill step). Per request, then, its decode
time (E2E - TTFT) is

    n * (base + per_seq * w + per_context_token * c) + prefill_per_token * P + prefill_base * Q

for its n decode steps at mean batch width w and mean context c, with P prompt tokens in Q
prefill steps run meanwhile; a least-squares fit with non-negative coefficients over every
request gives the five prices. Summed per request, the fit does not depend on how the stream's
events were grouped into reads. ``per_token`` is folded into ``per_seq`` (every speculating
request verifies K + 1 positions, so the two cannot be told apart from outside) and the drafter's
cost into the same terms (the client cannot see it apart). A prefill step is priced by the same
fit: what it cost the requests that decoded through it (prefill_base per prefill step,
prefill_per_token per prompt token), since in the simulator it holds up the whole batch. Where
fewer than ``MIN_STALLED`` requests decoded through one (a run at concurrency 1 only), it comes
from the TTFT of requests that found the server idle instead: TTFT = prefill_base +
prefill_per_token * prompt. Measured on speclens serve and vLLM (benchmarks/README.md), the
stall prices cut the held-out replays' median E2E error on every run (c8: 13.0% to 7.9% and
14.8% to 10.6%), where the idle prices left every replay fast.

A fit needs two load points or more (two concurrencies or rates): from one, the per-request
cost cannot be told from the base, and it is refused rather than fitted.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from speclens.sim.cost import StepCost, _nonnegative_lstsq

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
    chunks: list[tuple[float, float, int]]  # (from, to, tokens) per chunk received
    steps: int  # its decode steps


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


def _decode_steps(row: dict[str, Any]) -> int:
    """The request's decode steps: each emits one token plus the drafts it accepted."""
    spec = row.get("spec_decode_acceptance") or {}
    accepted = spec.get("num_accepted_draft_tokens") if isinstance(spec, dict) else None
    return max(1, int(row["completion_tokens"]) - 1 - int(accepted or 0))


def _requests(rows: Sequence[dict[str, Any]]) -> list[_Request]:
    out = []
    for row in rows:
        times = [row.get(k) for k in ("start_s", "ttft_s", "latency_s")]
        if None in times or row.get("prompt_tokens") is None or not row.get("completion_tokens"):
            continue
        start, ttft, latency = (float(t) for t in times if t is not None)
        first, t = start + ttft, start + ttft
        chunks = []
        for gap, n in row.get("itl_runs_s") or []:
            chunks.append((t, t + gap * n, int(n)))
            t += gap * n
        if chunks:
            out.append(_Request(start, first, start + latency, int(row["prompt_tokens"]), chunks,
                                _decode_steps(row)))  # fmt: skip
    return out


def observe(path: Path) -> Observed:
    from speclens.runs.compare import InputError, read_run

    try:
        run = read_run(path)
    except InputError as exc:
        raise CalibrationError(exc.lines) from None
    settings = run.settings
    load = ("request_rate", float(settings["request_rate"])) if settings.get("request_rate") \
        else ("concurrency", float(settings.get("concurrency") or 1))  # fmt: skip
    requests = _requests(run.completed)  # those with inter-token timings only
    if not requests:
        raise CalibrationError([f"{path / 'records.jsonl'}: no request has inter-token timings "
                                "(itl_runs_s): a calibration needs a streamed run"])  # fmt: skip
    raw = run.summary.get("server")
    server: dict[str, Any] = raw if isinstance(raw, dict) else {}
    ks = run.ks()
    return Observed(path, load, requests, server.get("engine") or run.engine,
                    server.get("version"), settings.get("model"),
                    next(iter(ks)) if len(ks) == 1 else None)  # fmt: skip


def _rows(run: Observed) -> tuple[list[list[float]], list[float], list[float]]:
    """Per request: [n, n * w, n * c, P, Q] (see the module), its decode seconds, and its
    mean batch width w."""
    requests = run.requests
    firsts = np.array([r.first for r in requests])
    prompts = np.array([r.prompt for r in requests])
    x, y, widths = [], [], []
    for r in requests:
        span = r.end - r.first
        if span <= 0:
            continue
        width = context = 0.0
        for begin, end, _ in r.chunks:
            mid = (begin + end) / 2
            batch = [q for q in requests if q.first <= mid <= q.end]
            width += len(batch) * (end - begin)
            context += sum(q.prompt + _tokens_by(q, mid) for q in batch) * (end - begin)
        width, context = width / span, context / span
        inside = (firsts > r.first) & (firsts <= r.end)
        prefills = len(set(firsts[inside].tolist()))  # requests admitted together share one
        n = float(r.steps)
        x.append([n, n * width, n * context, float(prompts[inside].sum()), float(prefills)])
        y.append(span)
        widths.append(width)
    return x, y, widths


def _tokens_by(r: _Request, t: float) -> int:
    return 1 + sum(n for _, end, n in r.chunks if end <= t)


def _idle_ttfts(run: Observed) -> list[tuple[int, float]]:
    """(prompt tokens, TTFT) of requests no other request of the run overlapped at arrival."""
    out = []
    for r in run.requests:
        busy = any(q is not r and q.start <= r.start < q.end for q in run.requests)
        if not busy:
            out.append((r.prompt, r.first - r.start))
    return out


def fit(runs: Sequence[Observed]) -> tuple[StepCost, dict[str, Any]]:
    """The step cost and what the fit says of itself (steps, widths seen, residuals)."""
    loads = sorted({run.load for run in runs})
    if len(loads) < MIN_LOAD_POINTS:
        shown = ", ".join(f"{name} {value:g}" for name, value in loads)
        raise CalibrationError([f"calibrate: runs at one load point only ({shown}): the "
                                "per-request cost cannot be told from the base; add a run at "
                                "another concurrency or rate"])  # fmt: skip
    x, y, widths = [], [], []
    for run in runs:
        rx, ry, rw = _rows(run)
        x += rx
        y += ry
        widths += rw
    if len(y) < MIN_REQUESTS:
        raise CalibrationError([f"calibrate: {len(y)} requests with inter-token timings, at "
                                f"least {MIN_REQUESTS} needed"])  # fmt: skip
    xa, ya = np.array(x), np.array(y)
    base, per_seq, per_context, per_prompt, per_prefill = _nonnegative_lstsq(xa, ya)
    idle = [p for run in runs for p in _idle_ttfts(run)]
    idle_base, idle_per_token = _prefill(idle, per_prompt, per_prefill)
    stalled = int(np.count_nonzero(xa[:, 4]))
    # A prefill step holds up the whole batch: priced by what it cost the requests decoding
    # through it, where the runs show that, rather than by what an idle request waited (its
    # HTTP and tokenizing included, and no batch to hold up).
    prefill_base, prefill_per_token = (
        (per_prefill, per_prompt) if stalled >= MIN_STALLED else (idle_base, idle_per_token)
    )
    cost = StepCost(base=base, per_token=0.0, per_seq=per_seq, per_context_token=per_context,
                    draft_base=0.0, draft_per_token=0.0, prefill_base=prefill_base,
                    prefill_per_token=prefill_per_token)  # fmt: skip
    predicted = xa @ np.array([base, per_seq, per_context, per_prompt, per_prefill])
    relative = np.abs(predicted - ya) / ya
    report = {
        "method": "linear: each request's decode time over its decode steps, batch and context "
                  "as the client saw them, and the prefills it decoded through (non-negative "
                  "least squares)",
        "requests": len(y),
        "decode_steps": int(xa[:, 0].sum()),
        "batch_widths": [max(1, round(min(widths))), round(max(widths))],
        "idle_requests": len(idle),
        "prefill_from": "decode stalls" if stalled >= MIN_STALLED else "idle TTFTs",
        "requests_stalled_by_a_prefill": stalled,
        "idle_prefill": {"base": idle_base, "per_token": idle_per_token},
        "residual_rms_s": float(np.sqrt(np.mean((predicted - ya) ** 2))),
        "decode_time_error_median": float(np.median(relative)),
        "decode_time_error_p90": float(np.quantile(relative, 0.9)),
        "load_points": [{name: value} for name, value in loads],
    }  # fmt: skip
    return cost, report


def _prefill(
    idle: Sequence[tuple[int, float]], per_prompt: float, per_prefill: float
) -> tuple[float, float]:
    """(prefill_base, prefill_per_token) from idle TTFTs (they include what the client waits
    for beyond the engine's step); the step fit's prices where no request found the server
    idle, and its per-prompt-token price where the prompts do not vary enough for a slope."""
    if not idle:
        return per_prefill, per_prompt
    prompts = np.array([p for p, _ in idle], dtype=float)
    ttfts = np.array([t for _, t in idle], dtype=float)
    if len(idle) >= 3 and prompts.std() > 0.05 * prompts.mean():
        intercept, slope = _nonnegative_lstsq(
            np.column_stack([np.ones_like(prompts), prompts]), ttfts
        )
        return intercept, slope
    return max(0.0, float(np.median(ttfts - per_prompt * prompts))), per_prompt


def document(runs: Sequence[Observed], cost: StepCost, report: dict[str, Any]) -> dict[str, Any]:
    """The file ``calibrate`` writes: the step cost, the fit's report, and its provenance."""
    from dataclasses import asdict

    engines = sorted({f"{r.engine or 'unknown'}=={r.version or 'unknown'}" for r in runs})
    models = sorted({r.model for r in runs if r.model})
    ks = sorted({r.k for r in runs if r.k is not None})
    return {
        "kind": KIND,
        "step_cost": asdict(cost),
        "fit": report,
        "provenance": {
            "runs": [str(r.path) for r in runs], "engine": ", ".join(engines),
            "model": ", ".join(models) or None, "num_spec_tokens": ks[0] if len(ks) == 1 else None,
            "fitted_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    }  # fmt: skip


def read_cost_file(path: Path) -> tuple[StepCost, dict[str, Any]]:
    """A step cost from a YAML file: ``calibrate``'s output (its ``step_cost``, with ``fit`` and
    ``provenance`` returned beside it) or a bare mapping of StepCost fields, validated as a
    scenario's ``step_cost_file`` is."""
    from speclens.acceptance import read_yaml
    from speclens.acceptance.files import validate

    data = read_yaml(path)
    if isinstance(data, dict) and data.get("kind") == KIND:
        meta = {k: data.get(k) for k in ("fit", "provenance")}
        return validate(StepCost, data.get("step_cost"), str(path), "step_cost"), meta
    return validate(StepCost, data, str(path)), {}


def extrapolation(meta: dict[str, Any], widths: tuple[int, int]) -> str | None:
    """A note when a replay runs batches wider or narrower than the fit saw, or None."""
    seen = (meta.get("fit") or {}).get("batch_widths")
    if not (isinstance(seen, list) and len(seen) == 2):
        return None
    low, high = seen
    if widths[0] >= low and widths[1] <= high:
        return None
    return (f"the step cost was fitted on batches of {low} to {high} requests and this run "
            f"reaches {widths[0]} to {widths[1]}: outside them it extrapolates")  # fmt: skip
