"""A roofline calibrated on published points: runs that kept only their aggregate figures.

Each point (an aggregate-only run directory: ``speclens import`` writes them) is simulated under
its own load (``closed_loop``: a closed loop at its concurrency and lengths, from an idle
engine). The roofline's free parameters (compute and memory efficiency, the overhead a step and a
decode token, and the client's front latency) are fitted to the points' median TPOT, median TTFT
and total throughput per GPU, least squares on the log ratio predicted / measured (each point's
schedule run once, priced at every trial). A weak pull to the starting values keeps a parameter
the points cannot see where it was; the report names such parameters ("not pinned down": moving
it 2x moves no prediction by 2%).

The AL of a speculating run that published none is then the AL at which the calibrated model
reproduces its median TPOT (``infer_acceptance``); the range is the AL at the measured TPOT
moved by the fit's largest TPOT residual either way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from speclens.acceptance.quantity import is_finite_number
from speclens.runs import rundir
from speclens.sim import disagg
from speclens.sim.closed_loop import Figures, Load, Schedule, schedule
from speclens.sim.disagg import Pools
from speclens.sim.fanout import Fanout
from speclens.sim.roofline import Roofline

#: What prices a point: one roofline (a single-node point), or a disaggregated point's pools.
Priced = Roofline | Pools

#: Fewest points a fit takes.
MIN_POINTS = 3
#: The parameters fitted, with their bounds (the efficiencies are shares of a peak; seconds).
PARAMETERS: dict[str, tuple[float, float]] = {
    "compute": (1e-3, 1.0),
    "memory": (1e-3, 1.0),
    "overhead": (1e-6, 1.0),
    "per_token": (1e-8, 1e-2),
    "front_latency_s": (1e-5, 10.0),
}
#: A fit with disaggregated points also fits its prefill pools' compute efficiency.
PREFILL = {"prefill_compute": (1e-3, 1.0)}
#: The pull to the starting values, per unit of log parameter (a residual of 2% per e-fold).
PRIOR = 0.02
#: The weight of a disaggregated point's TTFT in the fit: its steady state's weakest figure (one
#: TTFT for every request, no ramp), which at full weight pulls the decode prices without
#: coming closer itself (GB200's own fit: TTFT 90% off either way, TPOT 20% at 1, 17% at 0.3).
DISAGG_TTFT_WEIGHT = 0.3
#: A parameter whose 2x move changes no prediction by more than this is not pinned down.
PINNED = 0.02
#: A fit whose median error on its own points exceeds this on any figure does not describe them.
MISFIT = 0.25
#: Engines whose scheduler mixes prompt chunks into decode steps (the rest prefill apart).
MIXED_ENGINES = ("trt", "trtllm", "tensorrt-llm", "vllm")


class PointsError(Exception):
    """Points that cannot be fitted or read: one line each."""

    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = list(lines)


@dataclass(frozen=True)
class Point:
    """One published point: its deployment, its load and its measured medians."""

    path: Path
    settings: dict[str, Any]
    tpot_s: float
    ttft_s: float
    throughput_per_gpu: float

    @property
    def concurrency(self) -> int:
        return int(self.settings["concurrency"])

    @property
    def speculating(self) -> bool:
        return self.settings.get("method") not in (None, "none")

    def load(self, k: int = 0, acceptance_length: float = 1.0) -> Load:
        s = self.settings
        engine = str(s.get("engine") or "")
        return Load(
            concurrency=self.concurrency,
            input_tokens=int(s["input_tokens"]["max"]),
            output_tokens=int(s["output_tokens"]["max"]),
            num_spec_tokens=k,
            acceptance_length=acceptance_length,
            scheduler="mixed" if engine in MIXED_ENGINES else "separate",
        )

    @property
    def gpus(self) -> int:
        return int(self.settings.get("gpus") or self.settings.get("tensor_parallel") or 1)

    @property
    def disaggregated(self) -> bool:
        return bool(self.settings.get("disaggregated"))


def _positive(value: Any) -> bool:
    return is_finite_number(value) and value > 0


def _runs(paths: Sequence[Path]) -> list[Path]:
    """Run directories: each path itself, or a sweep directory's points."""
    out = []
    for path in paths:
        if (path / "summary.json").is_file():
            out.append(path)
        elif (path / "points").is_dir():
            out.extend(
                sorted(p for p in (path / "points").iterdir() if (p / "summary.json").is_file())
            )
        else:
            raise PointsError([f"{path}: expected a run directory (summary.json) or a sweep "
                               "directory (points/)"])  # fmt: skip
    return out


