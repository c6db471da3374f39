"""``speclens calibrate`` on published points (aggregate-only runs, ``speclens import`` writes
them): the roofline fitted to their median TPOT, TTFT and throughput per GPU
(``speclens.sim.fit_points``), and with ``--acceptance-from`` the AL a speculating run's median
TPOT implies, and from it the AL at K 1..8 (``speclens.acceptance.curve``), which
``--write-profile FILE`` writes as a profile set of method ``inferred`` (``sim --registry`` reads
it from ``DIR/acceptance/``).

Exit codes: 0 written; 1 points that cannot be read or fitted (fewer than 3, two chips, a
disaggregated point, no AL in [1, K + 1] reproduces the run), or a curve asked of a K outside
1..8; 2 usage. Nothing is written unless everything is: the cost file and the profile set are
written beside their places first, then moved into them one after the other.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import re
import tempfile
from dataclasses import dataclass
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
    (``point`` the first of them), at its TP, EP and DP attention (the fit prices every other
    point at its own); a disaggregated point's roofline as the chip and model give it."""
    from speclens.acceptance import ValidationError
    from speclens.sim import catalog
    from speclens.sim import fit_points as fp
    from speclens.sim.roofline import Roofline

    settings = point.settings
    if point.disaggregated and parallel is not None:
        fail("command line: --parallel: the points are disaggregated: each is priced at its own "
             "prefill and decode layout; leave the flag out", 2)  # fmt: skip
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
    if point.disaggregated:  # each point is priced at its own pools (fit_points.pools)
        return roof
    try:
        # A point that does not state its TP (a vllm bench result): the flag's, else 1.
        return fp.deployed(roof, point, fp.Deployment(parallel or 1, 1, False))
    except fp.PointsError as exc:
        fail(exc.lines)


def published(
    runs: list[Path], output: Path, model: str | None, hardware: str | None,
    parallel: int | None, precision: str | None, method: str | None,
    acceptance_from: Path | None, k: int | None, as_json: bool, fanout: Any = None,
    profile: ProfileTarget | None = None,
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
    if profile is not None and run is not None:
        profile = _profile_target(profile, output, run[0], run[2], k is not None)
    with ray_reported():  # the points' closed loops: where ``fanout`` says
        try:  # each point's layout is checked before any closed loop runs
            fit = fp.fit_points(points, roof, fanout=fanout)
        except fp.PointsError as exc:
            fail(exc.lines)
    report = fit.report()
    acceptance = _acceptance(fit, *run) if run is not None else None
    if acceptance is not None and run is not None:
        acceptance["notes"] = odd_al_notes(acceptance, run[0].settings, fit.roofline.model.name)
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
    files = [(output, yaml.safe_dump(document, sort_keys=False))]
    profiles = None
    if profile is not None and acceptance is not None and run is not None:
        profiles = _profile_set(profile, acceptance, run[0], fit, len(points))
        files.append((profile.path, yaml.safe_dump(profiles, sort_keys=False, width=100)))
    write_all(files)
    console = err_console if as_json else out_console
    _print(console, fit, report, acceptance, output)
    if profiles is not None and profile is not None:
        from speclens.acceptance.curve import MAX_CURVE_K

        first = profiles["profiles"][0]
        console.print(f"wrote {profile.path} ({len(profiles['profiles'])} inferred profiles: "
                      f"{first['model']}/{first['speculative_method']}/k1..k{MAX_CURVE_K}/"
                      f"thinking-{first['thinking']}/{first['category']})", markup=False)  # fmt: skip
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
    keys = [key for key in fp.DEPLOYMENT if key != "engine"] + ["disaggregated"]  # any layout
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
        "curve": _curve(found, point.path / "summary.json"),
    }  # fmt: skip


def _curve(found: Any, file: Path) -> dict[str, Any] | None:
    """The AL at K 1..8 through the inferred one (``acceptance.curve``), each with its range;
    None (and a note when printed) at a K the model does not answer for."""
    from speclens.acceptance import curve

    if found.num_spec_tokens not in curve.CURVE_KS:
        return None
    model = curve.shipped()
    al = found.acceptance_length
    low, high = min(found.low, al), max(found.high, al)
    points = model.predict(al, found.num_spec_tokens, low, high, str(file))
    return {"model": model.describe(), "decay": model.decay,
            "points": [{"num_spec_tokens": p.num_spec_tokens,
                        "acceptance_length": round(p.acceptance_length, 4),
                        "range": [round(p.low, 4), round(p.high, 4)]} for p in points]}  # fmt: skip


