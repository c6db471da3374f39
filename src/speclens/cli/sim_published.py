"""``speclens sim --trace RUN_OR_SWEEP [--step-cost COST.yaml]`` on published points
(aggregate-only runs): each point's load (its closed loop at its concurrency and lengths)
replayed in the simulator (``speclens.sim.closed_loop``; a disaggregated point in its steady
state, ``speclens.sim.disagg``), priced by the calibrated roofline (without ``--step-cost``, the
catalog's defaults for the points' chip, said in the output and in each ``summary.json``),
optionally with speculation (``--method mtp --num-speculative-tokens K --acceptance-length
X``), and written in the same shape (a sweep of aggregate-only runs, or one run), so
``speclens compare MEASURED OUT`` puts each prediction beside its measurement.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from speclens.cli._common import err_console, fail, out_console, reported


def _points(trace: Path) -> tuple[list[Any], bool]:
    """The published points and whether ``trace`` is a sweep directory."""
    from speclens.sim import fit_points as fp

    sweep = not (trace / "summary.json").is_file()
    try:
        points = fp.read_points([trace])
    except fp.PointsError as exc:
        fail(exc.lines)
    if not points:
        fail(f"{trace}: points/: no run directory (summary.json) in it")
    return points, sweep


def predict_command(
    trace: Path, step_cost: Path | None, method: str | None, k: int | None,
    acceptance_length: float | None, precision: str | None, output_dir: Path | None,
    as_json: bool,
) -> None:  # fmt: skip
    from speclens.acceptance.quantity import length_problems
    from speclens.sim import fit_points as fp
    from speclens.sim.calibrate import (
        defaults_extrapolation,
        extrapolation,
        fit_warnings,
        read_cost_file,
    )
    from speclens.sim.roofline import Roofline
    from speclens.sim.trust import for_pricing

    if step_cost is None:
        cost, meta, source = _catalog_defaults(_points(trace)[0], trace)
    else:
        with reported():
            cost, meta = read_cost_file(step_cost)
        source = str(step_cost)
    if not isinstance(cost, Roofline):
        fail(f"{step_cost}: roofline: published points are replayed on a roofline (calibrate "
             "with --model and --hardware on them writes one); this file holds a linear step "
             "cost", 2)  # fmt: skip
    speculating = method is not None and method != "none"
    if speculating and (k is None or acceptance_length is None):
        fail("command line: --method: goes with --num-speculative-tokens K and "
             "--acceptance-length X (calibrate --acceptance-from infers X)", 2)  # fmt: skip
    if not speculating and (k is not None or acceptance_length is not None):
        fail("command line: --num-speculative-tokens, --acceptance-length: go with --method", 2)
    if speculating:
        problems = length_problems(acceptance_length, int(k or 0))
        if problems:
            fail(f"command line: --acceptance-length: {problems[0]}", 2)
    if precision is not None:
        _precision(cost.model, precision, "command line", "--precision", 2)
    points, sweep = _points(trace)
    fitted = _fitted_problems(points, meta, source, trace)
    if fitted:
        fail(fitted, 1)
    if output_dir is not None and output_dir.exists() and any(output_dir.iterdir()):
        fail(f"command line: --output-dir: {output_dir}: exists and is not empty", 2)
    with reported():  # the fit's own errors, read before any replay
        described = {**cost.describe(), "source": f"from {source}" if step_cost else source}
        trust = for_pricing(
            described, meta, speculating, disaggregated=any(p.disaggregated for p in points)
        ).as_dict()
    front = float(meta.get("front_latency_s") or 0.0)
    kk, al = int(k or 0), float(acceptance_length or 1.0)
    priced = [(p, _roofline(cost, method if speculating else None, precision, p)) for p in points]
    for _, roof in priced:
        _check_prices(roof, kk, source)
    rows, summaries = [], []
    widths = (min(p.concurrency for p in points), max(p.concurrency for p in points))
    notes = [n for n in [extrapolation(meta, widths)] if n]
    notes += _deployment_notes(cost, priced, meta, source) + fit_warnings(meta, source)
    if step_cost is None:
        notes.append(f"priced with {source}, no calibration; TTFT leaves out the client's front "
                     "latency (a cost file calibrate fitted adds it)")  # fmt: skip
        notes += defaults_extrapolation(cost.chip, widths, any(p.disaggregated for p in points))
    for p, roof in priced:
        figures = fp.predict(p, roof, front, kk, al)
        _check_figures(figures, p, source)
        summary = _summary(p, figures, method if speculating else None, k, acceptance_length,
                           (step_cost, source), trace, notes, trust)  # fmt: skip
        summaries.append(summary)
        rows.append({
            "concurrency": p.concurrency,
            "tpot_ms": {"predicted": figures.median_tpot_s * 1e3, "trace": p.tpot_s * 1e3},
            "ttft_ms": {"predicted": figures.median_ttft_s * 1e3, "trace": p.ttft_s * 1e3},
            "throughput_per_gpu": {"predicted": figures.throughput_per_gpu,
                                   "trace": p.throughput_per_gpu},
        })  # fmt: skip
    result = {"trace": str(trace), "step_cost": str(step_cost) if step_cost else None,
              "priced_with": source,
              "method": method if speculating else None, "num_spec_tokens": k,
              "acceptance_length": acceptance_length, "points": rows, "trust": trust,
              "notes": notes}  # fmt: skip
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        _print(result)
    for note in notes:
        err_console.print(f"note: {note}", markup=False)
    if output_dir is not None:
        _write(output_dir, summaries, sweep, as_json)


def _catalog_defaults(points: list[Any], trace: Path) -> tuple[Any, dict[str, Any], str]:
    """The roofline the points ran on at the catalog's defaults for their chip (no cost file):
    their model and chip (one of each), how it prices, and what its defaults were fitted on."""
    from speclens.acceptance import ValidationError
    from speclens.sim import catalog
    from speclens.sim.roofline import Roofline

    found = {}
    for key in ("model", "hardware"):
        values = sorted({str(p.settings.get(key)) for p in points})
        if len(values) != 1 or values[0] == "None":
            fail(f"{trace}: settings.{key}: the points state {', '.join(values)}: without "
                 "--step-cost they are priced by the catalog's entries for one model and one "
                 "chip; pass --step-cost COST.yaml (speclens calibrate writes one)", 2)  # fmt: skip
        found[key] = values[0]
    file = str(points[0].path / "summary.json")
    try:
        model = catalog.model(found["model"], file, "settings.model")
        chip = catalog.chip(found["hardware"], file, "settings.hardware")
    except ValidationError as exc:
        fail([f"{p} (without --step-cost the catalog prices the points; pass --step-cost "
              "COST.yaml)" for p in exc.problems])  # fmt: skip
    basis = ("its defaults, fitted on published points (see its catalog entry's notes)"
             if chip.efficiency is not None
             else "the global defaults (no published point of this chip fitted its own)")  # fmt: skip
    source = f"the catalog's roofline of {model.name} on {chip.name} at {basis}"
    return Roofline(model, chip), {}, source


def _fitted_problems(points: list[Any], meta: dict[str, Any], step_cost: str,
                     trace: Path) -> list[str]:  # fmt: skip
    """The points a cost file cannot price: run on another chip or another model than the fit's
    (``provenance``): a calibrated roofline prices what it was fitted on."""
    provenance = meta.get("provenance")
    fitted = provenance if isinstance(provenance, dict) else {}
    out = []
    for key, word in (("hardware", "chip"), ("model", "model")):
        want = fitted.get(key)
        ran = sorted({str(p.settings.get(key)) for p in points if p.settings.get(key)
                      and str(p.settings.get(key)) != str(want)})  # fmt: skip
        if want and ran:
            out.append(f"{step_cost}: provenance.{key}: fitted on {want!r}, but {trace} ran on "
                       f"{', '.join(map(repr, ran))}: a calibrated roofline prices the {word} "
                       "it was fitted on")  # fmt: skip
    return out


def _precision(model: Any, precision: str, file: str, field: str, code: int) -> Any:
    from speclens.acceptance import ValidationError
    from speclens.sim import catalog

    try:
        return catalog.with_precision(model, precision, file, field)
    except ValidationError as exc:
        fail([str(p) for p in exc.problems], code)


def _roofline(cost: Any, method: str | None, precision: str | None, point: Any) -> Any:
    """The calibrated roofline for ``point``: at its own deployment (TP, EP, DP attention: a
    fit at TP 8 prices a TP 4 point on 4 chips, never at TP 8's price), at the precision the
    flag gives, else the point's own (a cost file fitted on FP8 points prices FP4 experts at
    FP4), with the method."""
    from speclens.sim import fit_points as fp

    model = cost.model
    if precision is not None:
        model = _precision(model, precision, "command line", "--precision", 2)
    elif point.settings.get("precision"):
        model = _precision(model, str(point.settings["precision"]),
                           str(point.path / "summary.json"), "settings.precision", 1)  # fmt: skip
    fitted = fp.Deployment(cost.parallel, cost.expert_parallel, cost.dp_attention)
    try:  # a point that does not state its deployment (a vllm bench result): the fit's
        return fp.deployed(replace(cost, model=model, method=method), point, fitted)
    except fp.PointsError as exc:
        fail(exc.lines)


def _deployment_notes(cost: Any, priced: list[tuple[Any, Any]], meta: dict[str, Any],
                      step_cost: str) -> list[str]:  # fmt: skip
    """A note for each layout the points ran that the fit did not (its ``fit.layouts``, else
    the cost file's roofline): its efficiencies carried to another split of the model over the
    chips."""
    from speclens.sim import fit_points as fp

    fit = meta.get("fit")
    layouts = fit.get("layouts") if isinstance(fit, dict) else None
    if not (isinstance(layouts, list) and layouts and all(isinstance(x, str) for x in layouts)):
        if not meta:
            return []  # the catalog's defaults: fitted on no one layout
        layouts = [fp.Deployment(cost.parallel, cost.expert_parallel, cost.dp_attention).describe()]
    seen = sorted({fp.describe_layout(roof) for _, roof in priced} - set(layouts))
    fitted = "; ".join(layouts)
    return [f"{step_cost}: roofline: fitted at {fitted}; the points at {d} are priced at their "
            "own layout with the fitted efficiencies: outside the fitted layouts it extrapolates"
            for d in seen]  # fmt: skip


def _check_prices(roof: Any, k: int, step_cost: str) -> None:
    """Refuse, before any replay, a roofline whose cheapest step (one request, one token of
    context) is not finite or over a year: the bound a bench-run replay holds (docs/bounds.md)."""
    import math

    import numpy as np

    from speclens.runs.record import MAX_SECONDS
    from speclens.sim.disagg import Pools

    decode, prefill = (roof.decode, roof.prefill) if isinstance(roof, Pools) else (roof, roof)
    with np.errstate(all="ignore"):  # a price that overflows is refused below, not warned of
        cheapest = float(min(decode.decode(1, 1, 1, 0, k), prefill.prefill(1, 1, 1)))
    if not (math.isfinite(cheapest) and cheapest <= MAX_SECONDS):
        fail(f"{step_cost}: roofline: prices a step at {cheapest:g} s at least: expected prices "
             f"in seconds (a run holds at most a year, {MAX_SECONDS:g} s; see roofline.chip and "
             "roofline.efficiency)")  # fmt: skip


def _check_figures(figures: Any, point: Any, step_cost: str) -> None:
    """Refuse a replay whose span is 0 s, not finite or past a year (docs/bounds.md), never
    written as a prediction."""
    import math

    from speclens.runs.record import MAX_SECONDS

    span = figures.duration_s
    if not (math.isfinite(span) and 0 < span <= MAX_SECONDS):
        fail(f"{step_cost}: roofline: the replay of {point.path} ran {span:.3g} s of virtual "
             f"time: expected more than 0 s and at most a year ({MAX_SECONDS:g} s): expected "
             "prices in seconds")  # fmt: skip


def _summary(point: Any, figures: Any, method: str | None, k: int | None, al: float | None,
             priced: tuple[Path | None, str], trace: Path, notes: list[str],
             trust: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    from speclens import __version__

    settings = {**point.settings, "executor": "sim", "method": method,
                "num_spec_tokens": k if method else None}  # fmt: skip
    block = figures.summary_figures()
    block["acceptance"] = {"acceptance_length": al, "num_spec_tokens": k} if method else None
    return {
        "aggregate_only": True,
        "settings": settings,
        "server": {"engine": "speclens", "version": __version__, "executor": "sim",
                   "model": settings.get("model"), "hardware": settings.get("hardware")},
        "provenance": {"source": "speclens-sim", "trace": str(point.path),
                       "step_cost": str(priced[0]) if priced[0] else None,
                       "priced_with": priced[1], "trust": trust, "notes": notes},
        "figures": block,
    }  # fmt: skip


def _write(output_dir: Path, summaries: list[dict[str, Any]], sweep: bool, quiet: bool) -> None:
    from speclens.runs import published

    try:
        if sweep:
            published.write_sweep(output_dir, summaries)
        else:
            published.write_point(output_dir, summaries[0])
    except OSError as exc:
        fail(f"{exc.filename or output_dir}: cannot write: {exc.strerror or exc}")
    (err_console if quiet else out_console).print(f"wrote {output_dir}", markup=False)


def _print(result: dict[str, Any]) -> None:
    spec = (f"{result['method']} at K {result['num_spec_tokens']}, AL "
            f"{result['acceptance_length']:g}" if result["method"] else "no speculation")  # fmt: skip
    out_console.print(f"replayed {len(result['points'])} published point(s) of {result['trace']} "
                      f"({spec}) on {result['priced_with']}", markup=False)  # fmt: skip
    out_console.print("  concurrency   TPOT ms (trace, pred)   TTFT ms (trace, pred)   "
                      "tok/s/GPU (trace, pred)", markup=False)  # fmt: skip
    for row in result["points"]:
        cells = [f"{row[key]['trace']:9.2f} {row[key]['predicted']:9.2f}"
                 for key in ("tpot_ms", "ttft_ms", "throughput_per_gpu")]  # fmt: skip
        out_console.print(f"  {row['concurrency']:>11}   " + "     ".join(cells), markup=False)
    out_console.print(result["trust"]["line"], markup=False)
