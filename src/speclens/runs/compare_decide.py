"""``speclens compare --at-interactivity X`` and ``speclens compare SWEEP_DIR``.

The decision: each input's tok/s per GPU (total or output, ``--metric``) at X tok/s/user, read
off the input's own curve wherever X lies inside it, never extrapolated (``reading``): a measured
input's Pareto front (``compare_deltas.pareto``, linear between the two neighbours around X,
``compare_deltas.interpolate``) with its 95% interval on the log scale; an aggregate-only
input's published curve (linear in log throughput), labelled so, with no interval; a predicted
input's own curve, its band the prediction's expected error where known
(``Input.expected_error``). Then which input delivers the most and its gain over the first input
(or, where the first is best, the runner-up against it) as a ratio with its interval
(``compare_deltas.ratio``). The lead is "not resolved" unless both sides have an interval, each
measured side has ``MIN_ROUNDS`` rounds, and the ratio's interval clears 1. An input whose curve
does not span X says which range it spans. The sentence is the one ``speclens sim
--at-interactivity`` prints (``speclens.runs.decision``).

One sweep given alone is compared whole: its points are grouped by what the sweep varies
besides the load (K above all, and the engine and forced AL where those vary too); each group
is an input whose points over concurrency form its curve, labelled "K 4" (or "vllm K 4", "K 4
AL 2.5"). A sweep that varies only the load has nothing to compare within it.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from speclens.runs.compare_deltas import (
    ONE_RUN_EACH,
    CurvePoint,
    Estimate,
    finite,
    interpolate,
    log_bounds,
    log_interpolate,
    metric_words,
    pareto,
    quantile,
    ratio,
    throughput_curve,
    total_factor,
    unit,
)
from speclens.runs.compare_inputs import Input, Point
from speclens.runs.decision import Choice, headline, k_name, k_span
from speclens.runs.rundir import InputError

#: Bounds of ``--at-interactivity`` (tokens/s per user).
MAX_TARGET = 1e6

#: The settings of a sweep point that name a choice within one sweep (the load does not).
_CHOICE_KEYS = ("num_speculative_tokens", "acceptance_length")

#: The settings a sweep's points must share to be one workload when they record no
#: ``prompts_sha256`` (the simulator's points): everything but the load and K.
_WORKLOAD_SKIP = frozenset({"concurrency", "request_rate", "num_spec_tokens", "num_requests",
                            "duration", "host", "shard", "url", "urls"})  # fmt: skip

NEEDS_CHOICES = ("expected a sweep over K (num_speculative_tokens), engines or AL to compare its "
                 "points, or two or more run or sweep directories")  # fmt: skip


def split_sweep(items: Sequence[Input]) -> list[Input]:
    """The inputs of one sweep (one per engine, as ``compare_inputs.read_inputs`` reads it)
    split into one input per choice (engine, K, AL), each with its points over the load. An
    InputError (exit 2) when the sweep varies only the load."""
    groups: dict[tuple[Any, ...], list[Point]] = {}
    for item in items:
        for point in item.points:
            key = (point.engine or "", *(point.settings.get(k) for k in _CHOICE_KEYS))
            groups.setdefault(key, []).append(point)
    path = items[0].path
    if len(groups) < 2:
        raise InputError([f"{path}: {NEEDS_CHOICES}; its points vary only "
                          f"{_load_axes(items)}"], 2)  # fmt: skip
    keys = sorted(groups, key=lambda k: tuple((v is None, v) for v in k))
    varied = [len({k[i] for k in keys}) > 1 for i in range(3)]
    out = []
    for key in keys:
        engine, k, al = key
        parts = [str(engine)] if varied[0] and engine else []
        if varied[1] or not (varied[0] or varied[2]):
            parts.append(k_name(k) if k is not None else "K unknown")
        if varied[2]:
            parts.append(f"AL {al:g}" if al is not None else "natural AL")
        skipped = items[0].skipped
        out.append(Input(" ".join(parts), path, "sweep", groups[key], items[0].gpus, skipped))
    return out


def whole_sweep(items: Sequence[Input], named: Sequence[str]) -> tuple[list[Input], list[str]]:
    """One sweep compared whole: its choices as inputs (``split_sweep``), its points' shared
    workload as their prompts digest where they record none (``workload_digest``), and K named
    as a difference (``--differ k``) where the sweep varies it: by design, not by accident."""
    split = split_sweep(items)
    workload_digest(split)
    ks = {p.settings.get("num_speculative_tokens") for item in split for p in item.points}
    return split, [*named, *(["k"] if len(ks) > 1 and "k" not in named else [])]


def selection(item: Input) -> dict[str, Any]:
    """Which points of its sweep an input of ``split_sweep`` holds: its engine and choice
    settings (compare.json's ``inputs[].select``; the report plots those points only)."""
    point = item.points[0]
    return {"engine": point.engine, **{k: point.settings.get(k) for k in _CHOICE_KEYS}}


def _load_axes(items: Sequence[Input]) -> str:
    loads = sorted({p.load[0] for item in items for p in item.points if p.load is not None})
    return " and ".join(name.replace("_", " ") for name in loads) or "nothing"


def workload_digest(items: Sequence[Input]) -> str | None:
    """A digest of the workload settings a sweep's points share, given to each point's runs
    that record no ``prompts_sha256`` (so the prompts check compares the points' workloads, not
    "unknown"); None when they do not share one (the check then says so, as for any run)."""
    found = set()
    runs = [run for item in items for run in item.runs]
    for run in runs:
        shared = {k: v for k, v in run.settings.items() if k not in _WORKLOAD_SKIP}
        found.add(hashlib.sha256(orjson.dumps(shared, option=orjson.OPT_SORT_KEYS)).hexdigest())
    if len(found) != 1:
        return None
    digest = found.pop()
    for run in runs:
        if run.settings.get("prompts_sha256") is None:
            run.summary["settings"] = {**run.settings, "prompts_sha256": digest}
    return digest


#: Rounds a side below which a lead is "not resolved", whatever its interval says: two
#: rounds' Student t has 1 degree of freedom (t = 12.7), so its interval says little.
MIN_ROUNDS = 3


def _kind(item: Input) -> str:
    """How an input's figure is known: "predicted" (a simulator's), "aggregate-only"
    (published, no interval) or "measured"."""
    return (
        "predicted" if item.prediction else "aggregate-only" if item.aggregate_only else "measured"
    )


def _basis(item: Input) -> str:
    """ "rounds" when every point repeated (Student t across rounds), else "requests"."""
    methods = [p.figures.get("output_tokens_per_s") for p in item.points]
    rounds = all(m is not None and m.method == "t" and m.n > 1 for m in methods)
    return "rounds" if rounds else "requests"


def _single_k(item: Input) -> int | None:
    found = {p.settings.get("num_speculative_tokens") for p in item.points}
    found |= {k for run in item.runs for k in run.ks()}
    ks = {int(k) for k in found if k is not None}
    return next(iter(ks)) if len(ks) == 1 else None


def _rounds_at(curve: Sequence[CurvePoint], x: float) -> int:
    """The fewest rounds behind the curve points a reading at ``x`` rests on."""
    for left, right in itertools.pairwise(curve):
        if left.x <= x <= right.x:
            return min(left.rounds, right.rounds)
    return min((c.rounds for c in curve), default=0)


def reading(
    item: Input, target: float, metric: str
) -> tuple[list[tuple[float, float]], Estimate | None, int]:
    """An input's curve ((tok/s/user, tok/s/GPU) points), its figure at ``target`` and the
    rounds behind it. Measured: its Pareto front, linear between neighbours, with its SE.
    Aggregate-only: the published curve, linear in log throughput (``log_interpolate``), no
    SE. Predicted: its own curve read the same way, its SE the expected error's
    (``Input.expected_error``: the band value / (1 + e) to value x (1 + e)), else none: the
    spread of a simulator's requests is not the prediction's error."""
    if item.aggregate_only:
        published = throughput_curve(item, metric)
        value = log_interpolate(published, target)
        est = None if value is None else Estimate(value, math.nan, math.inf)
        curve, rounds = published, 1
    else:
        front = pareto(item, metric)
        est = interpolate(front, target)
        curve, rounds = [(c.x, c.y.mean) for c in front], _rounds_at(front, target)
    if est is not None and item.prediction:
        error = item.expected_error
        se = (est.mean * math.log1p(error) / quantile(math.inf)
              if error is not None and error >= 0 and est.mean > 0 else math.nan)  # fmt: skip
        est = Estimate(est.mean, se, math.inf)
    return curve, est, rounds


def decide(
    inputs: Sequence[Input], target: float, *, by_k: bool = False, metric: str = "output"
) -> dict[str, Any]:
    """The decision at ``target`` tok/s/user over ``inputs`` (their figures computed: after
    ``compare.compare``), in ``metric`` tokens/s per GPU. ``by_k``: the inputs are the Ks of
    one sweep (the sentence names K). Every kind of input is read at the target where its
    curve spans it (``reading``), labelled by its ``kind``."""
    entries: list[dict[str, Any]] = []
    estimates: list[Estimate | None] = []
    for item in inputs:
        curve, est, rounds = reading(item, target, metric)
        low, high = log_bounds(est) if est is not None else (None, None)
        kind = _kind(item)
        entry: dict[str, Any] = {
            "label": item.label, "num_spec_tokens": _single_k(item), "gpus": item.gpus,
            "kind": kind, "tok_s_gpu": est.mean if est else None, "low": low, "high": high,
            "rounds": rounds if est and kind == "measured" else None,
            "expected_error": item.expected_error if kind == "predicted" else None,
            "interval_basis": (_basis(item) if kind == "measured" else kind) if est else None,
            "curve": [{"tok_s_user": x, "tok_s_gpu": y} for x, y in curve],
        }  # fmt: skip
        if est is None:
            entry["reason"] = _reason(item, curve, target, metric)
        entries.append(entry)
        estimates.append(est)
    reached = [i for i, e in enumerate(estimates) if e is not None]
    best = max(reached, key=lambda i: estimates[i].mean) if reached else None  # type: ignore[union-attr]
    second = (max((i for i in reached if i != best), key=lambda i: estimates[i].mean,  # type: ignore[union-attr]
                  default=None) if best is not None else None)  # fmt: skip
    for i, entry in enumerate(entries):
        r, low, high = (ratio(estimates[best], estimates[i]) if best is not None
                        and estimates[i] is not None else (math.nan,) * 3)  # fmt: skip
        entry.update(ratio_to_best=finite(r), ratio_low=finite(low), ratio_high=finite(high))
    gain = None
    if best is not None and best != 0 and estimates[0] is not None:
        gain = ratio(estimates[0], estimates[best])
    # the first reads highest: the runner-up against it, so a loss reads as a loss
    against_first = (
        ratio(estimates[0], estimates[second]) if best == 0 and second is not None else None
    )
    choices = [Choice(e["label"], e["tok_s_gpu"], e["low"], e["high"], e["kind"]) for e in entries]
    if by_k and all(e["num_spec_tokens"] is not None for e in entries) and \
            len({e["label"] for e in entries}) == len({e["num_spec_tokens"] for e in entries}):  # fmt: skip
        span = k_span([e["num_spec_tokens"] for e in entries])
    else:
        span = ", ".join(e["label"] for e in entries)
    too_fast = bool(entries) and all(
        e["curve"] and e["curve"][0]["tok_s_user"] > target for e in entries
    )
    why = _unresolved(entries, estimates, best, second)
    out = {
        "tok_s_user": target,
        "metric": metric,
        "figure": metric_words(metric),
        "best": entries[best]["label"] if best is not None else None,
        "best_tok_s_gpu": entries[best]["tok_s_gpu"] if best is not None else None,
        "resolved": why is None if second is not None else None,
        "unresolved": why,
        "gain_over_first": _gain(gain),
        "choices": entries,
        "headline": headline(choices, target, span, noun="K" if by_k else "input",
                             gain=_gain_tuple(gain if gain is not None else against_first),
                             too_fast=too_fast, unit=unit(metric),
                             unresolved=why if second is not None else None),
        "interval": _interval_note(entries),
    }  # fmt: skip
    lead = _lead(entries, estimates, best, second, why)
    if lead:
        out["lead"] = lead
    return out


def _interval_note(entries: Sequence[dict[str, Any]]) -> str:
    """What the figures' intervals are, kind by kind, for the choices that reach the target."""
    basis = {e["interval_basis"] for e in entries} - {None}
    if not basis:
        return "no interval: no input reaches the target"
    notes = []
    if basis == {"rounds"}:
        notes.append("95% intervals across rounds (Student t, on the log scale)")
    elif "requests" in basis:
        notes.append(ONE_RUN_EACH)
    elif "rounds" in basis:
        notes.append("measured: 95% intervals across rounds (Student t, on the log scale)")
    if "aggregate-only" in basis:
        notes.append(f"{_names(entries, 'aggregate-only')} aggregate-only: published figures, "
                     "no interval")  # fmt: skip
    if "predicted" in basis:
        notes.append(f"{_names(entries, 'predicted')} predicted: a band only from the "
                     "prediction's expected error, where known")  # fmt: skip
    return "; ".join(notes)


def _names(entries: Sequence[dict[str, Any]], kind: str) -> str:
    found = [e["label"] for e in entries if e["kind"] == kind and e["tok_s_gpu"] is not None]
    return " and ".join(found)


def _unresolved(
    entries: list[dict[str, Any]],
    estimates: list[Estimate | None],
    best: int | None,
    second: int | None,
) -> str | None:
    """Why the best's lead over the runner-up is not a result, or None where it is: a side
    with no interval (aggregate-only, a prediction without its expected error), fewer than
    ``MIN_ROUNDS`` rounds of a measured side, or a ratio whose 95% interval reaches 1."""
    if best is None or second is None:
        return None
    pair = [entries[i] for i in sorted((best, second))]  # in the inputs' order
    bare = [e for e in pair if e["low"] is None]
    if bare:
        kinds = {e["kind"] for e in bare}
        names = " and ".join(e["label"] for e in bare)
        what = ("aggregate-only" if kinds == {"aggregate-only"} else "predicted with no "
                "expected error" if kinds == {"predicted"} else "without an interval")  # fmt: skip
        return f"{names} {what}, no interval"
    few = [e for e in pair if e["kind"] == "measured" and (e["rounds"] or 0) < MIN_ROUNDS]
    if few:
        shown = ", ".join(
            f"{e['label']}: {e['rounds'] or 1}" for e in pair if e["kind"] == "measured"
        )
        return f"fewer than {MIN_ROUNDS} rounds a side ({shown})"  # fmt: skip
    _, low, _ = ratio(estimates[second], estimates[best])
    if not (math.isfinite(low) and low > 1):
        return "the lead is inside its 95% interval"
    return None


def _gain(gain: tuple[float, float, float] | None) -> dict[str, float | None] | None:
    if gain is None:
        return None
    return {"ratio": finite(gain[0]), "low": finite(gain[1]), "high": finite(gain[2])}


def _gain_tuple(gain: tuple[float, float, float] | None) -> Any:
    if gain is None or not math.isfinite(gain[0]):
        return None
    return gain[0], finite(gain[1]), finite(gain[2])


def _lead(
    entries: list[dict[str, Any]],
    estimates: list[Estimate | None],
    best: int | None,
    second: int | None,
    why: str | None,
) -> str | None:
    """The best's lead over the runner-up, and whether it is resolved (``_unresolved``)."""
    if best is None or second is None:
        return None
    r, low, high = ratio(estimates[second], estimates[best])
    a, b = entries[best]["label"], entries[second]["label"]
    text = f"{a}'s lead over {b}"
    if second != 0 and math.isfinite(r):  # the headline states the gain over the first only
        text += f", {r - 1:+.1%}"
        if math.isfinite(low):
            text += f" (95% CI {low - 1:+.1%} to {high - 1:+.1%})"
    if not math.isfinite(r):
        return text + f": no interval ({b} reads 0), not resolved"
    return text + (f": not resolved, {why}" if why else ": resolved")


def _reason(item: Input, curve: Sequence[tuple[float, float]], target: float, metric: str) -> str:
    if not curve:
        if item.aggregate_only:
            return f"aggregate-only: publishes no interactivity with {metric_words(metric)}"
        if metric == "total" and any(total_factor(p) is None for p in item.points):
            return ("no point with TPOT and total throughput (no prompt and completion tokens "
                    "recorded: --metric output)")  # fmt: skip
        return "no point with TPOT and throughput"
    if len(curve) == 1:
        return f"its one point is at {curve[0][0]:,.1f} tok/s/user, not {target:g}"
    return f"its curve spans {curve[0][0]:,.1f} to {curve[-1][0]:,.1f} tok/s/user, not {target:g}"


def decision_lines(decision: dict[str, Any]) -> list[str]:
    """The decision in the terminal: its sentence, the lead, then one line a choice."""
    lines = [decision["headline"]]
    if decision.get("lead"):
        lines.append(decision["lead"])
    shown = unit(decision.get("metric") or "output")
    for e in decision["choices"]:
        if e["tok_s_gpu"] is None:
            lines.append(f"  {e['label']}: {e['reason']}")
            continue
        kind = e.get("kind") or "measured"
        if kind == "measured":
            ci = _ci(e["low"], e["high"], ",.0f")
        elif e["low"] is not None and e["high"] is not None:
            ci = f" ({kind}, band {e['low']:,.0f} to {e['high']:,.0f})"
        else:
            ci = f" ({kind}, no interval)"
        ratio = ("" if e["ratio_to_best"] is None else
                 f", {e['ratio_to_best']:.3f}x of the best{_ci(e['ratio_low'], e['ratio_high'], '.3f', 'x')}")  # fmt: skip
        lines.append(f"  {e['label']}: {e['tok_s_gpu']:,.0f} {shown}{ci}{ratio}")
    lines.append(f"  ({decision['figure']}; {decision['interval']})")
    return lines


def _ci(
    low: float | None, high: float | None, fmt: str, suffix: str = "", what: str = "95% CI "
) -> str:
    if low is None or high is None:
        return ""
    return f" ({what}{low:{fmt}}{suffix} to {high:{fmt}}{suffix})"


def sweep_dir_path(paths: Sequence[Path]) -> Path | None:
    """The one sweep directory given alone, else None."""
    if len(paths) == 1 and (paths[0] / "sweep.json").is_file():
        return paths[0]
    return None