def read_point(path: Path) -> Point:
    """An aggregate-only run directory's point, every field it reads checked."""
    file = path / "summary.json"
    try:
        summary = rundir.read_json(file)
    except rundir.InputError as exc:
        raise PointsError(exc.lines) from None
    if not rundir.is_aggregate_only(summary):
        raise PointsError([f"{file}: aggregate_only: expected true (a published point, as "
                           "speclens import writes it)"])  # fmt: skip
    settings = summary.get("settings")
    figures = summary.get("figures")
    if not isinstance(settings, dict) or not isinstance(figures, dict):
        raise PointsError([f"{file}: settings, figures: expected objects"])
    problems = []
    for key in ("concurrency", "gpus"):
        value = settings.get(key)
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            problems.append(f"{file}: settings.{key}: expected an integer >= 1, got {value!r}")
    for key in ("input_tokens", "output_tokens"):
        value = settings.get(key)
        top = value.get("max") if isinstance(value, dict) else None
        if not (isinstance(top, int) and not isinstance(top, bool) and top >= 1):
            problems.append(f"{file}: settings.{key}.max: expected an integer >= 1, got {top!r}")
    read: dict[str, float] = {}
    for name in ("latency_ms.tpot.p50", "latency_ms.ttft.p50",
                 "throughput.total_tokens_per_s_per_gpu"):  # fmt: skip
        found: Any = figures
        for key in name.split("."):
            found = found.get(key) if isinstance(found, dict) else None
        if not _positive(found):
            problems.append(f"{file}: figures.{name}: expected a number > 0, got {found!r}")
        else:
            read[name] = float(found)
    if problems:
        raise PointsError(problems)
    return Point(path, settings, read["latency_ms.tpot.p50"] / 1e3,
                 read["latency_ms.ttft.p50"] / 1e3,
                 read["throughput.total_tokens_per_s_per_gpu"])  # fmt: skip


def read_points(paths: Sequence[Path]) -> list[Point]:
    """The points of ``paths`` (run or sweep directories), by concurrency."""
    return sorted((read_point(p) for p in _runs(paths)), key=lambda p: p.concurrency)


#: What a fit's points must share (one chip, model, engine and precision), with how the refusal
#: names it; their layouts (TP, EP, DP attention, GPUs, workers) may differ: each point is
#: priced at its own.
DEPLOYMENT = ("hardware", "model", "engine", "precision")


@dataclass(frozen=True)
class Deployment:
    """How a point's engine split the model over its chips: tensor parallel, expert parallel
    (1: none) and DP attention (attention data parallel over the TP ranks)."""

    tensor_parallel: int
    expert_parallel: int
    dp_attention: bool

    def describe(self) -> str:
        dpa = ", DP attention" if self.dp_attention else ""
        return f"TP {self.tensor_parallel}, EP {self.expert_parallel}{dpa}"


#: The widest tensor or expert parallelism a point may state (a roofline's ``parallel``).
MAX_PARALLEL = 1024


def deployment(point: Point, fallback: Deployment | None = None) -> Deployment:
    """``point``'s deployment, each field checked; a field it leaves out (null) is
    ``fallback``'s, else none of it (TP 1, EP 1, no DP attention)."""
    file = point.path / "summary.json"
    s, problems = point.settings, []
    base = fallback or Deployment(1, 1, False)
    values: dict[str, int] = {}
    for key in ("tensor_parallel", "expert_parallel"):
        value = getattr(base, key) if s.get(key) is None else s.get(key)
        if not (isinstance(value, int) and not isinstance(value, bool)
                and 1 <= value <= MAX_PARALLEL):  # fmt: skip
            problems.append(f"{file}: settings.{key}: expected an integer from 1 to "
                            f"{MAX_PARALLEL}, got {value!r}")  # fmt: skip
        else:
            values[key] = value
    dpa = base.dp_attention if s.get("dp_attention") is None else s.get("dp_attention")
    if not isinstance(dpa, bool):
        problems.append(f"{file}: settings.dp_attention: expected true or false, got {dpa!r}")
    if problems:
        raise PointsError(problems)
    return Deployment(values["tensor_parallel"], values["expert_parallel"], bool(dpa))


