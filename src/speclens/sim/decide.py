"""Best K at a target interactivity, from a simulated grid over K and concurrency.

Each K's points (one per concurrency) give output tok/s per GPU against tok/s per user
(1000 / mean TPOT in ms, as compare reads a run: one definition). The K's Pareto curve keeps
the points no other point of that K beats on both; the figure at interactivity X is linear
between the curve's two neighbours around X. A curve that does not span X has no figure there
(no extrapolation): it says which range it spans. The curve and the line are compare's
(``runs.compare_deltas.pareto_front`` and ``interpolate``).
A simulated point is one run, so the figures carry no interval. Where a K's AL came from a
profile of method ``inferred`` (``calibrate --acceptance-from`` writes them: the AL a run's TPOT
implies, the other Ks from ``acceptance.curve``'s model), the line says so, and from what (the
profile's provenance source): the best K is then only as good as that inference.
Under an SLO (``--slo``) a point whose per-request tails miss it (its ``SLO_PERCENTILE`` TTFT,
TPOT or E2E over the limit) leaves its K's curve before the curve is drawn, and the line says
how many left: a K that wins on mean TPOT can lose once its slow requests are counted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from speclens.runs.compare_deltas import CurvePoint, Estimate, interpolate, pareto_front
from speclens.runs.decision import Choice, k_span
from speclens.runs.decision import headline as sentence
from speclens.runs.decision import k_name as label

#: Said of every figure: the simulator runs each point once (a pure function of its seed).
NO_INTERVAL = "no interval: one simulated run a point"
#: The throughput the decision reads, as its line names it (output tokens only: compare's
#: ``--metric output``).
UNIT = "output tok/s/GPU"
#: The per-request percentile a point is held to under an SLO: a limit met by the median
#: request but not by the slowest tenth is missed.
SLO_PERCENTILE = "p90"


def slo_misses(row: dict[str, Any], slo: dict[str, float]) -> list[str]:
    """What of ``row``'s per-request tails misses ``slo`` (seconds by metric), each as "TPOT
    p90 31.2 ms over 30 ms"; empty when every limit is met."""
    out = []
    for name, limit in slo.items():
        figure = (row["latency_ms"].get(name) or {}).get(SLO_PERCENTILE)
        if figure is None or not figure <= limit * 1000:
            said = "unknown" if figure is None else f"{figure:,.1f} ms"
            out.append(f"{name.upper()} {SLO_PERCENTILE} {said} over {limit * 1000:g} ms")
    return out


def slo_text(slo: dict[str, float]) -> str:
    """``tpot 30 ms, ttft 200 ms``."""
    return ", ".join(f"{name} {limit * 1000:g} ms" for name, limit in slo.items())


def _curve(points: Sequence[tuple[float, float]]) -> list[CurvePoint]:
    """(interactivity, throughput) points as compare's curve points: one run each, no spread."""
    return [CurvePoint(x, Estimate(y, 0.0, math.inf)) for x, y in points]


