"""``speclens calibrate`` on published points (aggregate-only runs, ``speclens import`` writes
them): the roofline fitted to their median TPOT, TTFT and throughput per GPU
(``speclens.sim.fit_points``), and with ``--acceptance-from`` the AL a speculating run's median
TPOT implies.

Exit codes: 0 written; 1 points that cannot be read or fitted (fewer than 3, two chips, a
disaggregated point, no AL in [1, K + 1] reproduces the run); 2 usage.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import typer
import yaml

from speclens.cli._common import err_console, fail, out_console
from speclens.cli._fanout import ray_reported


def is_published(runs: list[Path]) -> bool:
    """Whether the inputs are published points: a run directory whose summary says
    ``aggregate_only``, or a sweep directory of them (the first input decides; the reader
    refuses a mix)."""
    from speclens.runs import rundir

    first = runs[0]
    if not (first / "summary.json").is_file() and (first / "points").is_dir():
        inside = sorted(p for p in (first / "points").iterdir() if (p / "summary.json").is_file())
        if not inside:
            return False
        first = inside[0]
    try:
        summary = rundir.read_json(first / "summary.json")
    except rundir.InputError:
        return False
    return rundir.is_aggregate_only(summary)


def _entry(given: str | None, stated: Any, flag: str) -> str:
    """A flag's value, else the points' setting; a chip other than the points' is refused (a
    model may be another entry of the same architecture)."""
    strict = flag == "--hardware" and Path(str(given)).suffix == ""
    if strict and given is not None and stated is not None and given != stated:
        fail(f"command line: {flag}: {given!r}, but the points ran {stated!r}: a fit prices "
             "what ran; leave the flag out", 2)  # fmt: skip
    value = given if given is not None else stated
    if not isinstance(value, str) or not value:
        fail(f"command line: {flag}: the points do not say; pass it", 2)
    return str(value)


def roofline_for(point: Any, model: str | None, hardware: str | None, parallel: int | None,
                 precision: str | None) -> Any:  # fmt: skip
    """The roofline the points ran on: each entry from its flag, else from their settings
    (``point`` one of them; they share one deployment), at their TP, EP and DP attention."""
    from speclens.acceptance import ValidationError
    from speclens.sim import catalog
    from speclens.sim import fit_points as fp
    from speclens.sim.roofline import Roofline

    settings = point.settings
    stated = settings.get("tensor_parallel")
    if parallel is not None and stated is not None and parallel != stated:
        fail(f"command line: --parallel: {parallel}, but the points ran TP {stated!r}: a fit "
             "prices what ran; leave the flag out", 2)  # fmt: skip
    try:
        spec = catalog.resolve_model(_entry(model, settings.get("model"), "--model"), "--model")
        chip = catalog.resolve_chip(_entry(hardware, settings.get("hardware"), "--hardware"),
                                    "--hardware")  # fmt: skip
        chosen = precision or settings.get("precision")
        if chosen:
            spec = catalog.with_precision(spec, chosen, "--precision", "--precision")
        roof = Roofline(spec, chip)
    except ValidationError as exc:
        fail([str(p) for p in exc.problems], 2)
    try:
        # A point that does not state its TP (a vllm bench result): the flag's, else 1.
        return fp.deployed(roof, point, fp.Deployment(parallel or 1, 1, False))
    except fp.PointsError as exc:
        fail(exc.lines)


def published(
    runs: list[Path], output: Path, model: str | None, hardware: str | None,
    parallel: int | None, precision: str | None, method: str | None,
    acceptance_from: Path | None, k: int | None, as_json: bool, fanout: Any = None,
) -> None:  # fmt: skip
    from speclens.sim import fit_points as fp
    from speclens.sim.calibrate import KIND, _RooflineFile

    try:
        points = fp.read_points(runs)
        fp.check_points(points)
    except fp.PointsError as exc:
        fail(exc.lines)
    roof = roofline_for(points[0], model, hardware, parallel, precision)
    # The speculating run is checked before the fit: a run that cannot be used costs no fit.
    run = None if acceptance_from is None else _acceptance_run(acceptance_from, method, k, points)
    with ray_reported():  # the points' closed loops: where ``fanout`` says
        fit = fp.fit_points(points, roof, fanout=fanout)
    report = fit.report()
    acceptance = _acceptance(fit, *run) if run is not None else None
    document: dict[str, Any] = {
        "kind": KIND,
        "roofline": _RooflineFile.of(fit.roofline).model_dump(exclude_none=True),
        "fit": report,
    }
    if acceptance is not None:
        document["acceptance"] = acceptance
    document["provenance"] = {
        "runs": [str(p.path) for p in points], "engine": points[0].settings.get("engine"),
        "model": points[0].settings.get("model"), "hardware": points[0].settings.get("hardware"),
        "date": sorted({str(p.settings.get("date")) for p in points}),
        "fitted_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }  # fmt: skip
    write_yaml(output, document)
    console = err_console if as_json else out_console
    _print(console, fit, report, acceptance, output)
    if as_json:
        typer.echo(json.dumps(document, indent=2))


def _acceptance_run(path: Path, method: str | None, k: int | None,
                    points: list[Any]) -> tuple[Any, str, int]:  # fmt: skip
    """The ``--acceptance-from`` run, its method and its K: a run that speculated (its settings
    say so), with the method and K the flags give where it states none, on the deployment the
    points ran; anything else refused, naming the file and the field."""
    from speclens.sim import fit_points as fp
    from speclens.sim.limits import MAX_NUM_SPEC_TOKENS

    if not (path / "summary.json").is_file():
        fail(f"command line: --acceptance-from: {path}: expected a run directory of one "
             "concurrency (summary.json; a sweep's is under points/)", 2)  # fmt: skip
    try:
        point = fp.read_point(path)
    except fp.PointsError as exc:
        fail(exc.lines)
    file = path / "summary.json"
    stated_method = point.settings.get("method")
    if stated_method in (None, "none"):
        fail(f"{file}: settings.method: is {stated_method!r}: the run did not speculate, so its "
             "TPOT implies no AL; --acceptance-from takes a speculating run")  # fmt: skip
    if not isinstance(stated_method, str):
        fail(f"{file}: settings.method: expected a method name or null, got {stated_method!r}")
    if method is not None and stated_method != "unknown" and method != stated_method:
        fail(f"{file}: settings.method: is {stated_method!r}, but --method says {method!r}: the "
             "AL is inferred for the method the run ran; leave the flag out")  # fmt: skip
    chosen = method or (stated_method if stated_method != "unknown" else None)
    if chosen is None:
        fail(f"command line: --method: the speculating run's method (e.g. mtp): {file} states "
             f"{stated_method!r}", 2)  # fmt: skip
    stated_k = point.settings.get("num_spec_tokens")
    if stated_k is not None and not (isinstance(stated_k, int) and not isinstance(stated_k, bool)
                                     and 1 <= stated_k <= MAX_NUM_SPEC_TOKENS):  # fmt: skip
        fail(f"{file}: settings.num_spec_tokens: expected an integer from 1 to "
             f"{MAX_NUM_SPEC_TOKENS} or null, got {stated_k!r}")  # fmt: skip
    if k is not None and stated_k is not None and k != stated_k:
        fail(f"{file}: settings.num_spec_tokens: is {stated_k}, but -k says {k}: the AL is "
             "inferred at the K the run ran; leave the flag out")  # fmt: skip
    kk = k or stated_k
    if kk is None:
        fail(f"command line: --num-speculative-tokens: the run's K: {file} states none "
             "(settings.num_spec_tokens)", 2)  # fmt: skip
    keys = [key for key in fp.DEPLOYMENT if key != "engine"] + ["disaggregated"]
    ran = points[0].settings
    differ = [key for key in keys if str(point.settings.get(key)) != str(ran.get(key))]
    if differ:
        fail([f"{file}: settings.{key}: {point.settings.get(key)!r}, but the fit's points ran "
              f"{ran.get(key)!r}: the AL is inferred on the deployment the fit priced"
              for key in differ])  # fmt: skip
    return point, str(chosen), int(kk)


def _acceptance(fit: Any, point: Any, chosen: str, kk: int) -> dict[str, Any]:
    """The AL ``point``'s median TPOT implies on ``fit``, as the cost file records it."""
    from speclens.sim import fit_points as fp

    try:
        found = fp.infer_acceptance(fit, point, chosen, kk)
    except fp.PointsError as exc:
        fail(exc.lines)
    return {
        "acceptance_length": found.acceptance_length, "range": [found.low, found.high],
        "method": chosen, "num_spec_tokens": found.num_spec_tokens, "run": str(found.run),
        "concurrency": point.concurrency, "tpot_ms": found.tpot_ms,
        "predicted_tpot_ms": found.predicted_tpot_ms,
        "how": "the AL at which the calibrated roofline reproduces the run's median TPOT; the "
               "range moves that TPOT by the fit's largest TPOT residual either way",
    }  # fmt: skip