#: A published inference on the run's chip and engine is left out of what the model "infers
#: elsewhere": the same chip and engine ran the same scripts, so a setting wrong in the run is
#: wrong in each of them (InferenceX's H200 SGLang MTP runs infer 1.38 and 1.47 at K 2).
_SAME_SCRIPTS = (("chip", "hardware"), ("engine", "engine"))


def odd_al_notes(acceptance: dict[str, Any], settings: dict[str, Any], model: str) -> list[str]:
    """The odd run flagged: the inferred AL at K against (1) what the shipped registry holds
    for the same model and method and (2) what the same model and method infer on InferenceX's
    other chips and engines (the accuracy table's ``inferred_acceptance``), each mapped to K by the
    AL curve (``acceptance.curve``) with its range. A note where the inferred AL's range lies
    wholly outside every mapped range (beyond the curve's own range), naming the comparison;
    none inside, or at a K the curve does not answer for."""
    from speclens.acceptance import Registry, curve
    from speclens.sim import trust

    k, method = acceptance["num_spec_tokens"], acceptance["method"]
    if k not in curve.CURVE_KS:
        return []
    sources: list[tuple[str, list[tuple[float, int, float, float]]]] = []
    registered = [(p.acceptance_length, p.key.num_spec_tokens)
                  for s in Registry.load() for p in s.profile_set.profiles
                  if (p.key.model, p.key.speculative_method) == (model, method)
                  and p.key.num_spec_tokens in curve.CURVE_KS]  # fmt: skip
    sources.append(("profiles in the registry", [(al, t, al, al) for al, t in registered]))

    elsewhere = [e for e in trust.inferred_elsewhere(model, method)
                 if not all(getattr(e, a) == settings.get(b) for a, b in _SAME_SCRIPTS)]  # fmt: skip
    sources.append(("InferenceX deployments",
                    [(e.acceptance_length, e.num_spec_tokens, e.range[0], e.range[1])
                     for e in elsewhere if e.num_spec_tokens in curve.CURVE_KS]))  # fmt: skip
    what = {"profiles in the registry": f"what the registry holds for {model} {method}",
            "InferenceX deployments": f"what {model} {method} infers elsewhere"}  # fmt: skip
    low, high = acceptance["range"]
    al = acceptance["acceptance_length"]
    notes = []
    model_ = curve.shipped()
    for name, found in sources:  # a comparison with nothing to compare says nothing
        if not found:
            continue
        mapped = [model_.predict(v, t, min(lo, v), max(hi, v))[k - 1] for v, t, lo, hi in found]
        values = [m.acceptance_length for m in mapped]
        floor, ceiling = min(m.low for m in mapped), max(m.high for m in mapped)
        if floor <= high and low <= ceiling:
            continue
        side = "below" if high < floor else "above"
        notes.append(
            f"AL {al:.2f} at K {k} is far {side} {what[name]} ({min(values):.1f} to "
            f"{max(values):.1f} at K {k} from {len(found)} {name}, mapped by the AL curve; "
            f"{floor:.2f} to {ceiling:.2f} with the curve's range): check the run's "
            "speculation settings"
        )
    return notes