def deployed(roof: Roofline, point: Point, fallback: Deployment | None = None) -> Priced:
    """``roof`` at ``point``'s deployment (``deployment``): its TP, EP and DP attention, the
    efficiencies, model and chip kept; a disaggregated point's prefill and decode pools
    (``pools``); one the roofline cannot price is refused naming the field."""
    if point.disaggregated:
        return pools(roof, point)
    d = deployment(point, fallback)
    out = replace(roof, parallel=d.tensor_parallel, expert_parallel=d.expert_parallel,
                  dp_attention=d.dp_attention)  # fmt: skip
    problems = out.problems()
    if problems:
        raise PointsError([f"{point.path / 'summary.json'}: settings.{line}" for line in problems])
    return out


#: A disaggregated point's pools, as ``speclens import`` writes them under ``settings``.
POOLS = ("prefill", "decode")


def layout(point: Point) -> dict[str, tuple[int, int, int, bool]]:
    """A disaggregated point's pools: per pool (workers, GPUs a worker, EP, DP attention), each
    field checked: workers >= 1, GPUs a whole number of workers, EP at most a worker's GPUs."""
    file, s = point.path / "summary.json", point.settings
    out, problems = {}, []
    for name in POOLS:
        pool = s.get(name)
        where = f"{file}: settings.{name}"
        if not isinstance(pool, dict):
            problems.append(f"{where}: expected an object (workers, gpus, tensor_parallel, "
                            "expert_parallel, dp_attention), as speclens import writes a "
                            "disaggregated point")  # fmt: skip
            continue
        ep, dpa = pool.get("expert_parallel"), pool.get("dp_attention")
        counts, bad = {}, []
        for key in ("workers", "gpus"):
            value = pool.get(key)
            if (
                isinstance(value, int)
                and not isinstance(value, bool)
                and 1 <= value <= MAX_PARALLEL
            ):
                counts[key] = value
            else:
                bad.append(f"{where}.{key}: expected an integer from 1 to {MAX_PARALLEL}, got "
                           f"{value!r}")  # fmt: skip
        workers, gpus = counts.get("workers", 1), counts.get("gpus", 1)
        if not bad and gpus % workers:
            bad.append(f"{where}.gpus: {gpus} GPUs do not split into {workers} workers")
        width = gpus // workers if not bad else 1
        if ep is None:
            ep = 1
        tp = pool.get("tensor_parallel")
        stated = max(tp if isinstance(tp, int) and not isinstance(tp, bool) else 1,
                     ep if isinstance(ep, int) and not isinstance(ep, bool) else 1)  # fmt: skip
        if not bad and 1 < stated < width and width % stated == 0:
            # a worker's GPUs a multiple of its stated TP and EP: that many more workers of
            # that width (a width TP and EP both leave at 1 is the worker's GPUs, DP attention)
            workers, width = gpus // stated, stated
        if not (isinstance(ep, int) and not isinstance(ep, bool) and 1 <= ep <= max(width, 1)):
            bad.append(f"{where}.expert_parallel: expected an integer from 1 to {width} (a "
                       f"worker's GPUs), got {ep!r}")  # fmt: skip
        if dpa is not None and not isinstance(dpa, bool):
            bad.append(f"{where}.dp_attention: expected true, false or null, got {dpa!r}")
        problems += bad
        if not bad:
            out[name] = (workers, width, ep, bool(dpa))
    if problems:
        raise PointsError(problems)
    return out


