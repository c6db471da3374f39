"""Every figure of a run, computed once from the records: latency, throughput, goodput, and
acceptance (per request, token-weighted, pooled histogram, per category, the spread between
requests), plus the cross-check of each request's verify steps and accepted drafts against its
``completion_tokens``."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from speclens.acceptance import AcceptanceHistogram, acceptance_length
from speclens.acceptance.spread import LEVEL_NAMES, implied_mean, weighted_quantiles
from speclens.runs.record import MAX_POSITIONS
from speclens.runs.request import RequestRecord, RunResult

SLO_METRICS = ("ttft", "tpot", "itl", "e2e")


def distribution(values: Iterable[float | None], scale: float = 1.0) -> dict[str, float] | None:
    """mean, p50, p90, p99, min, max (scaled, e.g. to ms); None when there are no values."""
    return weighted_distribution(((v, 1) for v in values if v is not None), scale)


def weighted_distribution(
    runs: Iterable[tuple[float, int]], scale: float = 1.0
) -> dict[str, float] | None:
    """``distribution`` of values given as ``(value, count)`` runs, never expanded: a run of a
    billion tokens costs what a run of one does. The percentiles are numpy's default (linear)
    ones over the expanded data, found through the cumulative counts."""
    kept = [(v, c) for v, c in runs if c > 0 and math.isfinite(v)]
    if not kept:
        return None
    values = np.array([v for v, _ in kept], dtype=float) * scale
    counts = np.array([c for _, c in kept], dtype=np.int64)
    order = np.argsort(values, kind="stable")
    values, counts = values[order], counts[order]
    ends = np.cumsum(counts)  # the expanded index each run ends before
    n = int(ends[-1])

    def value_at(i: int) -> float:
        return float(values[int(np.searchsorted(ends, i, side="right"))])

    def percentile(q: float) -> float:
        position = q / 100 * (n - 1)
        below = math.floor(position)
        t = position - below
        a, b = value_at(below), value_at(min(below + 1, n - 1))
        return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t  # numpy's lerp

    return {
        "mean": float(np.dot(values, counts.astype(float)) / n),
        "p50": percentile(50),
        "p90": percentile(90),
        "p99": percentile(99),
        "min": float(values[0]),
        "max": float(values[-1]),
        "count": n,
    }


def parse_slo(text: str | None) -> dict[str, float]:
    """``ttft:200,tpot:20`` (milliseconds) -> {"ttft": 0.2, "tpot": 0.02}."""
    if not text:
        return {}
    out: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.partition(":")
        name = name.strip().lower()
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"--slo: expected NAME:MS with NAME in {SLO_METRICS}, got {part!r}")
        try:
            out[name] = float(value) / 1000.0
        except ValueError:
            raise ValueError(f"--slo: {value!r} is not a number of milliseconds") from None
    return out


def _meets(record: RequestRecord, slo: dict[str, float]) -> bool:
    values = {
        "ttft": record.ttft,
        "tpot": record.tpot,
        "itl": max(gap for gap, _ in record.itl_runs) if record.itl_runs else None,
        "e2e": record.latency,
    }
    return all(values[name] is not None and values[name] <= limit for name, limit in slo.items())  # type: ignore[operator]


def consistency_problem(record: RequestRecord) -> str | None:
    """A request's stats claim more tokens than its response carried.

    Each verify step emits its accepted drafts plus one token and the first token comes from
    prefill, so the stats account for steps + accepted + 1 tokens per sequence. Only the last
    step can be cut short (max_tokens, a stop string, EOS), by at most K tokens, so
    completion_tokens must be at least steps + accepted + n (1 - K) over n sequences. (More
    tokens than that is normal: a step that proposed no drafts, as n-gram lookup often does, is
    not a verify step but still emits a token.) Counts-only records claim no steps: no check.
    """
    spec, tokens = record.spec, record.completion_tokens
    if spec is None or tokens is None or spec["num_spec_steps"] is None:
        return None
    n = len(record.spec_choices) if record.spec_choices else 1
    k = spec.get("num_spec_tokens") or max(spec.get("per_step_drafted") or [0])
    claimed = spec["num_spec_steps"] + spec["num_accepted_draft_tokens"] + n
    if tokens + n * k < claimed:
        return (
            f"stats account for {claimed} tokens but completion_tokens is {tokens}: more than "
            f"the last step's K = {k} can explain"
        )
    return None


def coverage(with_stats: Sequence[RequestRecord]) -> dict[str, Any]:
    """Draft coverage pooled over the records that report decode steps: their verify steps over
    their decode steps, and tokens per decode step 1 + accepted / decode steps (what a target
    forward after prefill yields, steps that drafted nothing included). None without such records.
    """
    covered = [
        r.spec
        for r in with_stats
        if r.spec
        and r.spec.get("num_decode_steps") is not None
        and r.spec["num_spec_steps"] is not None
    ]
    decode = sum(spec["num_decode_steps"] for spec in covered)
    spec_steps = sum(spec["num_spec_steps"] for spec in covered)
    accepted = sum(spec["num_accepted_draft_tokens"] for spec in covered)
    return {
        "draft_coverage": spec_steps / decode if decode else None,
        "draft_coverage_requests": len(covered),
        "decode_steps": decode if covered else None,
        "tokens_per_decode_step": acceptance_length(accepted, decode) if decode else None,
    }


def _category_coverage(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """One category's draft coverage and decode steps (None when no record reports them)."""
    pooled = coverage(records)
    return {"draft_coverage": pooled["draft_coverage"], "decode_steps": pooled["decode_steps"]}