def _print(console: Any, fit: Any, report: dict[str, Any], acceptance: dict[str, Any] | None,
           output: Path) -> None:  # fmt: skip
    from speclens.sim.fit_points import Deployment

    roof = fit.roofline
    e = roof.efficiency
    deployment = Deployment(roof.parallel, roof.expert_parallel, roof.dp_attention).describe()
    console.print(
        f"roofline of {roof.model.name} on {roof.parallel} x {roof.chip.name} ({deployment}), "
        "fitted to "
        f"{len(fit.points)} published points: compute efficiency {e.compute:.3g}, memory "
        f"efficiency {e.memory:.3g}, overhead {e.overhead * 1e3:.3f} ms per step + "
        f"{e.per_token * 1e6:.2f} us per decode token, front latency "
        f"{fit.front_latency_s * 1e3:.1f} ms", markup=False,
    )  # fmt: skip
    console.print("  concurrency   TPOT ms (meas -> pred)    TTFT ms (meas -> pred)    "
                  "tok/s/GPU (meas -> pred)", markup=False)  # fmt: skip
    for row in sorted(report["points"], key=lambda r: r["concurrency"]):
        cells = []
        for key in ("tpot_ms", "ttft_ms", "throughput_per_gpu"):
            name = "throughput_per_gpu" if key == "throughput_per_gpu" else key[:4]
            cells.append(f"{row[key]['measured']:8.2f} -> {row[key]['predicted']:8.2f} "
                         f"({row['error'][name]:+6.1%})")  # fmt: skip
        console.print(f"  {row['concurrency']:>11}   " + "   ".join(cells), markup=False)
    console.print(f"median error: TPOT {report['tpot_error_median']:.1%}, TTFT "
                  f"{report['ttft_error_median']:.1%}, throughput per GPU "
                  f"{report['throughput_error_median']:.1%}", markup=False)  # fmt: skip
    if report["not_pinned_down"]:
        console.print(f"note: not pinned down by these points (moving it 2x moves no prediction "
                      f"by 2%): {', '.join(report['not_pinned_down'])}", markup=False)  # fmt: skip
    if report["misfit"]:
        console.print(f"warning: {report['misfit']}", markup=False)
    if acceptance is not None:
        low, high = acceptance["range"]
        console.print(f"acceptance: AL {acceptance['acceptance_length']:.2f} (range {low:.2f} to "
                      f"{high:.2f}) at K {acceptance['num_spec_tokens']} "
                      f"({acceptance['method']}), from {acceptance['run']}'s median TPOT "
                      f"{acceptance['tpot_ms']:.2f} ms", markup=False)  # fmt: skip
    console.print(f"wrote {output}", markup=False)


def write_yaml(output: Path, document: dict[str, Any]) -> None:
    """The YAML file calibrate writes (a cost file, or a chip entry with --host)."""
    try:
        output.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    except OSError as exc:
        fail(f"{output}: cannot write: {exc.strerror or exc}")