def pools(roof: Roofline, point: Point) -> Pools:
    """``roof`` as a disaggregated point's pools: a prefill worker (no drafter: only decode
    pools speculate) and a decode worker, each at its own width, EP and DP attention."""
    file = point.path / "summary.json"
    found = layout(point)
    priced = {}
    for name, (_, width, ep, dpa) in found.items():
        out = replace(roof, parallel=width, expert_parallel=ep, dp_attention=dpa,
                      method=roof.method if name == "decode" else None)  # fmt: skip
        problems = out.problems()
        experts = out.model.experts
        if experts is not None and ep > experts.routed:  # EPLB's redundant experts fill the rest
            problems.append(f"expert_parallel: {ep} ranks for {out.model.name}'s "
                            f"{experts.routed} routed experts: expected at most one rank an "
                            "expert")  # fmt: skip
        if problems:
            raise PointsError([f"{file}: settings.{name}.{line}" for line in problems])
        priced[name] = out
    return pools_at(Pools(priced["prefill"], priced["decode"], found["prefill"][0],
                          found["decode"][0]))  # fmt: skip


def plan(point: Point, k: int = 0, acceptance_length: float = 1.0) -> Schedule | Load:
    """What a point's prediction reruns under each price: a single-node point's schedule (its
    closed loop in steps), a disaggregated point's load (solved in its steady state)."""
    load = point.load(k, acceptance_length)
    return load if point.disaggregated else schedule(load)


def figures_of(planned: Schedule | Load, priced: Priced, front: float, gpus: int) -> Figures:
    """A point's figures from its ``plan`` under ``priced``."""
    if isinstance(priced, Pools):
        load = planned.load if isinstance(planned, Schedule) else planned
        return disagg.figures(load, priced, front, gpus)
    assert isinstance(planned, Schedule)
    return planned.figures(priced, front, gpus)


def predict(point: Point, priced: Priced, front: float, k: int = 0,
            acceptance_length: float = 1.0) -> Figures:  # fmt: skip
    """``point``'s figures under ``priced`` (``deployed``), at K and AL."""
    return figures_of(plan(point, k, acceptance_length), priced, front, point.gpus)


def with_method(priced: Priced, method: str | None) -> Priced:
    """``priced`` with the drafter ``method`` (a disaggregated deployment's decode pool only)."""
    if isinstance(priced, Pools):
        return replace(priced, decode=replace(priced.decode, method=method))
    return replace(priced, method=method)


def check_points(points: Sequence[Point], *, speculating: bool = False) -> None:
    """Refuse what a fit cannot take: too few points, points of two chips, models, engines or
    precisions, speculating points (their AL is not published). Layouts may differ, single-node
    and disaggregated alike: each point is priced at its own."""
    lines = []
    for p in points:
        if p.speculating and not speculating:
            lines.append(f"{p.path / 'summary.json'}: settings.method: is "
                         f"{p.settings.get('method')!r}: its AL was not published, so it cannot "
                         "price steps; fit on points without speculation and pass it as "
                         "--acceptance-from")  # fmt: skip
    for key in DEPLOYMENT:
        values = sorted({str(p.settings.get(key)) for p in points})
        if len(values) > 1:
            lines.append(f"calibrate: settings.{key}: the points differ ({', '.join(values)}): "
                         "a fit prices one chip, model, engine and precision; calibrate each "
                         "apart")  # fmt: skip
    if len(points) < MIN_POINTS:
        lines.append(f"calibrate: {len(points)} published point(s), at least {MIN_POINTS} needed "
                     "(the fit has 5 free parameters and each point gives 3 figures)")  # fmt: skip
    if lines:
        raise PointsError(lines)


def describe_layout(priced: Priced) -> str:
    """A point's layout in words: ``TP 8, EP 8, DP attention`` or its pools'."""
    if isinstance(priced, Pools):
        return priced.describe()
    return Deployment(priced.parallel, priced.expert_parallel, priced.dp_attention).describe()