def draft_units(with_stats: Sequence[RequestRecord]) -> dict[str, dict[str, int]]:
    """{unit: {engine: requests}}: what each request's num_draft_tokens counts ("unknown" when
    its adapter did not say)."""
    units: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in with_stats:
        assert r.spec is not None
        units[str(r.spec.get("draft_unit") or "unknown")][
            str(r.spec.get("engine") or "unknown")
        ] += 1
    return {u: dict(engines) for u, engines in sorted(units.items())}


def units_refusal(units: dict[str, dict[str, int]]) -> str | None:
    """Why draft acceptance rates are not pooled: their units differ (AL stays comparable)."""
    if len(units) < 2:
        return None
    parts = "; ".join(
        f"{unit}: {', '.join(f'{e} x{n}' for e, n in sorted(engines.items()))}"
        for unit, engines in units.items()
    )
    return (
        f"draft acceptance rates not pooled or compared: num_draft_tokens counts different "
        f"things ({parts}); AL stays comparable"
    )


#: The per-engine figures, as the report's columns.
DERIVED = (
    ("draft_acceptance_rate", "draft rate"),
    ("al_per_request", "AL per request"),
    ("al_from_server_counters", "AL from counters"),
    ("histogram", "histogram"),
    ("per_step", "per-step"),
    ("decode_steps", "decode steps"),
)


def derivable(with_stats: Sequence[RequestRecord]) -> dict[str, dict[str, Any]]:
    """Per engine, which figures its requests' records could give: "yes" (every request),
    "some", or "no". AL from the server's counters is decided by the run (it needs a scrape)."""
    by_engine: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in with_stats:
        assert r.spec is not None
        by_engine[str(r.spec.get("engine") or "unknown")].append(r.spec)

    def share(specs: list[dict[str, Any]], key: str) -> str:
        have = sum(1 for spec in specs if spec.get(key) is not None)
        return "yes" if have == len(specs) else "some" if have else "no"

    return {
        engine: {
            "requests": len(specs),
            "draft_acceptance_rate": "yes",
            "al_per_request": share(specs, "num_spec_steps"),
            "histogram": share(specs, "acceptance_histogram"),
            "per_step": share(specs, "per_step_accepted"),
            "decode_steps": share(specs, "num_decode_steps"),
        }
        for engine, specs in sorted(by_engine.items())
    }


#: The histogram over requests: this many equal bins over [1, K + 1].
REQUEST_BINS = 20


