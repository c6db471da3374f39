"""The figures of one sweep point, each with its 95% interval, from the point's run directories.

A point is one setting run ``rounds`` times. With two or more rounds, each figure's interval is
Student's t across the rounds' values (each round one draw of the whole run). With one round
there is nothing to spread over, so the interval is a seeded bootstrap over that run's requests
(``method`` says "bootstrap"). The realized AL is always pooled over every request of the point
with the ratio estimator's standard error (``stats.realized_al``), rounds or not: it is a ratio
of sums over requests, and requests are its sampling unit.

One round's throughput has no spread of its own (the request count over the run's duration), so
a resample's duration scales with its summed latency: in a closed loop throughput is
concurrency / mean latency, and a resample of slower requests would have taken longer.

An aggregate-only run (published figures, no records.jsonl) is a point of its published figures
(``aggregate_figures``): each with no interval (method "none"), since nothing per request exists
to resample.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from speclens.runs import rundir
from speclens.runs.stats import (
    BOOTSTRAP_RESAMPLES,
    Interval,
    bootstrap_interval,
    realized_al,
    t_interval,
)

#: The figures of a point, in the order sweep.csv lists them.
FIGURES = (
    "output_tokens_per_s",
    "requests_per_s",
    "ttft_ms",
    "tpot_ms",
    "itl_ms",
    "e2e_ms",
    "tokens_per_s_per_user",
    "realized_al",
)
#: The most records.jsonl lines read from one run directory (each a request).
MAX_ROWS = 200_000
#: Most request indices one bootstrap draws (resamples x requests): bounds its memory; a big
#: run gets fewer resamples (never under ``MIN_RESAMPLES``), a small one ``BOOTSTRAP_RESAMPLES``.
BOOTSTRAP_BUDGET = 20_000_000
MIN_RESAMPLES = 100


class PointError(ValueError):
    """A run directory that cannot be read as one: the message names the file and the field."""


@dataclass
class RunSample:
    """One run's measured, successful requests as columns, and its duration."""

    duration_s: float
    tokens: list[float] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    itl: list[tuple[float, float]] = field(default_factory=list)  # (sum gap * tokens, tokens)
    accepted: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)


def _summary_duration(run_dir: Path) -> float:
    path = run_dir / "summary.json"
    try:
        summary = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise PointError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except orjson.JSONDecodeError as exc:
        raise PointError(f"{path}: not JSON: {exc}") from None
    duration = (
        (summary.get("figures") or {}).get("duration_s") if isinstance(summary, dict) else None
    )
    if isinstance(duration, bool) or not isinstance(duration, int | float):
        raise PointError(f"{path}: figures.duration_s: expected a number, got {duration!r}")
    return float(duration)


def _number(row: dict[str, Any], key: str) -> float | None:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _add_row(sample: RunSample, row: dict[str, Any]) -> None:
    """Keep what the figures need from one measured, successful request."""
    start, latency = _number(row, "start_s"), _number(row, "latency_s")
    if latency is None or start is None:
        return
    sample.latency_s.append(latency)
    sample.tokens.append(_number(row, "completion_tokens") or 0.0)
    for key, column in (("ttft_s", sample.ttft_s), ("tpot_s", sample.tpot_s)):
        value = _number(row, key)
        if value is not None:
            column.append(value)
    runs = [(float(g), float(n)) for g, n in row.get("itl_runs_s") or []]
    if runs:
        sample.itl.append((sum(g * n for g, n in runs), sum(n for _, n in runs)))
    spec = row.get("spec_decode_acceptance")
    if isinstance(spec, dict) and isinstance(spec.get("num_spec_steps"), int):
        sample.accepted.append(int(spec.get("num_accepted_draft_tokens") or 0))
        sample.steps.append(int(spec["num_spec_steps"]))


def read_run(run_dir: Path) -> RunSample:
    """The run directory's duration and per-request columns; PointError names what is wrong."""
    sample = RunSample(_summary_duration(run_dir))
    path = run_dir / "records.jsonl"
    try:
        with path.open("rb") as fh:
            for n, line in enumerate(fh, 1):
                if n > MAX_ROWS:
                    raise PointError(f"{path}: more than {MAX_ROWS:,} records")
                try:
                    row = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise PointError(f"{path}: line {n}: not JSON: {exc}") from None
                if not isinstance(row, dict):
                    raise PointError(f"{path}: line {n}: expected a record object")
                if row.get("warmup") or not row.get("success"):
                    continue
                try:
                    _add_row(sample, row)
                except (TypeError, ValueError):
                    raise PointError(f"{path}: line {n}: itl_runs_s: expected [gap, tokens] pairs") from None  # fmt: skip
    except OSError as exc:
        raise PointError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    return sample


