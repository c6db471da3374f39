"""The deltas of ``speclens compare``: B against A at matched load and matched interactivity.

Each delta with a 95% interval: the ratio B / A at matched concurrency (or request rate), and at
matched interactivity (tokens/s per user) read off each input's Pareto curve of throughput per
GPU, interpolated only where both curves reach; nothing here trusts a figure it did not
recompute.

Aggregate-only inputs (published figures): the deltas are the published medians and throughput
per GPU, with no interval, and a speculation A/B reads as InferenceX's "at X tok/s/user, MTP
delivers +Y% tok/s/GPU" with the TPOT speedup per concurrency.

Throughput is one figure a compare, named (``METRICS``): total (input + output) tokens/s, what
InferenceX's dashboard calls throughput per GPU (its ``tput_per_gpu``), or output tokens/s. A
measured point's total is its output tokens/s times its measured requests' (prompt +
completion) / completion tokens (``total_factor``). Every throughput's and ratio's interval is
on the log scale (``log_bounds``, ``ratio``), so none goes below 0.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scipy import stats as _stats

from speclens.runs.compare_inputs import (
    POINT_KEYS,
    PUBLISHED,
    Input,
    Point,
    loads,
    point_published,
)
from speclens.runs.stats import CONFIDENCE, Interval

#: Figures compared at matched load (the throughput: the ``--metric``'s, ``throughput_name``).
DELTA_FIGURES = ("output_tokens_per_s", "tokens_per_s_per_user", "ttft_ms")

#: The per-GPU delta figure (output tokens/s), for inputs on different GPU counts.
PER_GPU = "output_tokens_per_s_per_gpu"

#: The throughputs a compare can state (``--metric``): total = input + output tokens/s, what
#: InferenceX's dashboard calls throughput per GPU; output = generated tokens/s.
METRICS = ("total", "output")
DEFAULT_METRIC = "total"


def throughput_name(metric: str, per_gpu: bool = False) -> str:
    """The figure's name: "total_tokens_per_s" (``_per_gpu``), "output_tokens_per_s"."""
    if metric not in METRICS:
        raise ValueError(f"metric: expected one of {', '.join(METRICS)}, got {metric!r}")
    return f"{metric}_tokens_per_s" + ("_per_gpu" if per_gpu else "")


def unit(metric: str) -> str:
    """How a line names the figure: "total tok/s/GPU", "output tok/s/GPU"."""
    throughput_name(metric)
    return f"{metric} tok/s/GPU"


def metric_words(metric: str) -> str:
    """The figure in words, as the tables and plots name it."""
    throughput_name(metric)
    return ("total (input + output) tokens/s per GPU" if metric == "total"
            else "output tokens/s per GPU")  # fmt: skip


#: What a delta of published figures says of its interval.
NO_INTERVAL = "no interval: aggregate-only"

#: What compare says of intervals from one run a side: they are no evidence of a difference.
ONE_RUN_EACH = ("one run each: the interval covers request-to-request variation only, not "
                "run-to-run (on a loaded machine two identical runs differ by 5% to 24%); no "
                "difference is significant on it alone: repeat each point (sweep --rounds 3)")  # fmt: skip


@dataclass(frozen=True)
class Estimate:
    """A figure as mean, standard error and degrees of freedom, recovered from its Interval:
    rounds give Student t with n - 1 df, a bootstrap or the ratio estimator the normal."""

    mean: float
    se: float
    df: float

    @classmethod
    def of(cls, interval: Interval) -> Estimate | None:
        if interval.method == "none" or not math.isfinite(interval.half_width):
            return None
        df = float(interval.n - 1) if interval.method == "t" and interval.n > 1 else math.inf
        q = quantile(df, interval.confidence)
        return cls(interval.mean, interval.half_width / q, df)


def quantile(df: float, confidence: float = CONFIDENCE) -> float:
    tail = (1 + confidence) / 2
    return float(_stats.norm.ppf(tail) if math.isinf(df) else _stats.t.ppf(tail, df))