def _request_row(spec: dict[str, Any]) -> tuple[int, int, int | None]:
    """(verify steps, accepted drafts, sum over steps of accepted squared) of one request; the
    last None when it reports no histogram, or one that does not add up to its counts."""
    steps, accepted = spec["num_spec_steps"], spec["num_accepted_draft_tokens"]
    raw = spec.get("acceptance_histogram")
    if not isinstance(raw, dict):
        return steps, accepted, None
    counted = drafts = squares = 0
    for key, n in raw.items():
        j = int(key)
        counted += n
        drafts += j * n
        squares += j * j * n
    if counted != steps or drafts != accepted:
        return steps, accepted, None
    return steps, accepted, squares


def request_spread(
    rows: Sequence[tuple[int, int, int | None]], k: int | None
) -> dict[str, Any] | None:
    """The per-request AL distribution of requests given as (verify steps, accepted drafts,
    sum of accepted squared or None), each request weighted by its verify steps, so that its
    mean is their pooled AL; None without a request of at least one step.

    ``quantiles`` at ``spread.LEVELS``; ``histogram`` over requests (``REQUEST_BINS`` equal bins
    over [1, K + 1], each bin's share of verify steps and count of requests); ``variance``, the
    per-step variance of tokens per verify step split by the law of total variance: ``within``
    (each request's own variance about its AL, step-weighted; None when a request reports no
    histogram) plus ``between_observed`` (the step-weighted variance of request ALs). The
    observed part carries sampling noise (a request of s steps has an AL that is off by about
    its own variance over s even when every request is alike): ``noise`` estimates it, each
    request's steps taken as independent, as sum w_i (1 - w_i) var_i / s_i (w_i = s_i / S,
    var_i its unbiased own variance, the pooled one for a request of one step), and
    ``between`` = observed - noise, at least 0. Exact integer sums, numpy only for the sort-free
    sums: 100k requests cost well under a second."""
    kept = [(s, a, q) for s, a, q in rows if s > 0]
    if not kept:
        return None
    steps = np.array([s for s, _, _ in kept], dtype=float)
    accepted = np.array([a for _, a, _ in kept], dtype=float)
    als = 1.0 + accepted / steps
    total_steps = float(steps.sum())
    weights = steps / total_steps
    mean = float(weights @ als)
    observed = float(weights @ (als - mean) ** 2)
    quantiles = weighted_quantiles(als.tolist(), steps.tolist())
    missing = sum(1 for _, _, q in kept if q is None)
    variance: dict[str, Any] = {"total": None, "within": None, "between_observed": observed,
                                "noise": None, "between": None, "between_share": None}  # fmt: skip
    if not missing:
        # Each request's own variance about its AL, exact: (s Q - a^2) / s^2.
        own = np.array([(s * q - a * a) / (s * s) for s, a, q in kept if q is not None])
        within = float(weights @ own)
        variance.update(within=within, total=within + observed)
        variance.update(_noise(steps, weights, own, observed, within + observed))
    return {
        "requests": len(kept),
        "verify_steps": int(sum(s for s, _, _ in kept)),
        "mean": mean,
        "quantiles": dict(zip(LEVEL_NAMES, quantiles, strict=True)),
        "implied_mean": implied_mean(quantiles),
        "without_histogram": missing,
        "histogram": _request_histogram(als, weights, k),
        "variance": variance,
    }


def _noise(
    steps: np.ndarray, weights: np.ndarray, own: np.ndarray, observed: float, total: float
) -> dict[str, Any]:
    """The sampling noise in the observed between-request variance, and what is left of it
    (see ``request_spread``); nothing when no request has two steps to estimate a variance."""
    several = steps >= 2
    if not several.any():
        return {}
    unbiased = np.zeros_like(own)
    unbiased[several] = own[several] * steps[several] / (steps[several] - 1)
    pooled = float((own[several] * steps[several]).sum() / (steps[several] - 1).sum())
    unbiased[~several] = pooled
    noise = float((weights * (1 - weights) * unbiased / steps).sum())
    between = max(0.0, observed - noise)
    return {"noise": noise, "between": between,
            "between_share": between / total if total > 0 else None}  # fmt: skip