def _with(roof: Priced, values: dict[str, float]) -> Priced:
    """``roof`` at the fitted values (a disaggregated deployment's pools both); its
    per-sequence price folded into ``per_token`` (on one-token decode steps the two are one; the
    per-token reading priced InferenceX's MTP runs at concurrency 16 to 64 within 8%, the
    per-sequence one 18% to 30% fast)."""
    if isinstance(roof, Pools):
        return pools_at(replace(roof, prefill=_with_one(roof.prefill, values),
                                decode=_with_one(roof.decode, values)))  # fmt: skip
    return _with_one(roof, values)


def _with_one(roof: Roofline, values: dict[str, float]) -> Roofline:
    update = {k: v for k, v in values.items() if k != "front_latency_s"}
    return replace(
        roof, efficiency=roof.efficiency.model_copy(update={**update, "per_sequence": 0.0})
    )


def pools_at(pools: Pools) -> Pools:
    """``pools`` with the prefill pool at its own compute efficiency (``prefill_compute``)
    where the efficiencies state one."""
    e = pools.prefill.efficiency
    if e.prefill_compute is None:
        return pools
    return replace(pools, prefill=replace(pools.prefill, efficiency=e.model_copy(
        update={"compute": e.prefill_compute})))  # fmt: skip


def _start(roof: Priced, front: float) -> dict[str, float]:
    e = (roof.decode if isinstance(roof, Pools) else roof).efficiency
    start = {"compute": e.compute, "memory": e.memory, "overhead": e.overhead,
             "per_token": e.per_token or e.per_sequence, "front_latency_s": front,
             "prefill_compute": e.prefill_compute or e.compute}  # fmt: skip
    bounds = {**PARAMETERS, **PREFILL}
    return {k: min(max(v, bounds[k][0]), bounds[k][1]) for k, v in start.items()}


def residuals(points: Sequence[Point], figures: Sequence[Figures | disagg.Medians]) -> np.ndarray:
    """Per point: log(predicted / measured) of median TPOT, median TTFT, throughput per GPU."""
    out = []
    for p, f in zip(points, figures, strict=True):
        out += [math.log(max(f.median_tpot_s, 1e-12) / p.tpot_s),
                math.log(max(f.median_ttft_s, 1e-12) / p.ttft_s),
                math.log(max(f.throughput_per_gpu, 1e-12) / p.throughput_per_gpu)]  # fmt: skip
    return np.array(out)


@dataclass(frozen=True)
class Fit:
    """A roofline fitted on published points, with what the fit says of itself."""

    roofline: Roofline
    front_latency_s: float
    points: list[Point]
    figures: list[Figures]
    not_pinned: list[str]
    #: Each point's fitted pricing at its own layout (a roofline, or a disaggregated point's
    #: pools).
    priced: list[Priced]

    @property
    def residuals(self) -> np.ndarray:
        return residuals(self.points, self.figures).reshape(-1, 3)

    def report(self) -> dict[str, Any]:
        r = np.expm1(self.residuals)
        return {
            "method": "roofline fitted to published points: each point's closed loop simulated "
                      "(speclens.sim.closed_loop), least squares on log(predicted / measured) "
                      "of median TPOT, median TTFT and throughput per GPU",
            "points": [
                {"run": str(p.path), "concurrency": p.concurrency, "layout": describe_layout(q),
                 "tpot_ms": {"measured": p.tpot_s * 1e3, "predicted": f.median_tpot_s * 1e3},
                 "ttft_ms": {"measured": p.ttft_s * 1e3, "predicted": f.median_ttft_s * 1e3},
                 "throughput_per_gpu": {"measured": p.throughput_per_gpu,
                                        "predicted": f.throughput_per_gpu},
                 "error": {"tpot": float(e[0]), "ttft": float(e[1]), "throughput_per_gpu": float(e[2])}}
                for p, f, e, q in zip(self.points, self.figures, r, self.priced, strict=True)
            ],
            "tpot_error_median": float(np.median(np.abs(r[:, 0]))),
            "ttft_error_median": float(np.median(np.abs(r[:, 1]))),
            "throughput_error_median": float(np.median(np.abs(r[:, 2]))),
            "not_pinned_down": self.not_pinned,
            "misfit": _misfit(np.median(np.abs(r), axis=0)),
            "front_latency_s": self.front_latency_s,
            "load_points": [{"concurrency": p.concurrency} for p in self.points],
            "layouts": sorted({describe_layout(r) for r in self.priced}),
            "batch_widths": [min(p.concurrency for p in self.points),
                             max(p.concurrency for p in self.points)],
        }  # fmt: skip


