"""Fidelity: how closely B (a prediction, or any second run) reproduces A, the observed one.

For a pair of two single runs that sent the same requests (a simulator's replay of an observed
run keeps each request's index): B's error against A request by request, matched by index, for
TTFT, TPOT, ITL and E2E, and B's throughput error, the figure the deltas use. For a prediction
against a measurement, both aggregate-only (``prediction_fidelity``): the published figures
point by point, matched by load.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from speclens.runs.compare_deltas import finite
from speclens.runs.compare_inputs import Input, loads, point_published
from speclens.runs.record import MAX_SECONDS
from speclens.runs.rundir import Run, is_number

#: Per-request figures of the fidelity block, in the order it lists them.
FIDELITY_FIGURES = ("e2e", "ttft", "tpot", "itl")

#: Fewest requests matched by index for a fidelity block: one request is an anecdote.
MIN_MATCHED = 2
#: The figures a prediction is scored on against the measurement it predicts.
PREDICTED = ("tpot_p50_ms", "ttft_p50_ms", "total_tokens_per_s_per_gpu")


def _seconds(value: object) -> float | None:
    """A time a row holds, bounded as every checked time is (``tpot_s`` is not checked on read)."""
    return float(value) if is_number(value) and 0 <= value <= MAX_SECONDS else None


#: One request's per-request figures (``request_figures``), in seconds.
RequestFigures = dict[str, float | None]


def request_figures(row: dict[str, Any]) -> RequestFigures:
    """One request's E2E, TTFT, TPOT and ITL in seconds (ITL: its token-weighted mean gap, the
    per-request form of what the ITL figure pools); None where the request has none."""
    runs = row.get("itl_runs_s") or []
    tokens = sum(n for _, n in runs)
    return {
        "e2e": _seconds(row.get("latency_s")),
        "ttft": _seconds(row.get("ttft_s")),
        "tpot": _seconds(row.get("tpot_s")),
        "itl": sum(g * n for g, n in runs) / tokens if tokens else None,
    }


def _by_index(run: Run) -> dict[int, dict[str, Any]]:
    """A run's completed requests by index; an index completed twice is ambiguous, so dropped."""
    seen = Counter(int(r["index"]) for r in run.completed)
    return {int(r["index"]): r for r in run.completed if seen[int(r["index"])] == 1}


def match_requests(a: Run, b: Run) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], int]:
    """(A's row, B's row) of each request completed in both, by index, never by position (the
    files may list them in another order); and how many measured indices of either run were
    left out (absent or failed in one, or repeated)."""
    ra, rb = _by_index(a), _by_index(b)
    keys = sorted(ra.keys() & rb.keys())
    measured = {int(r["index"]) for r in (*a.rows, *b.rows)}
    return [(ra[k], rb[k]) for k in keys], len(measured) - len(keys)


def _signed_error(observed: float | None, other: float | None) -> float | None:
    """(B - A) / A; None where A has no value to divide by (none, 0, or so near 0 that the
    error is past any float)."""
    if observed is None or observed <= 0 or other is None:
        return None
    error = (other - observed) / observed
    return error if math.isfinite(error) else None


def figure_errors(
    values: Sequence[tuple[RequestFigures, RequestFigures]], name: str
) -> dict[str, Any]:
    """One figure's per-request error of B against A: the median, P90 (linear between order
    statistics) and mean (MAPE) of |B - A| / A, and the bias, the median of (B - A) / A, so a
    simulator that is as often fast as slow does not look exact."""
    found = [_signed_error(a[name], b[name]) for a, b in values]
    signed = np.array([e for e in found if e is not None], dtype=float)
    if not len(signed):
        return {"median_ape": None, "p90_ape": None, "mape": None, "bias": None, "requests": 0}
    ape = np.abs(signed)
    with np.errstate(over="ignore", invalid="ignore"):  # huge errors: a sum past floats is null
        stats = [float(np.median(ape)), float(np.percentile(ape, 90)), float(ape.mean()),
                 float(np.median(signed))]  # fmt: skip
    median, p90, mape, bias = (finite(v) for v in stats)
    return {"median_ape": median, "p90_ape": p90, "mape": mape, "bias": bias,
            "requests": len(signed)}  # fmt: skip


def throughput_error(a: Input, b: Input) -> float | None:
    """(B - A) / A of output tokens/s, from the figures the deltas use (``point_figures``)."""
    ia = a.points[0].figures.get("output_tokens_per_s")
    ib = b.points[0].figures.get("output_tokens_per_s")
    return None if ia is None or ib is None else _signed_error(ia.mean, ib.mean)


def fidelity(a: Input, b: Input) -> dict[str, Any] | None:
    """How closely B reproduces A (the observed run) request by request: a mean can agree while
    every request is off. None unless both are single runs with ``MIN_MATCHED`` requests in
    common."""
    if a.kind != "run" or b.kind != "run" or len(a.runs) != 1 or len(b.runs) != 1:
        return None
    pairs, unmatched = match_requests(a.runs[0], b.runs[0])
    if len(pairs) < MIN_MATCHED:
        return None
    values = [(request_figures(ra), request_figures(rb)) for ra, rb in pairs]
    return {"matched": len(pairs), "unmatched": unmatched,
            "figures": {name: figure_errors(values, name) for name in FIDELITY_FIGURES},
            "throughput_error": throughput_error(a, b)}  # fmt: skip


def prediction_fidelity(measured: Input, predicted: Input) -> dict[str, Any]:
    """A prediction against the measurement it predicts, both aggregate-only, points matched
    by load: per point the predicted and measured median TPOT, median TTFT and total tokens/s
    per GPU with the signed error predicted / measured - 1; and the median absolute error of
    each over the points."""
    points_m, points_p = loads(measured), loads(predicted)
    errors: dict[str, list[float]] = {name: [] for name in PREDICTED}
    rows = []
    for load in sorted(points_m.keys() & points_p.keys()):
        fm = point_published(points_m[load], measured.gpus)
        fp = point_published(points_p[load], predicted.gpus)
        figures = {}
        for name in PREDICTED:
            m, pr = fm[name], fp[name]
            error = pr / m - 1 if m and pr is not None else None
            if error is not None:
                errors[name].append(error)
            figures[name] = {"predicted": pr, "measured": m, "error": error}
        rows.append({"concurrency": int(load[1]) if load[0] == "concurrency" else None,
                     "request_rate": load[1] if load[0] == "request_rate" else None,
                     "figures": figures})  # fmt: skip
    return {"kind": "aggregate", "measured": measured.label, "predicted": predicted.label,
            "points": rows, "median_abs_error": {
                name: float(np.median(np.abs(e))) if e else None for name, e in errors.items()}}  # fmt: skip