# ------------------------------------------------------------------ the figures of one run
def _ratio(num: int, den: int, scale: float = 1.0) -> Callable[[np.ndarray], np.ndarray]:
    """A statistic sum(column num) / sum(column den) over the request axis."""

    def statistic(m: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(scale * m[..., num].sum(-1) / m[..., den].sum(-1), dtype=float)

    return statistic


def _throughput(sample: RunSample, per_request: bool) -> Callable[[np.ndarray], np.ndarray]:
    """Tokens (or requests) over the duration a resample would have taken: the run's duration
    scaled by the resample's summed latency over the run's (columns: tokens, latency)."""
    total_latency = sum(sample.latency_s)

    def statistic(m: np.ndarray) -> np.ndarray:
        work = np.full(m.shape[:-1], 1.0).sum(-1) if per_request else m[..., 0].sum(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(
                work / (sample.duration_s * m[..., 1].sum(-1) / total_latency), dtype=float
            )

    return statistic


def _mean(scale: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda m: scale * m.mean(-1)


def _per_user(m: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.asarray(1.0 / m.mean(-1), dtype=float)


Statistic = Callable[[np.ndarray], np.ndarray]


def _columns(sample: RunSample) -> dict[str, tuple[np.ndarray, Statistic]]:
    """Each figure as (its per-request samples, the statistic that reduces them)."""
    both = np.column_stack([sample.tokens, sample.latency_s]) if sample.tokens else np.empty((0, 2))
    tpot = np.asarray(sample.tpot_s)
    return {
        "output_tokens_per_s": (both, _throughput(sample, False)),
        "requests_per_s": (both, _throughput(sample, True)),
        "ttft_ms": (np.asarray(sample.ttft_s), _mean(1000.0)),
        "tpot_ms": (tpot, _mean(1000.0)),
        "itl_ms": (np.asarray(sample.itl).reshape(-1, 2), _ratio(0, 1, 1000.0)),
        "e2e_ms": (np.asarray(sample.latency_s), _mean(1000.0)),
        "tokens_per_s_per_user": (tpot, _per_user),
    }


def run_figures(
    sample: RunSample, seed: int = 0, names: Sequence[str] = FIGURES
) -> dict[str, Interval]:
    """One run's figures (``names`` of them) with a bootstrap over its requests (the realized
    AL: its own SE)."""
    resamples = max(
        MIN_RESAMPLES, min(BOOTSTRAP_RESAMPLES, BOOTSTRAP_BUDGET // max(len(sample.latency_s), 1))
    )
    out = {
        name: bootstrap_interval(values, statistic, resamples=resamples, seed=seed)
        for name, (values, statistic) in _columns(sample).items()
        if name in names
    }
    if "realized_al" in names:
        out["realized_al"] = _al([sample])
    return {name: _finite_or_none(out[name]) for name in FIGURES if name in names}


def run_estimates(sample: RunSample) -> dict[str, float]:
    """One run's figures, point estimates only (a round of several: t spreads over these)."""
    out = {}
    for name, (values, statistic) in _columns(sample).items():
        out[name] = float(statistic(values[None])[0]) if len(values) else math.nan
    out["realized_al"] = _al([sample]).mean
    return out


def _al(samples: Sequence[RunSample]) -> Interval:
    return _pooled_al([a for s in samples for a in s.accepted], [n for s in samples for n in s.steps])  # fmt: skip


def _pooled_al(accepted: list[int], steps: list[int]) -> Interval:
    if not sum(steps):
        return Interval(math.nan, math.nan, math.nan, 0, "none")
    return realized_al(accepted, steps).interval()


def _finite_or_none(interval: Interval) -> Interval:
    """A figure with no data (no requests, no TPOT) is method "none", never a NaN "bootstrap"."""
    if not math.isfinite(interval.mean):
        return Interval(math.nan, math.nan, math.nan, interval.n, "none", interval.confidence)
    return interval


@dataclass(frozen=True)
class RoundSummary:
    """What a point's figures need from one round, kept so that a sweep combines its rounds
    without reading them again: the round's point estimates, its per-request AL counts, and
    (``bootstrap``) its own figures with a bootstrap over its requests."""

    estimates: dict[str, float]
    accepted: list[int]
    steps: list[int]
    figures: dict[str, Interval] | None = None


def _published(summary: dict[str, Any], *parts: str) -> float:
    node: Any = summary.get("figures")
    for part in parts:
        node = node.get(part) if isinstance(node, dict) else None
    return float(node) if rundir.is_number(node) else math.nan


def aggregate_figures(summary: dict[str, Any]) -> dict[str, float]:
    """A point's figures from an aggregate-only summary's published ones (``aggregate_problems``
    checked): the latency means (the median where only it was published: most of InferenceX's
    earlier points), the deployment's output tokens/s, and tokens/s per user as the published
    mean interactivity (else 1000 / TPOT); NaN where nothing was published."""

    def latency(name: str) -> float:
        mean = _published(summary, "latency_ms", name, "mean")
        return mean if math.isfinite(mean) else _published(summary, "latency_ms", name, "p50")

    tpot = latency("tpot")
    per_user = _published(summary, "interactivity", "mean")
    if not math.isfinite(per_user) and math.isfinite(tpot) and tpot > 0:
        per_user = 1000.0 / tpot
    return {
        "output_tokens_per_s": _published(summary, "throughput", "output_tokens_per_s"),
        "requests_per_s": _published(summary, "throughput", "requests_per_s"),
        "ttft_ms": latency("ttft"),
        "tpot_ms": tpot,
        "itl_ms": latency("itl"),
        "e2e_ms": latency("e2e"),
        "tokens_per_s_per_user": per_user,
        "realized_al": _published(summary, "acceptance", "acceptance_length"),
    }


def _aggregate_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's summary when it is aggregate-only (checked), else None; PointError names
    what is wrong."""
    path = run_dir / "summary.json"
    try:
        summary = rundir.read_json(path)
    except rundir.InputError:
        return None  # the run's own reader says what is wrong, as for any run
    if not rundir.is_aggregate_only(summary):
        return None
    problems = rundir.aggregate_problems(summary, str(path))
    if problems:
        raise PointError(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))  # fmt: skip
    return dict(summary)


def summarize(run_dir: Path, seed: int = 0, bootstrap: bool = True) -> RoundSummary:
    """One round's summary, its figures bootstrapped when ``bootstrap`` (a point of one round
    shows those; two or more use only the estimates); an aggregate-only run's published figures,
    with no interval. Raises PointError."""
    summary = _aggregate_summary(Path(run_dir))
    if summary is not None:
        estimates = aggregate_figures(summary)
        published = {name: Interval(value, math.nan, math.nan, 0, "none")
                     for name, value in estimates.items()}  # fmt: skip
        return RoundSummary(estimates, [], [], published)
    sample = read_run(Path(run_dir))
    figures = run_figures(sample, seed) if bootstrap else None
    return RoundSummary(run_estimates(sample), sample.accepted, sample.steps, figures)


def no_figures() -> dict[str, Interval]:
    return {name: Interval(math.nan, math.nan, math.nan, 0, "none") for name in FIGURES}


def combine(rounds: Sequence[RoundSummary]) -> dict[str, Interval]:
    """The figures of a point whose rounds are ``rounds``: one round's own (bootstrap), Student
    t across two or more, the realized AL pooled over every request with its ratio SE."""
    if not rounds:
        return no_figures()
    if len(rounds) == 1:
        if rounds[0].figures is None:
            raise ValueError("a point of one round needs that round's bootstrapped figures")
        return dict(rounds[0].figures)
    out = {name: _finite_or_none(t_interval([r.estimates[name] for r in rounds])) for name in FIGURES}  # fmt: skip
    out["realized_al"] = _pooled_al([a for r in rounds for a in r.accepted], [n for r in rounds for n in r.steps])  # fmt: skip
    return out


def point_figures(run_dirs: Sequence[Path], seed: int = 0) -> dict[str, Interval]:
    """Every figure of the point whose rounds are ``run_dirs``: Student t across rounds (two or
    more), a bootstrap over requests (one), the realized AL pooled with its ratio SE (always).
    Raises PointError for a directory that is not a run."""
    one = len(run_dirs) == 1
    return combine([summarize(Path(d), seed, bootstrap=one) for d in run_dirs])