def _misfit(medians: np.ndarray) -> str | None:
    """Why the fitted roofline does not describe its own points (a median error over
    ``MISFIT``), or None."""
    over = [f"{name} {value:.1%}" for name, value in zip(("TPOT", "TTFT", "throughput per GPU"),
                                                        medians.tolist(), strict=True)
            if value > MISFIT]  # fmt: skip
    if not over:
        return None
    return (f"the fitted roofline does not describe these points (median error {', '.join(over)}"
            f", over {MISFIT:.0%}): the engine does not run what the model and chip entries say, "
            "or the points are not one deployment's; do not predict from it")  # fmt: skip


def fit_points(
    points: Sequence[Point], roof: Roofline, front: float = 0.05, fanout: Fanout | None = None
) -> Fit:
    """The roofline's free parameters fitted to ``points`` of one chip, model, engine and
    precision (see the module), each priced at its own layout (``deployed``; one that states
    none at ``roof``'s); the points' closed loops are simulated where ``fanout`` says
    (``speclens.sim.fanout``)."""
    check_points(points)
    fallback = Deployment(roof.parallel, roof.expert_parallel, roof.dp_attention)
    return fit_pooled(points, [deployed(roof, p, fallback) for p in points], front,
                      fanout=fanout)  # fmt: skip


def fit_pooled(
    points: Sequence[Point], roofs: Sequence[Priced], front: float = 0.05, starts: int = 3,
    fanout: Fanout | None = None,
) -> Fit:  # fmt: skip
    """One set of free parameters for ``points`` each priced by its own roofline or pools (a
    chip's defaults are fitted so, over its deployments and layouts); ``fit_points`` checks
    one chip, model, engine and precision first. Each single-node point's closed loop is
    simulated once, where ``fanout`` says: in this process by default, in processes or as Ray
    tasks (the same schedules wherever they run); a disaggregated point is solved at each trial
    (``disagg``: its steady state, well under a millisecond)."""
    from scipy.optimize import least_squares

    single = [i for i, p in enumerate(points) if not p.disaggregated]
    scheduled = (fanout or Fanout()).map(schedule, [points[i].load() for i in single])
    plans: list[Schedule | Load] = [p.load() for p in points]
    for i, found in zip(single, scheduled, strict=True):
        plans[i] = found
    bounds = {**PARAMETERS, **(PREFILL if any(isinstance(r, Pools) for r in roofs) else {})}
    names = list(bounds)
    start = _start(roofs[0], front)
    x0 = np.log([start[n] for n in names])
    low = np.log([bounds[n][0] for n in names])
    high = np.log([bounds[n][1] for n in names])

    def model(x: np.ndarray, full: bool = False) -> list[Figures | disagg.Medians]:
        """Each point's figures at ``x``: a disaggregated one's medians alone, but ``full``."""
        values = dict(zip(names, np.exp(x).tolist(), strict=True))
        front = values["front_latency_s"]
        out: list[Figures | disagg.Medians] = []
        for s, r, p in zip(plans, roofs, points, strict=True):
            priced = _with(r, values)
            if isinstance(priced, Pools) and isinstance(s, Load) and not full:
                out.append(disagg.medians(s, priced, front, p.gpus))
            else:
                out.append(figures_of(s, priced, front, p.gpus))
        return out

    grid = np.ones((len(points), 3))
    grid[[p.disaggregated for p in points], 1] = DISAGG_TTFT_WEIGHT
    weights = grid.ravel()

    def objective(x: np.ndarray) -> np.ndarray:
        return np.concatenate([weights * residuals(points, model(x)), PRIOR * (x - x0)])

    best = None
    # From the start and from spread starts: the roofline's max makes the error piecewise.
    for shift in (0.0, -1.5, 1.5)[:starts]:
        spread = np.array([shift, shift, -shift, 0.0, 0.0, shift][: len(names)])
        x = np.clip(x0 + spread, low + 1e-9, high - 1e-9)
        result = least_squares(objective, x, bounds=(low, high), method="trf", x_scale=1.0,
                               diff_step=1e-3, max_nfev=400)  # fmt: skip
        if best is None or result.cost < best.cost:
            best = result
    assert best is not None
    values = dict(zip(names, np.exp(best.x).tolist(), strict=True))
    figures = [f for f in model(best.x, full=True) if isinstance(f, Figures)]
    base = residuals(points, figures)
    not_pinned = []
    for j, name in enumerate(names):
        moved = best.x.copy()
        up = moved[j] + math.log(2.0) <= high[j]
        moved[j] += math.log(2.0) if up else -math.log(2.0)
        if float(np.max(np.abs(residuals(points, model(moved)) - base))) < math.log1p(PINNED):
            not_pinned.append(name)
    first = roofs[0].decode if isinstance(roofs[0], Pools) else roofs[0]
    return Fit(_with_one(first, values), values["front_latency_s"], list(points), figures,
               not_pinned, [_with(r, values) for r in roofs])  # fmt: skip