def pareto(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (interactivity, throughput) points no other point beats on both, by interactivity."""
    return [(c.x, c.y.mean) for c in pareto_front(_curve(points))]


def at(curve: Sequence[tuple[float, float]], x: float) -> float | None:
    """The curve's throughput at interactivity ``x``, linear between neighbours; None outside."""
    found = interpolate(_curve(curve), x)
    return None if found is None else found.mean


def decide(
    rows: Sequence[tuple[int, dict[str, Any]]], target: float, gpus: int,
    slo: dict[str, float] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The decision over a K x concurrency grid of (K, ``speclens sim`` row) pairs (each row with
    ``throughput``, ``latency_ms`` and ``resolution``; K 0: no speculation) at ``target``
    tok/s/user, on ``gpus`` GPUs; with ``slo`` (seconds by metric) only over the points that
    meet it (``slo_misses``)."""
    by_k: dict[int, list[dict[str, Any]]] = {}
    for k, row in rows:
        by_k.setdefault(k, []).append(row)
    ks = []
    for k, group in sorted(by_k.items()):
        points = []
        left_out = []
        for row in group:
            misses = slo_misses(row, slo) if slo else []
            if misses:
                left_out.append({"sweep": row.get("sweep"), "misses": misses})
                continue
            tpot = (row["latency_ms"].get("tpot") or {}).get("mean")
            if tpot and tpot > 0:
                points.append((1000.0 / tpot, row["throughput"]["output_tokens_per_s"] / gpus))
        curve = pareto(points)
        value = at(curve, target)
        res = group[0].get("resolution") or {}
        entry: dict[str, Any] = {
            "num_spec_tokens": k,
            "acceptance_length": res.get("acceptance_length"),
            "acceptance_method": res.get("method"),
            "acceptance_source": res.get("source"),
            "tok_s_gpu": value,
            "curve": [{"tok_s_user": x, "tok_s_gpu": y} for x, y in curve],
        }
        if value is None:
            span = f"{curve[0][0]:,.1f} to {curve[-1][0]:,.1f} tok/s/user" if curve else "no points"
            entry["reason"] = f"its curve spans {span}, not {target:g}"
            if left_out:
                entry["reason"] += f" ({len(left_out)} of {len(group)} points miss the SLO)"
        if slo:
            entry["left_out"] = left_out
        ks.append(entry)
    reached = [e for e in ks if e["tok_s_gpu"] is not None]
    best = max(reached, key=lambda e: e["tok_s_gpu"]) if reached else None
    for e in ks:
        value = e["tok_s_gpu"]
        e["ratio_to_best"] = value / best["tok_s_gpu"] if best and value is not None else None
    line = headline(ks, best, target)
    held: dict[str, Any] = {}
    if slo:
        gone = sum(len(e["left_out"]) for e in ks)
        held["slo"] = {"slo_ms": {n: v * 1000 for n, v in slo.items()},
                       "percentile": SLO_PERCENTILE, "left_out": gone, "points": len(rows)}  # fmt: skip
        line += (
            f"; {gone} of {len(rows)} points left out: their per-request {SLO_PERCENTILE} "
            f"misses the SLO ({slo_text(slo)})" if gone else
            f"; every point's per-request {SLO_PERCENTILE} meets the SLO ({slo_text(slo)})"
        )  # fmt: skip
    return {
        "tok_s_user": target,
        "gpus": gpus,
        "interval": NO_INTERVAL,
        "best": best["num_spec_tokens"] if best else None,
        "best_tok_s_gpu": best["tok_s_gpu"] if best else None,
        "ks": ks,
        "headline": line,
        **held,
    }


def headline(ks: list[dict[str, Any]], best: dict[str, Any] | None, target: float) -> str:
    """The decision in one line (the first of the terminal output), worded as compare's
    (``runs.decision``); ``best`` is implied by ``ks`` and kept for the callers."""
    # too fast: every curve starts above the target with none of its points left out by an SLO
    # (a point left out, not the batch, is then why the curve stops short)
    too_fast = bool(ks) and all(e["curve"] and e["curve"][0]["tok_s_user"] > target
                                and not e.get("left_out") for e in ks)  # fmt: skip
    choices = [Choice(label(e["num_spec_tokens"]), e["tok_s_gpu"]) for e in ks]
    line = sentence(choices, target, k_span([e["num_spec_tokens"] for e in ks]), too_fast=too_fast,
                    unit=UNIT)  # fmt: skip
    return line + inferred(ks)


def inferred(ks: list[dict[str, Any]]) -> str:
    """What the line adds where a K's AL was inferred, not measured: "; the AL at each K was
    inferred, from SOURCE" (or "at K 2, 4" where only some were), else nothing."""
    spec = [e for e in ks if e["num_spec_tokens"]]
    guessed = [e for e in spec if e.get("acceptance_method") == "inferred"]
    if not guessed:
        return ""
    sources = list(dict.fromkeys(str(e.get("acceptance_source") or "an unnamed source")
                                 for e in guessed))  # fmt: skip
    which = ("each K" if len(guessed) == len(spec)
             else "K " + ", ".join(str(e["num_spec_tokens"]) for e in guessed))  # fmt: skip
    return f"; the AL at {which} was inferred, from {' and '.join(sources)}"