def _request_histogram(als: np.ndarray, weights: np.ndarray, k: int | None) -> dict[str, Any]:
    """Requests by their AL in ``REQUEST_BINS`` equal bins over [1, K + 1] (K unknown: up to
    the whole number at or above the largest AL); the last bin holds its upper edge."""
    top = float(k + 1) if k else float(max(2, math.ceil(float(als.max()))))
    edges = np.linspace(1.0, top, REQUEST_BINS + 1)
    index = np.clip(np.searchsorted(edges, als, side="right") - 1, 0, REQUEST_BINS - 1)
    return {
        "edges": edges.tolist(),
        "step_share": np.bincount(index, weights=weights, minlength=REQUEST_BINS).tolist(),
        "requests": np.bincount(index, minlength=REQUEST_BINS).astype(int).tolist(),
    }


def acceptance(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Acceptance over the requests that carried stats. Counts-only records (llama.cpp) add to
    the draft acceptance rate but not to the histogram, the verify steps or any AL; draft
    acceptance rates are pooled only when every record counts drafts in the same unit.
    ``per_request`` (and each ``al_by_category`` row's) is the spread between requests
    (``request_spread``) over the requests with a verify step; the run's says how many were
    left out (counts only, no verify step)."""
    with_stats = [r for r in records if r.spec is not None]
    stepped = [r for r in with_stats if r.spec and r.spec["num_spec_steps"] is not None]
    counts_only = [r for r in with_stats if r.spec and r.spec["num_spec_steps"] is None]
    pooled = AcceptanceHistogram()
    drafted = accepted = steps = stepped_accepted = 0
    per_category: dict[str, AcceptanceHistogram] = defaultdict(AcceptanceHistogram)
    for r in with_stats:
        spec = r.spec
        assert spec is not None
        drafted += spec["num_draft_tokens"]
        accepted += spec["num_accepted_draft_tokens"]
    problems = {id(r): p for r in with_stats if (p := consistency_problem(r))}
    inconsistent = [
        {"index": r.index, "problem": problems[id(r)]} for r in with_stats if id(r) in problems
    ]
    # A verdict's evidence: the histograms of the requests whose stats fit their completion_tokens.
    evidence = AcceptanceHistogram()
    evidence_requests = 0
    for r in stepped:
        spec = r.spec
        assert spec is not None
        steps += spec["num_spec_steps"]
        stepped_accepted += spec["num_accepted_draft_tokens"]
        if spec["acceptance_histogram"] is not None:
            hist = AcceptanceHistogram({int(j): n for j, n in spec["acceptance_histogram"].items()})
            pooled.update(hist)
            per_category[r.category].update(hist)
            if id(r) not in problems:
                evidence.update(hist)
                evidence_requests += 1
    statuses: dict[str, int] = defaultdict(int)
    for r in records:
        statuses[r.spec_status] += 1
    k = next(
        (r.spec["num_spec_tokens"] for r in with_stats if r.spec and r.spec.get("num_spec_tokens")),
        None,
    )
    # Steps whose first p + 1 drafts were accepted, p = 0..K-1 (vLLM's per-position counter);
    # K and j come from the wire, so the width is bounded.
    width = min(max(k or 0, *pooled.counts, 0), MAX_POSITIONS)
    per_position = [sum(n for j, n in pooled if j > p) for p in range(width)]
    units = draft_units(with_stats)
    refusal = units_refusal(units)
    hist_steps = pooled.num_steps
    spread_rows: dict[str, list[tuple[int, int, int | None]]] = defaultdict(list)
    for r in stepped:
        assert r.spec is not None
        spread_rows[r.category].append(_request_row(r.spec))
    overall = request_spread([row for rows in spread_rows.values() for row in rows], k)
    if overall is not None:
        overall["left_out"] = {
            "counts_only": len(counts_only),
            "no_verify_step": sum(1 for r in stepped if r.spec and not r.spec["num_spec_steps"]),
        }
    return {
        "requests_with_stats": len(with_stats),
        "detection": dict(statuses),
        "adapters": sorted({r.spec_adapter for r in with_stats if r.spec_adapter}),
        "num_spec_tokens": k,
        "per_request_al": distribution(r.spec["mean_acceptance_length"] for r in stepped if r.spec and r.spec["num_spec_steps"]),
        "per_request_draft_acceptance_rate": None if refusal else distribution(
            r.spec["draft_acceptance_rate"] for r in with_stats if r.spec and r.spec["num_draft_tokens"]
        ),
        "token_weighted_al": acceptance_length(stepped_accepted, steps) if steps else None,
        "draft_acceptance_rate": accepted / drafted if drafted and not refusal else None,
        "draft_units": units,
        "draft_rate_refused": refusal,
        "accepted_per_step": stepped_accepted / steps if steps else None,
        "verify_steps": steps,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "counts_only_requests": len(counts_only),
        "counts_only_engines": sorted({str(r.spec.get("engine")) for r in counts_only if r.spec}),
        "histogram": {str(j): n for j, n in pooled.counts.items()},
        "histogram_steps": hist_steps,
        "evidence_histogram": {str(j): n for j, n in evidence.counts.items()},
        "evidence_steps": evidence.num_steps,
        "evidence_requests": evidence_requests,
        "accepted_per_position": per_position,
        "per_position_rates": [n / hist_steps for n in per_position] if hist_steps else None,
        "zero_step_requests": sum(1 for r in stepped if r.spec and r.spec["num_spec_steps"] == 0),
        "per_request": overall,
        "al_by_category": {
            c: {"al": h.acceptance_length, "verify_steps": h.num_steps,
                **_category_coverage([r for r in stepped if r.category == c]),
                "per_request": request_spread(spread_rows[c], k)}
            for c, h in sorted(per_category.items())
        },
        "derivable": derivable(with_stats),
        "inconsistent_requests": inconsistent,
        **coverage(with_stats),
    }  # fmt: skip


def summarize(result: RunResult, slo: dict[str, float] | None = None) -> dict[str, Any]:
    measured = [r for r in result.records if not r.warmup]
    ok = [r for r in measured if r.success]
    duration = result.duration or float("nan")
    output_tokens = sum(r.completion_tokens or 0 for r in ok)
    figures: dict[str, Any] = {
        "requests": {
            "sent": len(measured),
            "completed": len(ok),
            "failed": len(measured) - len(ok),
            "warmup": len(result.records) - len(measured),
            "errors": _error_counts(measured),
            "unparsable_events": sum(r.unparsable_events for r in measured),
            "with_anomalies": sum(1 for r in measured if r.anomalies),
            "anomalies": _anomaly_counts(measured),
        },
        "duration_s": result.duration,
        "interrupted": result.interrupted,
        "throughput": {
            "requests_per_s": len(ok) / duration if ok else 0.0,
            "output_tokens_per_s": output_tokens / duration if ok else 0.0,
            "total_output_tokens": output_tokens,
            "total_prompt_tokens": sum(r.prompt_tokens or 0 for r in ok),
        },
        "latency_ms": {
            "ttft": distribution((r.ttft for r in ok), 1000.0),
            "tpot": distribution((r.tpot for r in ok), 1000.0),
            "itl": weighted_distribution((run for r in ok for run in r.itl_runs), 1000.0),
            "e2e": distribution((r.latency for r in ok), 1000.0),
        },
        "acceptance": acceptance(ok),
    }
    if slo:
        good = [r for r in ok if _meets(r, slo)]
        figures["goodput"] = {
            "slo_ms": {k: v * 1000 for k, v in slo.items()},
            "requests_per_s": len(good) / duration if good else 0.0,
            "fraction": len(good) / len(ok) if ok else 0.0,
        }
    return figures


def _anomaly_counts(records: Iterable[RequestRecord]) -> dict[str, int]:
    """Requests per field a response got wrong (an anomaly note is ``<field>: <what>``)."""
    counts: dict[str, int] = defaultdict(int)
    for r in records:
        for kind in {a.split(":", 1)[0][:60] for a in r.anomalies}:
            counts[kind] += 1
    return dict(counts)


def _error_counts(records: Iterable[RequestRecord]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for r in records:
        if r.error:
            counts[r.error.split(":", 1)[0][:60]] += 1
    return dict(counts)