@dataclass(frozen=True)
class Acceptance:
    """The AL a speculating run's median TPOT implies, with the range the fit allows."""

    acceptance_length: float
    low: float
    high: float
    num_spec_tokens: int
    run: Path
    tpot_ms: float
    predicted_tpot_ms: float


def _tpot(point: Point, priced: Priced, front: float, k: int) -> Callable[[float], float]:
    def at(al: float) -> float:
        return predict(point, priced, front, k, al).median_tpot_s

    return at


def _solve(at: Callable[[float], float], target: float, k: int) -> float | str:
    """The AL in [1, K + 1] at which ``at`` (decreasing in AL) gives ``target``; "below" when
    even AL K + 1 is slower, "above" when even AL 1 is faster."""
    lo, hi = 1.0, float(k + 1)
    if at(hi) > target:
        return "fast"
    if at(lo) < target:
        return "slow"
    for _ in range(30):
        mid = (lo + hi) / 2
        if at(mid) > target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-4:
            break
    return (lo + hi) / 2


def infer_acceptance(fit: Fit, point: Point, method: str, k: int) -> Acceptance:
    """The AL at which ``fit``'s model reproduces ``point``'s median TPOT at K ``k``, the point
    priced at its own layout (a disaggregated point's decode pool speculating)."""
    roof = fit.roofline
    fallback = Deployment(roof.parallel, roof.expert_parallel, roof.dp_attention)
    at = _tpot(point, with_method(deployed(roof, point, fallback), method), fit.front_latency_s, k)
    found = _solve(at, point.tpot_s, k)
    if isinstance(found, str):
        edge = k + 1 if found == "fast" else 1
        predicted = at(float(edge)) * 1e3
        side = (
            (
                f"faster than the model allows even at AL {edge} (K + 1: every draft accepted), "
                f"which predicts {predicted:.2f} ms"
            )
            if found == "fast"
            else (f"slower than the model predicts at AL 1 (no draft accepted: {predicted:.2f} ms)")
        )
        raise PointsError([f"{point.path / 'summary.json'}: figures.latency_ms.tpot.p50: "
                           f"{point.tpot_s * 1e3:.2f} ms is {side}: no AL in [1, {k + 1}] "
                           "reproduces this run"])  # fmt: skip
    spread = float(np.max(np.abs(fit.residuals[:, 0])))
    bounds = []
    for target in (point.tpot_s * math.exp(spread), point.tpot_s * math.exp(-spread)):
        solved = _solve(at, target, k)
        bounds.append(solved if isinstance(solved, float) else 1.0 if solved == "slow" else k + 1.0)
    return Acceptance(float(found), min(bounds), max(bounds), k, point.path,
                      point.tpot_s * 1e3, at(float(found)) * 1e3)  # fmt: skip
