"""``speclens compare``: runs and sweeps side by side, comparability first.

Each pair of inputs (``compare_inputs``: run and sweep directories, read through bounds) is
checked first (``compare_checks``); a pair that fails a check is "not comparable: <why>" and
every delta it prints says so. Then the deltas with their intervals (``compare_deltas``) and,
for two single runs of the same requests, B's error against A request by request
(``fidelity``).

Aggregate-only inputs (published figures, no records.jsonl: ``aggregate_pair``): the checks that
need per-request data say so and neither pass nor fail. The deltas are the published medians
and throughput per GPU, with no interval. Two verdicts of their own: a speculation A/B (same
deployment and load, speculation off in one, on in the other) and a prediction against a
measurement (the fidelity block, point by point). Otherwise "published figures only", which is
not comparable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from speclens.runs.compare_checks import aggregate_checks, checks, who_is_aggregate_only
from speclens.runs.compare_deltas import (
    DEFAULT_METRIC,
    ONE_RUN_EACH,
    input_curve,
    matched_concurrency,
    matched_interactivity,
    published_deltas,
    published_interactivity,
    speculation_ab,
)
from speclens.runs.compare_inputs import Input, Point
from speclens.runs.fidelity import fidelity, prediction_fidelity
from speclens.runs.points import PointError, point_figures
from speclens.runs.rundir import InputError
from speclens.runs.stats import Interval

SCHEMA = "speclens.compare/1"
#: Verdicts a pair can have; compare exits 0 only when every pair's is one of the first three.
VERDICTS = ("comparable", "speculation A/B", "prediction", "published figures only",
            "not comparable")  # fmt: skip


def _figures(point: Point, seed: int) -> dict[str, Interval]:
    try:
        return point_figures([run.path for run in point.runs], seed=seed)
    except PointError as exc:
        raise InputError([str(exc)], 1) from None


def compare_pair(
    a: Input,
    b: Input,
    named: Sequence[str],
    metric: str = DEFAULT_METRIC,
    target: float | None = None,
) -> dict[str, Any]:
    """One pair's checks, verdict and deltas; throughput the ``metric``'s (total or output
    tokens/s); ``target``: the tok/s/user a speculation A/B's headline reads at."""
    if a.aggregate_only or b.aggregate_only:
        return aggregate_pair(a, b, named, metric, target)
    found = checks(a, b, named)
    failed = [c for c in found if not c.ok]
    comparable = not failed
    predicted = [x for x in (a, b) if x.prediction]
    verdict = "comparable" if comparable else "not comparable"
    label = (
        "comparable"
        if comparable
        else "not comparable: " + "; ".join(f"{c.name} ({c.detail})" for c in failed)
    )
    if comparable and len(predicted) == 1:  # a simulation against a measurement
        verdict = "prediction"
        measured = b if predicted[0] is a else a
        label = (f"comparable as a prediction against a measurement: {predicted[0].label} "
                 f"predicts {measured.label}")  # fmt: skip
    prefix = "" if comparable else f"NOT COMPARABLE ({', '.join(c.name for c in failed)}): "
    interactivity, note = matched_interactivity(a, b, prefix, metric)
    rows = matched_concurrency(a, b, metric)
    one_run = any(row["interval_basis"] == "requests" for row in rows)
    return {
        "a": a.label, "b": b.label, "comparable": comparable, "verdict": verdict,
        "checks": [c.to_json() for c in found],
        "deltas": {"matched_concurrency": rows,
                   "matched_interactivity": interactivity, "interactivity_note": note,
                   "noise_note": ONE_RUN_EACH if one_run else None},
        "fidelity": fidelity(a, b), "label": label,
    }  # fmt: skip