def _print(console: Any, fit: Any, report: dict[str, Any], acceptance: dict[str, Any] | None,
           output: Path) -> None:  # fmt: skip
    roof = fit.roofline
    e = roof.efficiency
    layouts = report["layouts"]
    if len(layouts) > 1:
        where = f"on {roof.chip.name} ({len(layouts)} layouts, each point priced at its own)"
    elif fit.points[0].disaggregated:
        where = f"on {roof.chip.name} ({layouts[0]})"
    else:
        where = f"on {roof.parallel} x {roof.chip.name} ({layouts[0]})"
    console.print(
        f"roofline of {roof.model.name} {where}, fitted to "
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
        layout = f"   {row['layout']}" if len(layouts) > 1 else ""
        console.print(f"  {row['concurrency']:>11}   " + "   ".join(cells) + layout,
                      markup=False)  # fmt: skip
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
        _print_curve(console, acceptance)
        for note in acceptance.get("notes") or []:
            console.print(f"note: {note}", markup=False)
    console.print(f"wrote {output}", markup=False)


def _print_curve(console: Any, acceptance: dict[str, Any]) -> None:
    """The AL curve as three rows (AL, low, high) under the Ks, after the model's name."""
    from speclens.acceptance import curve

    found = acceptance["curve"]
    if found is None:
        console.print(f"note: no AL curve: K {acceptance['num_spec_tokens']} lies outside "
                      f"1..{curve.MAX_CURVE_K}, the Ks the model of the curve answers for",
                      markup=False)  # fmt: skip
        return
    console.print(f"AL curve (inferred): through AL {acceptance['acceptance_length']:.2f} at K "
                  f"{acceptance['num_spec_tokens']} by the {found['model']}", markup=False)  # fmt: skip
    points = found["points"]
    console.print("  K     " + "".join(f"{p['num_spec_tokens']:>7}" for p in points), markup=False)
    console.print("  AL    " + "".join(f"{p['acceptance_length']:7.2f}" for p in points),
                  markup=False)  # fmt: skip
    console.print("  range " + "".join(f"{p['range'][0]:7.2f}" for p in points), markup=False)
    console.print("     to " + "".join(f"{p['range'][1]:7.2f}" for p in points), markup=False)


@dataclass(frozen=True)
class ProfileTarget:
    """``--write-profile FILE`` and the key its profiles take: the thinking mode (``--thinking``)
    and the category (``--category``, else the run's dataset)."""

    path: Path
    thinking: str | None
    category: str | None


def _profile_target(target: ProfileTarget, output: Path, point: Any, kk: int,
                    k_flag: bool) -> ProfileTarget:  # fmt: skip
    """``--write-profile``'s checks, before the fit: a YAML file the registry reads, not the
    cost file, writable; a thinking mode and a category; a K the model of the curve answers
    for. Each refusal one line; nothing is written."""
    from speclens.acceptance import curve
    from speclens.acceptance.schema import CATEGORY_PATTERN
    from speclens.cli.measure import _writable

    flag = "command line: --write-profile"
    path = target.path
    if path.suffix not in (".yaml", ".yml"):
        fail(f"{flag}: {path}: expected a .yaml file (the registry reads DIR/acceptance/*.yaml)", 2)
    if path.resolve() == output.resolve():
        fail(f"{flag}: {path} is the cost file (--output): write the profile set elsewhere", 2)
    if target.thinking not in ("on", "off"):
        fail("command line: --thinking: the run's thinking mode, on or off (a profile is keyed "
             "by it; a published run does not state it)", 2)  # fmt: skip
    dataset = point.settings.get("dataset")
    category = target.category or (dataset if isinstance(dataset, str) else None)
    if category is None:
        fail(f"command line: --category: {point.path / 'summary.json'} states no "
             "settings.dataset; name the workload category the profiles are for", 2)  # fmt: skip
    if not re.fullmatch(CATEGORY_PATTERN, category):
        fail(f"command line: --category: {category!r} is malformed: use lower-case letters, "
             "digits, '_' and '-'" + ("" if target.category else " (the run's settings.dataset)"),
             2)  # fmt: skip
    if kk not in curve.CURVE_KS:
        where = ("command line: -k" if k_flag
                 else f"{point.path / 'summary.json'}: settings.num_spec_tokens")  # fmt: skip
        fail(f"{where}: K {kk} lies outside 1..{curve.MAX_CURVE_K}, the Ks the model of the "
             "AL curve answers for: no curve, nothing written")  # fmt: skip
    problem = _writable(path)
    if problem is not None:
        fail(problem.replace("--output", "--write-profile"))
    return ProfileTarget(path, target.thinking, category)


def _profile_set(target: ProfileTarget, acceptance: dict[str, Any], point: Any, fit: Any,
                 points: int) -> dict[str, Any]:  # fmt: skip
    """The AL curve as an ``AcceptanceProfileSet`` of method ``inferred``, validated as every
    registry file is (measure's and sweep's sets are too); a refusal names the file."""
    from speclens.acceptance import AcceptanceProfileSet, ValidationError, curve, validate
    from speclens.runs import rundir

    found = acceptance["curve"]
    k, al = acceptance["num_spec_tokens"], acceptance["acceptance_length"]
    low, high = acceptance["range"]
    roof = fit.roofline
    try:
        published = rundir.read_json(point.path / "summary.json").get("provenance") or {}
    except rundir.InputError:
        published = {}
    run_url = published.get("run_url") if isinstance(published, dict) else None
    source = (f"speclens calibrate --acceptance-from {acceptance['run']}: AL {al:.2f} at K {k} "
              f"from its median TPOT on the roofline fitted to {points} points, the other Ks by "
              f"the {found['model']}")  # fmt: skip
    engine = point.settings.get("image") or point.settings.get("engine")
    provenance: dict[str, Any] = {
        "source": source, "run": run_url if isinstance(run_url, str) and run_url
        else str(acceptance["run"]),
        "hardware": roof.chip.name, "tp": roof.parallel,
        "settings": {"inferred_from": {"num_spec_tokens": k, "acceptance_length": round(al, 4),
                                       "range": [round(low, 4), round(high, 4)],
                                       "concurrency": acceptance["concurrency"],
                                       "tpot_ms": round(acceptance["tpot_ms"], 4)},
                     "curve_model": {"name": "geometric decay", "decay": found["decay"],
                                     "fitted_on": curve.TRAINING_SET}},
    }  # fmt: skip
    if isinstance(engine, str) and engine:
        provenance["engine_image"] = engine
    if isinstance(point.settings.get("dataset"), str):
        provenance["benchmark"] = point.settings["dataset"]
    profiles = []
    for p in found["points"]:
        t, (lo, hi) = p["num_spec_tokens"], p["range"]
        how = ("the AL at which the calibrated roofline reproduces the run's median TPOT"
               if t == k else f"the model of the curve through AL {al:.2f} at K {k}")  # fmt: skip
        profiles.append({
            "model": roof.model.name, "speculative_method": acceptance["method"],
            "num_spec_tokens": t, "thinking": target.thinking, "category": target.category,
            "acceptance_length": p["acceptance_length"], "method": "inferred",
            "provenance": copy.deepcopy(provenance),  # written out in full, not as an alias
            "rationale": f"{how}; range {lo:.2f} to {hi:.2f}",
        })  # fmt: skip
    document = {
        "kind": "AcceptanceProfileSet", "name": target.path.stem,
        "caveats": [
            f"Inferred, not measured: AL {al:.2f} at K {k} is the AL at which the roofline "
            f"fitted to {points} published points reproduces {acceptance['run']}'s median TPOT; "
            f"the other Ks come from the {found['model']}.",
            f"The thinking mode ({target.thinking}) is what --thinking said; the category "
            f"({target.category}) is the run's prompts. Each profile's rationale gives its range.",
        ],
        "profiles": profiles,
    }  # fmt: skip
    try:
        validate(AcceptanceProfileSet, document, str(target.path))
    except ValidationError as exc:
        fail([str(p) for p in exc.problems])
    return document


def write_all(files: list[tuple[Path, str]]) -> None:
    """Write every file or none: each to a temporary file beside it, then each moved into
    place (a failure while writing removes the temporary files: nothing is written)."""
    staged: list[tuple[str, Path]] = []
    current = files[0][0]
    mask = os.umask(0)
    os.umask(mask)
    try:
        for current, text in files:
            handle, temporary = tempfile.mkstemp(dir=current.parent, prefix=f".{current.name}.")
            staged.append((temporary, current))
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                stream.write(text)
            os.chmod(temporary, 0o666 & ~mask)  # as open() would have made it, not mkstemp's 0600
        for temporary, current in staged:
            os.replace(temporary, current)
    except OSError as exc:
        for temporary, _ in staged:
            Path(temporary).unlink(missing_ok=True)
        fail(f"{current}: cannot write: {exc.strerror or exc}")


def write_yaml(output: Path, document: dict[str, Any]) -> None:
    """The YAML file calibrate writes (a cost file, or a chip entry with --host)."""
    try:
        output.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    except OSError as exc:
        fail(f"{output}: cannot write: {exc.strerror or exc}")