def _welch_df(parts: Sequence[tuple[float, float]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of variances (variance, df) pairs."""
    total = sum(v for v, _ in parts)
    denominator = sum(v * v / d for v, d in parts if math.isfinite(d) and d > 0)
    return total * total / denominator if denominator > 0 else math.inf


def ratio(a: Estimate | None, b: Estimate | None) -> tuple[float, float, float]:
    """b / a with its 95% interval, on the log scale (delta method, Welch df)."""
    if a is None or b is None or a.mean <= 0 or b.mean <= 0:
        point = b.mean / a.mean if a and b and a.mean > 0 else math.nan
        return point, math.nan, math.nan
    va, vb = (a.se / a.mean) ** 2, (b.se / b.mean) ** 2
    q = quantile(_welch_df([(va, a.df), (vb, b.df)]))
    point, spread = b.mean / a.mean, q * math.sqrt(va + vb)
    return point, point * math.exp(-spread), point * math.exp(spread)


def log_bounds(est: Estimate) -> tuple[float | None, float | None]:
    """The 95% interval of a positive figure on the log scale (delta method: log y has SE
    se / mean), so it never goes below 0; (None, None) without an SE or a positive mean."""
    if not (math.isfinite(est.se) and est.mean > 0):
        return None, None
    spread = quantile(est.df) * est.se / est.mean
    return est.mean * math.exp(-spread), est.mean * math.exp(spread)


def log_interval(interval: Interval) -> Interval:
    """The Interval with its bounds on the log scale (``log_bounds``), its mean kept; as it is
    where it has no interval or its mean is not positive."""
    est = Estimate.of(interval)
    if est is None or est.mean <= 0:
        return interval
    low, high = log_bounds(est)
    if low is None or high is None:
        return interval
    return dataclasses.replace(interval, low=low, high=high)


def total_factor(point: Point) -> float | None:
    """(prompt + completion) / completion tokens of the point's measured, completed requests,
    the mean over its rounds: output tokens/s times it is total tokens/s. None where a round
    records no completion tokens (a point without runs, an aggregate-only run)."""
    factors = []
    for run in point.runs:
        prompt = completion = 0
        for row in run.completed:
            p, c = row.get("prompt_tokens"), row.get("completion_tokens")
            if isinstance(c, int) and not isinstance(c, bool) and c > 0:
                completion += c
                prompt += p if isinstance(p, int) and not isinstance(p, bool) and p > 0 else 0
        if not completion:
            return None
        factors.append((prompt + completion) / completion)
    return sum(factors) / len(factors) if factors else None


def throughput(point: Point, metric: str) -> Interval:
    """The point's ``metric`` tokens/s with its interval: output tokens/s as measured, or
    scaled by ``total_factor``; an interval of method "none" where it cannot be told."""
    output = point.figures["output_tokens_per_s"]
    if throughput_name(metric) == "output_tokens_per_s":
        return output
    factor = total_factor(point)
    if factor is None:
        return Interval(math.nan, math.nan, math.nan, 0, "none")
    return dataclasses.replace(output, mean=output.mean * factor, low=output.low * factor,
                               high=output.high * factor)  # fmt: skip


def finite(value: float) -> float | None:
    """The value where it is finite; None (JSON null) where it is not."""
    return value if math.isfinite(value) else None


def matched_concurrency(a: Input, b: Input, metric: str = "output") -> list[dict[str, Any]]:
    """Ratio B / A of each delta figure at every load setting both inputs ran (the throughput
    the ``metric``'s); where the two run on different GPU counts, that throughput per GPU too.
    Each side's interval on the log scale (``log_interval``)."""
    out = []
    tput, per_gpu = throughput_name(metric), throughput_name(metric, per_gpu=True)
    names = [tput, *DELTA_FIGURES[1:], *([per_gpu] if a.gpus != b.gpus else [])]
    for key, pa, pb in _matched_points(a, b):
        for name in names:
            if name == per_gpu:
                ia, ib = (_per_gpu(throughput(p, metric), x.gpus)
                          for p, x in ((pa, a), (pb, b)))  # fmt: skip
            elif name == tput:
                ia, ib = throughput(pa, metric), throughput(pb, metric)
            else:
                ia, ib = pa.figures[name], pb.figures[name]
            r, low, high = ratio(Estimate.of(ia), Estimate.of(ib))
            ia, ib = log_interval(ia), log_interval(ib)  # shown on the log scale
            row: dict[str, Any] = {"concurrency": None, "request_rate": None}
            row[key[0]] = int(key[1]) if key[0] == "concurrency" else key[1]
            row.update(figure=name, a=ia.to_json(), b=ib.to_json(), ratio=finite(r),
                       ratio_low=finite(low), ratio_high=finite(high),
                       interval_basis=_basis(ia, ib))  # fmt: skip
            out.append(row)
    return out


def _per_gpu(interval: Interval, gpus: int) -> Interval:
    """An output tokens/s interval over ``gpus`` GPUs."""
    return dataclasses.replace(interval, mean=interval.mean / gpus, low=interval.low / gpus,
                               high=interval.high / gpus)  # fmt: skip


def _matched_points(a: Input, b: Input) -> list[tuple[tuple[str, float], Point, Point]]:
    """Points of equal load; on the full settings (K, AL) where an input has several per load."""

    def by(item: Input, full: bool) -> dict[Any, Point]:
        return {(p.load, *(p.settings.get(k) for k in POINT_KEYS[2:])) if full else p.load: p
                for p in item.points if p.load is not None}  # fmt: skip

    full = any(len({p.load for p in x.points}) < len(x.points) for x in (a, b))
    ma, mb = by(a, full), by(b, full)
    keys = [k for k in ma if k in mb]
    return [(ma[k].load, ma[k], mb[k]) for k in keys]  # type: ignore[misc]


@dataclass(frozen=True)
class CurvePoint:
    x: float  # tokens/s per user
    y: Estimate  # output (or total) tokens/s per GPU
    rounds: int = 0  # the rounds behind the point (0: not known)


def pareto(item: Input, metric: str = "output") -> list[CurvePoint]:
    """The input's Pareto front of ``metric`` throughput per GPU against tokens/s per user:
    the points no other point beats on both, by rising interactivity."""
    points = []
    for p in item.points:
        tput = throughput(p, metric)
        x, y = p.figures["tokens_per_s_per_user"], Estimate.of(tput)
        if y is not None and math.isfinite(x.mean) and x.mean > 0:
            rounds = tput.n if tput.method == "t" else 1
            points.append(
                CurvePoint(x.mean, Estimate(y.mean / item.gpus, y.se / item.gpus, y.df), rounds)
            )
    return pareto_front(points)


def pareto_front(points: Sequence[CurvePoint]) -> list[CurvePoint]:
    """The points no other point beats on both interactivity and throughput (the mean), by
    rising interactivity."""
    front: list[CurvePoint] = []
    for c in sorted(points, key=lambda c: (-c.x, -c.y.mean)):
        # by falling x: keep a point only when it beats every point to its right
        if not front or c.y.mean > front[-1].y.mean:
            front.append(c)
    return front[::-1]


def interpolate(curve: Sequence[CurvePoint], x: float) -> Estimate | None:
    """The curve's throughput at interactivity ``x`` (linear between neighbours; the points'
    rounds independent); None outside the curve."""
    for left, right in itertools.pairwise(curve):
        if left.x <= x <= right.x:
            w = (x - left.x) / (right.x - left.x) if right.x > left.x else 0.0
            parts = [((1 - w) ** 2 * left.y.se**2, left.y.df), (w**2 * right.y.se**2, right.y.df)]
            mean = (1 - w) * left.y.mean + w * right.y.mean
            return Estimate(mean, math.sqrt(sum(v for v, _ in parts)), _welch_df(parts))
    if curve and math.isclose(curve[0].x, x) and len(curve) == 1:
        return curve[0].y
    return None


def input_curve(item: Input, metric: str) -> list[dict[str, Any]]:
    """Every point of the input as compare's plot draws it, by rising interactivity: tok/s/user,
    ``metric`` tok/s/GPU and its 95% interval on the log scale (none for a published or a
    predicted point: the spread of a simulator's requests is not the prediction's error)."""
    if item.aggregate_only:
        return [{"tok_s_user": x, "tok_s_gpu": y, "low": None, "high": None}
                for x, y in throughput_curve(item, metric)]  # fmt: skip
    out = []
    for p in item.points:
        x, est = p.figures["tokens_per_s_per_user"].mean, Estimate.of(throughput(p, metric))
        if est is None or not (math.isfinite(x) and x > 0):
            continue
        est = Estimate(est.mean / item.gpus, est.se / item.gpus, est.df)
        low, high = (None, None) if item.prediction else log_bounds(est)
        out.append({"tok_s_user": x, "tok_s_gpu": est.mean, "low": low, "high": high})
    return sorted(out, key=lambda c: c["tok_s_user"])


def matched_interactivity(
    a: Input, b: Input, prefix: str, metric: str = "output"
) -> tuple[list[dict[str, Any]], str]:
    """B's ``metric`` throughput per GPU against A's at each interactivity both Pareto curves
    reach (every curve point inside the overlap), InferenceX's way; and a note on what was
    left out."""
    ca, cb = pareto(a, metric), pareto(b, metric)
    if not ca or not cb:
        return [], "no interactivity curve: an input has no point with TPOT and throughput"
    low, high = max(ca[0].x, cb[0].x), min(ca[-1].x, cb[-1].x)
    span = (f"{a.label} spans {ca[0].x:.1f} to {ca[-1].x:.1f} tok/s/user, {b.label} "
            f"{cb[0].x:.1f} to {cb[-1].x:.1f}")  # fmt: skip
    if low > high:
        return [], f"{span}: no overlap, so no delta at matched interactivity"
    xs = sorted({c.x for c in (*ca, *cb) if low <= c.x <= high})
    digits = 0 if len({round(x) for x in xs}) == len(xs) else 1  # no two rows read the same
    out = []
    for x in xs:
        ya, yb = interpolate(ca, x), interpolate(cb, x)
        if ya is None or yb is None:
            continue
        r, rl, rh = ratio(ya, yb)
        delta, dl, dh = ((v - 1) * 100 for v in (r, rl, rh))
        ci = f"CI {dl:+.0f}% to {dh:+.0f}%" if math.isfinite(dl) else "no interval"
        out.append({
            "tokens_per_s_per_user": x, "a_tok_s_gpu": ya.mean, "b_tok_s_gpu": yb.mean,
            "delta_pct": finite(delta), "low_pct": finite(dl), "high_pct": finite(dh),
            "sentence": f"{prefix}at {x:.{digits}f} tok/s/user, {b.label} delivers {delta:+.0f}% "
                        f"{unit(metric)} ({ci})",
        })  # fmt: skip
    return out, f"{span}: compared inside {low:.1f} to {high:.1f} only ({metric_words(metric)})"


def _basis(a: Interval, b: Interval) -> str | None:
    """What a ratio's interval covers: "rounds" where both sides repeated the point (Student t
    across rounds: run-to-run variation), "requests" where a side is one run (a bootstrap over
    its requests: request-to-request variation only); None without an interval."""
    if a.method == "none" or b.method == "none":
        return None
    return "rounds" if all(i.method == "t" and i.n > 1 for i in (a, b)) else "requests"


# --- aggregate-only inputs: published figures, no interval -----------------------------------


def log_interpolate(curve: Sequence[tuple[float, float]], x: float) -> float | None:
    """y at ``x`` on a curve of (x, y) points sorted by x: linear in log y between the two
    neighbouring points (throughput is compared as a ratio); None outside the curve (no
    extrapolation)."""
    for (x0, y0), (x1, y1) in itertools.pairwise(curve):
        if x0 <= x <= x1:
            w = (x - x0) / (x1 - x0) if x1 > x0 else 0.0
            return math.exp((1 - w) * math.log(y0) + w * math.log(y1))
    if len(curve) == 1 and math.isclose(curve[0][0], x):
        return curve[0][1]
    return None


def throughput_curve(item: Input, metric: str = DEFAULT_METRIC) -> list[tuple[float, float]]:
    """(median interactivity, ``metric`` tokens/s per GPU) of each point that publishes both,
    sorted by interactivity (one point per interactivity)."""
    out: dict[float, float] = {}
    name = throughput_name(metric, per_gpu=True)
    for point in item.points:
        fig = point_published(point, item.gpus)
        x, y = fig["tokens_per_s_per_user"], fig[name]
        if x is not None and y is not None and x > 0 and y > 0:
            out.setdefault(x, y)
    return sorted(out.items())


def _x_text(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}"


def _pct_change(ratio_: float) -> str:
    return f"{(ratio_ - 1) * 100:+.0f}%"


#: Why a speculation A/B's headline reads where it does, when no target was given.
AT_THE_TOP = ("the highest interactivity both curves reach; --at-interactivity X reads it at "
              "yours")  # fmt: skip


def speculation_ab(
    off: Input,
    on: Input,
    spec: tuple[str, int | None],
    metric: str = DEFAULT_METRIC,
    target: float | None = None,
) -> dict[str, Any]:
    """InferenceX's reading of a speculation A/B: at X tok/s/user, METHOD delivers +Y% tok/s/GPU
    (``metric`` tokens/s per GPU, on over off). Single runs: at the one concurrency both ran, X
    the speculating run's interactivity. Sweeps: each side's throughput interpolated against
    interactivity (``log_interpolate``), a row at each of the speculating side's points inside
    both curves; the headline at ``target`` (none where a curve does not reach it), else at the
    highest interactivity both reach, its ``chosen`` saying so. And the TPOT speedup (off over
    on, median TPOT) at each concurrency both ran."""
    method = spec[0].upper()
    out: dict[str, Any] = {"off": off.label, "on": on.label, "method": method,
                           "num_spec_tokens": spec[1], "metric": metric, "table": [],
                           "headline": None}  # fmt: skip

    def row(x: float, y_off: float, y_on: float, why: str | None = None) -> dict[str, Any]:
        r = y_on / y_off
        where = f" ({why})" if why else ""
        return {"tokens_per_s_per_user": x, "off_tok_s_gpu": y_off, "on_tok_s_gpu": y_on,
                "delta_pct": (r - 1) * 100, "chosen": why,
                "sentence": f"at {_x_text(x)} tok/s/user{where}, {method} delivers "
                            f"{_pct_change(r)} {unit(metric)}"}  # fmt: skip

    c_off, c_on = throughput_curve(off, metric), throughput_curve(on, metric)
    if off.kind == on.kind == "run":
        out["basis"] = "same concurrency: X is the speculating run's interactivity"
        if c_off and c_on:
            same = "the speculating run's, at the concurrency both ran"
            out["headline"] = row(c_on[0][0], c_off[0][1], c_on[0][1], same)
            out["table"] = [row(c_on[0][0], c_off[0][1], c_on[0][1])]
        else:
            out["note"] = "no interactivity or throughput per GPU published on one side"
    else:
        out["basis"] = (
            "matched interactivity: throughput per GPU interpolated in log between points"
        )
        if not c_off or not c_on:
            out["note"] = "no interactivity or throughput per GPU published on one side"
        else:
            low, high = max(c_off[0][0], c_on[0][0]), min(c_off[-1][0], c_on[-1][0])
            span = (f"{off.label} spans {c_off[0][0]:.1f} to {c_off[-1][0]:.1f} tok/s/user, "
                    f"{on.label} {c_on[0][0]:.1f} to {c_on[-1][0]:.1f}")  # fmt: skip
            if low > high:
                out["note"] = f"{span}: no overlap, so no reading at matched interactivity"
            else:
                out["note"] = f"{span}: read inside {low:.1f} to {high:.1f} only"
                for x, y in c_on:
                    at = log_interpolate(c_off, x)
                    if low <= x <= high and at is not None:
                        out["table"].append(row(x, at, y))
                why = AT_THE_TOP if target is None else None
                x = high if target is None else target
                top_off, top_on = log_interpolate(c_off, x), log_interpolate(c_on, x)
                if top_off is not None and top_on is not None:
                    out["headline"] = row(x, top_off, top_on, why)
                else:
                    out["note"] = f"{span}: {target:g} tok/s/user is outside one of them"
    speedup = []
    points_off, points_on = loads(off), loads(on)
    for load in sorted(points_off.keys() & points_on.keys()):
        t_off = point_published(points_off[load], off.gpus)["tpot_p50_ms"]
        t_on = point_published(points_on[load], on.gpus)["tpot_p50_ms"]
        if not t_off or not t_on:
            continue
        r = t_off / t_on
        where = f"concurrency {load[1]:g}" if load[0] == "concurrency" else f"{load[1]:g} req/s"
        speedup.append({"concurrency": int(load[1]) if load[0] == "concurrency" else None,
                        "request_rate": load[1] if load[0] == "request_rate" else None,
                        "off_tpot_ms": t_off, "on_tpot_ms": t_on, "speedup": r,
                        "sentence": f"{method} speedup {r:.2f}x at {where}"})  # fmt: skip
    out["speedup"] = speedup
    return out


def published_deltas(a: Input, b: Input, metric: str = DEFAULT_METRIC) -> list[dict[str, Any]]:
    """B / A of each published figure (the throughput per GPU the ``metric``'s) at every load
    both ran, with no interval."""
    out = []
    pa, pb = loads(a), loads(b)
    other = throughput_name("output" if metric == "total" else "total", per_gpu=True)
    for load in sorted(pa.keys() & pb.keys()):
        fa, fb = point_published(pa[load], a.gpus), point_published(pb[load], b.gpus)
        for name, _ in PUBLISHED:
            if name == other:
                continue
            va, vb = fa[name], fb[name]
            row: dict[str, Any] = {"concurrency": None, "request_rate": None}
            row[load[0]] = int(load[1]) if load[0] == "concurrency" else load[1]
            row.update(figure=name, a=Interval(math.nan if va is None else va, math.nan,
                                                 math.nan, 0, "none").to_json(),
                       b=Interval(math.nan if vb is None else vb, math.nan, math.nan, 0,
                                  "none").to_json(),
                       ratio=vb / va if va and vb is not None else None, ratio_low=None,
                       ratio_high=None, interval=NO_INTERVAL)  # fmt: skip
            out.append(row)
    return out


def published_interactivity(
    a: Input, b: Input, prefix: str, metric: str = DEFAULT_METRIC
) -> tuple[list[dict[str, Any]], str]:
    """B's ``metric`` tokens/s per GPU against A's at every curve point inside both curves
    (``log_interpolate``), with no interval."""
    ca, cb = throughput_curve(a, metric), throughput_curve(b, metric)
    if not ca or not cb:
        return [], "no interactivity curve: an input publishes no interactivity or throughput"
    low, high = max(ca[0][0], cb[0][0]), min(ca[-1][0], cb[-1][0])
    span = (f"{a.label} spans {ca[0][0]:.1f} to {ca[-1][0]:.1f} tok/s/user, {b.label} "
            f"{cb[0][0]:.1f} to {cb[-1][0]:.1f}")  # fmt: skip
    if low > high:
        return [], f"{span}: no overlap, so no delta at matched interactivity"
    out = []
    for x in sorted({x for x, _ in (*ca, *cb) if low <= x <= high}):
        ya, yb = log_interpolate(ca, x), log_interpolate(cb, x)
        if ya is None or yb is None:
            continue
        out.append({"tokens_per_s_per_user": x, "a_tok_s_gpu": ya, "b_tok_s_gpu": yb,
                    "delta_pct": (yb / ya - 1) * 100, "low_pct": None, "high_pct": None,
                    "sentence": f"{prefix}at {_x_text(x)} tok/s/user, {b.label} delivers "
                                f"{_pct_change(yb / ya)} {unit(metric)} ({NO_INTERVAL})"})  # fmt: skip
    return out, f"{span}: compared inside {low:.1f} to {high:.1f} only ({metric_words(metric)})"