def aggregate_pair(
    a: Input,
    b: Input,
    named: Sequence[str],
    metric: str = DEFAULT_METRIC,
    target: float | None = None,
) -> dict[str, Any]:
    """A pair with an aggregate-only input: the checks that need per-request data say so and
    neither pass nor fail; the deployment, published lengths, load and speculation are checked
    from the settings. Its verdict: not comparable (a check failed), a speculation A/B, a
    prediction against a measurement, or published figures only (checks did not run)."""
    both = a.aggregate_only and b.aggregate_only
    predicted = [x for x in (a, b) if x.prediction]
    # A prediction against a published measurement, whether the prediction kept its records
    # (sim --output-dir) or is aggregate-only too (sim --trace on published points).
    one_prediction = len(predicted) == 1 and (b if predicted[0] is a else a).aggregate_only
    found, ab = aggregate_checks(a, b, named, one_prediction)
    failed = [c for c in found if c.ok is False]
    not_run = [c.name for c in found if c.ok is None]
    speculation = fid = None
    if failed:
        verdict = "not comparable"
        label = "not comparable: " + "; ".join(f"{c.name} ({c.detail})" for c in failed)
    elif one_prediction and ab is None:
        verdict = "prediction"
        measured = b if predicted[0] is a else a
        fid = prediction_fidelity(measured, predicted[0])
        label = (f"comparable as a prediction against a measurement: {predicted[0].label} "
                 f"predicts {measured.label} ({len(not_run)} checks need per-request data)")  # fmt: skip
    elif ab is not None and both:
        verdict = "speculation A/B"
        speculation = speculation_ab(*ab, metric=metric, target=target)
        label = "comparable as a speculation A/B"
        if predicted:  # a predicted side is said, whichever it is
            label += f" ({' and '.join(x.label for x in predicted)} predicted)"
    else:
        verdict = "published figures only"
        label = (f"published figures only: {len(not_run)} checks need per-request data "
                 f"({', '.join(not_run)}; {who_is_aggregate_only(a, b)}): deltas without "
                 "intervals")  # fmt: skip
    comparable = verdict in VERDICTS[:3]
    prefix = "" if comparable else ("NOT COMPARABLE: " if failed else "UNCHECKED: ")
    interactivity, note = published_interactivity(a, b, prefix, metric)
    return {
        "a": a.label, "b": b.label, "comparable": comparable, "verdict": verdict,
        "checks": [c.to_json() for c in found],
        "deltas": {"matched_concurrency": published_deltas(a, b, metric),
                   "matched_interactivity": interactivity, "interactivity_note": note},
        "fidelity": fid, "speculation": speculation, "label": label,
    }  # fmt: skip


def compare(
    inputs: Sequence[Input],
    named: Sequence[str] = (),
    seed: int = 0,
    metric: str = DEFAULT_METRIC,
    target: float | None = None,
) -> dict[str, Any]:
    """compare.json: every input, and every pair (A against each later input) with its checks,
    deltas and, for two single runs of the same requests, fidelity. Throughput is the
    ``metric``'s throughout (``metric`` in the object); ``target``: ``--at-interactivity``."""
    for item in inputs:
        for point in item.points:
            point.figures = _figures(point, seed)
    pairs = [compare_pair(a, b, named, metric, target)
             for i, a in enumerate(inputs) for b in inputs[i + 1 :]]  # fmt: skip
    described = [{**item.to_json(), "curve": input_curve(item, metric)} for item in inputs]
    notes = [note for pair in pairs for note in speedup_notes(pair)]
    return {"schema": SCHEMA, "metric": metric, "inputs": described, "pairs": pairs,
            "notes": notes}  # fmt: skip


def speedup_notes(pair: dict[str, Any]) -> list[str]:
    """The odd run flagged: a speculation A/B whose measured TPOT speedup (off over on) is
    below 1 at some load gets one line naming the comparison and the loads, since speculation
    that slows decoding down says more about the run's settings than about the method."""
    ab = pair.get("speculation") or {}
    slow = [r for r in ab.get("speedup") or [] if r["speedup"] < 1]
    if not slow:
        return []
    where = ", ".join(
        (f"concurrency {r['concurrency']}" if r["concurrency"] is not None
         else f"{r['request_rate']:g} req/s") + f" ({r['speedup']:.3g}x)"
        for r in slow
    )  # fmt: skip
    return [f"{ab['method']} is slower than no speculation at {where} ({ab['on']} against "
            f"{ab['off']}: median TPOT off / on below 1): check {ab['on']}'s speculation "
            "settings"]  # fmt: skip
