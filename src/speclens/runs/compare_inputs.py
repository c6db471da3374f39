"""What ``speclens compare`` reads: run and sweep directories as labelled inputs.

Every file is read through bounds and the record validators (``record.row_problems``) and kept
only in the fields compare reads, bounded in all (``rundir.MAX_KEPT_BYTES``). A sweep of several
engines gives one input per engine. An aggregate-only run (published figures, no records.jsonl)
is read too; ``published_figures`` reads what it publishes.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from speclens.acceptance import ValidationError
from speclens.acceptance.errors import Problem
from speclens.acceptance.quantity import is_finite_number
from speclens.runs import rundir
from speclens.runs.rundir import Budget, InputError, Run, is_number, read_json
from speclens.runs.stats import Interval

SWEEP_SCHEMA = "speclens.sweep/1"

#: Bounds on what is read (a run's files: ``speclens.runs.rundir``): points per sweep, inputs.
MAX_POINTS = 4096
MAX_INPUTS = 26

#: The fields of a records.jsonl row compare reads; the rest (the raw wire payloads above all)
#: are dropped as each line is read. Of ``itl_runs_s`` it keeps one run, the request's token-
#: weighted mean gap over its tokens (all the fidelity block reads of it).
ROW_FIELDS = ("index", "category", "success", "row_error", "prompt_tokens", "completion_tokens",
              "latency_s", "ttft_s", "tpot_s", "itl_runs_s", "spec_decode_acceptance")  # fmt: skip
#: Of a row's acceptance record: K, verify steps, accepted drafts and the histogram.
SPEC_FIELDS = ("num_spec_tokens", "num_spec_steps", "num_accepted_draft_tokens",
               "acceptance_histogram")  # fmt: skip
#: Of a summary: the settings, the server's engine and acceptance, the duration, the verdict;
#: the published figures and provenance (an aggregate-only run's figures are all it has).
SUMMARY_FIELDS = {"settings": None, "server": ("engine", "acceptance"),
                  "figures": ("duration_s", "latency_ms", "throughput", "interactivity"),
                  "verdict": ("passed",), "aggregate_only": None,
                  "provenance": ("source", "run_url", "trust")}  # fmt: skip

_LOAD_KEYS = ("concurrency", "request_rate")
POINT_KEYS = ("concurrency", "request_rate", "num_speculative_tokens", "acceptance_length")


def prompts_sha256(rows: Iterable[tuple[str, int | None, str]]) -> str:
    """The dataset a run draws its prompts from, as one digest: (category, max tokens, text) per
    row, in order. bench records it as ``settings.prompts_sha256``."""
    digest = hashlib.sha256()
    for category, max_tokens, text in rows:
        digest.update(orjson.dumps([category, max_tokens, text]) + b"\n")
    return digest.hexdigest()


# --- reading runs and sweeps ----------------------------------------------------------------------


def slim_row(row: dict[str, Any]) -> dict[str, Any]:
    """The fields of a checked row compare reads (``ROW_FIELDS``), the ITL as one run."""
    if "row_error" in row:  # a row that says it could not be written: only its index is checked
        return {"index": row["index"], "row_error": True,
                "category": row["category"] if isinstance(row.get("category"), str) else None}  # fmt: skip
    out = {key: row[key] for key in ROW_FIELDS if key in row}
    out["category"] = sys.intern(str(row["category"]))
    runs = out.get("itl_runs_s") or []
    tokens = sum(n for _, n in runs)
    out["itl_runs_s"] = [[sum(g * n for g, n in runs) / tokens, tokens]] if tokens else []
    spec = out.get("spec_decode_acceptance")
    if isinstance(spec, dict):
        out["spec_decode_acceptance"] = {key: spec.get(key) for key in SPEC_FIELDS}
    return out


def read_run(path: Path, budget: Budget | None = None) -> Run:
    """A run directory, checked, in the fields compare reads (``slim_row``, ``slim_summary``)."""
    return rundir.read_run(path, slim_row, slim_summary, budget)


def slim_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The fields of a checked summary compare reads (``SUMMARY_FIELDS``)."""
    out: dict[str, Any] = {}
    for key, inner in SUMMARY_FIELDS.items():
        value = summary.get(key)
        if isinstance(value, dict) and inner is not None:
            value = {k: value[k] for k in inner if k in value}
        if key in summary:
            out[key] = value
    return out


@dataclass
class Point:
    """One setting of an input: its rounds (run directories) and their figures."""

    settings: dict[str, Any]
    engine: str | None
    runs: list[Run]
    figures: dict[str, Interval] = field(default_factory=dict)

    @property
    def load(self) -> tuple[str, float] | None:
        for key in _LOAD_KEYS:
            if self.settings.get(key) is not None:
                return key, float(self.settings[key])
        return None


@dataclass
class Input:
    """A run or a sweep (one engine of it), labelled."""

    label: str
    path: Path
    kind: str
    points: list[Point]
    gpus: int = 1
    skipped: list[str] = field(default_factory=list)
    #: A predicted input's expected relative error (0.15: within 15%, the prediction's own
    #: track record); None where unknown. Its figure at a target then has the band
    #: value / (1 + e) to value x (1 + e), which compare states as the prediction's.
    expected_error: float | None = None

    def __post_init__(self) -> None:
        if self.expected_error is None and self.prediction:
            self.expected_error = stated_error(self.runs)

    @property
    def runs(self) -> list[Run]:
        return [run for point in self.points for run in point.runs]

    @property
    def model(self) -> str:
        return str(self.runs[0].settings["model"])

    @property
    def engine(self) -> str | None:
        engines = {p.engine or r.engine for p in self.points for r in p.runs} - {None}
        return ", ".join(sorted(e for e in engines if e)) or None

    @property
    def aggregate_only(self) -> bool:
        """Any of its runs is aggregate-only: published figures, nothing per request."""
        return any(run.aggregate_only for run in self.runs)

    @property
    def prediction(self) -> bool:
        """Its runs are a simulator's prediction (``settings.executor`` "sim", or provenance
        source "speclens-sim"), not a measurement."""
        return bool(self.runs) and all(is_predicted(run) for run in self.runs)

    @property
    def host(self) -> dict[str, Any] | None:
        """The client machine's load its first run recorded (``settings.host``: load average,
        CPUs, steal), where it is one; None for runs written before bench recorded it."""
        host = self.runs[0].settings.get("host") if self.runs else None
        if not isinstance(host, dict):
            return None
        load, cpus, steal = host.get("load_average"), host.get("cpus"), host.get("steal_percent")
        numbers = (
            isinstance(load, list) and len(load) == 3 and all(is_finite_number(x) for x in load)
        )
        return {"load_average": load if numbers else None,
                "cpus": cpus if isinstance(cpus, int) and not isinstance(cpus, bool) else None,
                "steal_percent": steal if is_finite_number(steal) else None}  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "path": str(self.path), "kind": self.kind,
                "model": self.model, "engine": self.engine, "gpus": self.gpus,
                "points": len(self.points), "skipped": self.skipped,
                "aggregate_only": self.aggregate_only, "host": self.host,
                "notes": [n for run in self.runs for n in run.notes]}  # fmt: skip


def is_predicted(run: Run) -> bool:
    provenance = run.summary.get("provenance")
    source = provenance.get("source") if isinstance(provenance, dict) else None
    return run.settings.get("executor") == "sim" or source == "speclens-sim"


def stated_error(runs: Sequence[Run]) -> float | None:
    """The largest throughput error the runs' ``provenance.trust`` states (``sim`` writes it,
    ``speclens.sim.trust``), None where any run states none; InputError (1) names a run whose
    statement is not a fraction."""
    errors = []
    for run in runs:
        provenance = run.summary.get("provenance")
        trust = provenance.get("trust") if isinstance(provenance, dict) else None
        expected = trust.get("expected_error") if isinstance(trust, dict) else None
        if expected is None:
            return None
        value = expected.get("throughput") if isinstance(expected, dict) else None
        if not (isinstance(value, (int, float)) and is_finite_number(value) and 0 <= value < 1e6):
            raise InputError([f"{run.path / 'summary.json'}: provenance.trust.expected_error."
                              f"throughput: expected a fraction >= 0, got {value!r}"], 1)  # fmt: skip
        errors.append(float(value))
    return max(errors, default=None)


def kind_of(path: Path) -> str:
    """ "run" or "sweep"; an InputError (exit 2) naming what is missing otherwise. A run
    directory holds summary.json and records.jsonl, or summary.json alone when that says it is
    aggregate-only (published figures, nothing per request)."""
    if not path.is_dir():
        raise InputError([f"{path}: not a directory (expected a run or a sweep directory)"], 2)
    if (path / "sweep.json").is_file():
        return "sweep"
    missing = [name for name in ("summary.json", "records.jsonl") if not (path / name).is_file()]
    if not missing:
        return "run"
    if missing == ["records.jsonl"] and _says_aggregate_only(path / "summary.json"):
        return "run"
    raise InputError([f"{path}: not a run or sweep directory: no sweep.json, and "
                      f"{' and '.join(missing)} missing"], 2)  # fmt: skip


def _says_aggregate_only(path: Path) -> bool:
    try:
        return rundir.is_aggregate_only(read_json(path))
    except InputError:
        return False


def read_inputs(
    paths: Sequence[Path], labels: Sequence[str], gpus: Sequence[int | None]
) -> list[Input]:
    """Every input, read and checked, one per path (a sweep of several engines: one per engine,
    labelled ``A/engine``). GPUs None: the input's own ``settings.gpus`` (an aggregate-only
    run's, a simulated run's deployment) where its runs state one, else 1."""
    out: list[Input] = []
    budget = Budget()
    for path, label, n in zip(paths, labels, gpus, strict=True):
        if kind_of(path) == "run":
            run = read_run(path, budget)
            settings = {k: run.settings.get(k) for k in _LOAD_KEYS}
            out.append(Input(label, path, "run", [Point(settings, run.engine, [run])], 1))
        else:
            out += _read_sweep(path, label, 1, budget)
        for item in out:
            if item.path == path:
                item.gpus = n if n is not None else _own_gpus(item)
    _same_model(out)
    return out


def _own_gpus(item: Input) -> int:
    """The GPUs its runs' settings state (one value for all its runs: an aggregate-only run's,
    or a simulated run's deployment), else 1."""
    stated = {r.settings.get("gpus") for r in item.runs}
    one = single(stated)
    return int(one) if rundir.is_int(one) and one > 0 else 1


def _read_sweep(path: Path, label: str, gpus: int, budget: Budget) -> list[Input]:
    where = path / "sweep.json"
    sweep = read_json(where)
    if not isinstance(sweep, dict) or sweep.get("schema") != SWEEP_SCHEMA:
        got = sweep.get("schema") if isinstance(sweep, dict) else type(sweep).__name__
        raise InputError([f"{where}: schema: expected {SWEEP_SCHEMA!r}, got {got!r:.60}"], 1)
    points = sweep.get("points")
    if not isinstance(points, list) or len(points) > MAX_POINTS:
        raise InputError([f"{where}: points: expected a list of at most {MAX_POINTS} points"], 1)
    groups: dict[tuple[Any, ...], Point] = {}
    skipped: list[str] = []
    for i, point in enumerate(points):
        entry = _sweep_point(point, f"{where}: points[{i}]", path)
        if entry is None:
            skipped.append(f"{point.get('id')}: {point.get('status')}")
            continue
        engine, settings, run_dir = entry
        key = (engine, *(settings.get(k) for k in POINT_KEYS))
        groups.setdefault(key, Point(settings, engine, [])).runs.append(read_run(run_dir, budget))
    if not groups:
        raise InputError([f"{where}: no point finished (status ok) to compare"], 1)
    engines = sorted({p.engine or "" for p in groups.values()})
    return [
        Input(label if len(engines) == 1 else f"{label}/{engine}", path, "sweep",
              [p for p in groups.values() if (p.engine or "") == engine], gpus, skipped)
        for engine in engines
    ]  # fmt: skip


def _sweep_point(
    point: object, where: str, root: Path
) -> tuple[str | None, dict[str, Any], Path] | None:
    """(engine, settings, run directory) of a finished point; None for one that did not finish."""
    if not isinstance(point, dict):
        raise InputError([f"{where}: expected an object, got {point!r:.60}"], 1)
    if point.get("status") != "ok":
        return None
    settings, engine, rel = point.get("settings"), point.get("engine"), point.get("dir")
    if not isinstance(settings, dict):
        raise InputError([f"{where}.settings: expected an object, got {settings!r:.60}"], 1)
    if engine is not None and not isinstance(engine, str):
        raise InputError([f"{where}.engine: expected null or a name, got {engine!r:.60}"], 1)
    if not isinstance(rel, str) or Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise InputError([f"{where}.dir: expected a path inside the sweep, got {rel!r:.60}"], 1)
    for key in POINT_KEYS:
        value = settings.get(key)
        if value is not None and not (is_number(value) and value > 0):
            raise InputError([f"{where}.settings.{key}: expected null or a number > 0, got "
                              f"{value!r:.60}"], 1)  # fmt: skip
    run_dir = root / rel
    kind_of(run_dir)
    return engine, {k: settings.get(k) for k in POINT_KEYS}, run_dir


def _same_model(inputs: Sequence[Input]) -> None:
    seen: dict[str, str] = {}
    for item in inputs:
        for run in item.runs:
            seen.setdefault(str(run.settings["model"]), f"{item.label} ({run.path})")
    if len(seen) > 1:
        shown = ", ".join(f"{where} ran {model!r}" for model, where in seen.items())
        raise InputError([f"compare: runs of different models: {shown}"], 2)


def single(values: set[Any]) -> Any:
    """The one value of a set; None when it holds none or several."""
    return next(iter(values)) if len(values) == 1 else None


# --- published figures: what an aggregate-only run states ------------------------------------

#: The published figures an aggregate-only pair is compared on, each (name, path in figures):
#: median TPOT and TTFT, total and output tokens/s per GPU (compare shows the one ``--metric``
#: names), median interactivity (tokens/s per user).
PUBLISHED = (("tpot_p50_ms", ("latency_ms", "tpot", "p50")),
             ("ttft_p50_ms", ("latency_ms", "ttft", "p50")),
             ("total_tokens_per_s_per_gpu", ("throughput", "total_tokens_per_s_per_gpu")),
             ("output_tokens_per_s_per_gpu", ("throughput", "output_tokens_per_s_per_gpu")),
             ("tokens_per_s_per_user", ("interactivity", "p50")))  # fmt: skip


def _published_value(run: Run, path: Sequence[str]) -> float | None:
    node: Any = run.summary.get("figures")
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return float(node) if is_number(node) and node >= 0 else None


def published_figures(run: Run, gpus: int) -> dict[str, float | None]:
    """A run's published figures (``PUBLISHED``): total (and output) tokens/s per GPU from the
    deployment's over ``gpus`` where no per-GPU figure is published, interactivity 1000 /
    median TPOT where none is."""
    out = {name: _published_value(run, path) for name, path in PUBLISHED}
    for which in ("total", "output"):
        whole = _published_value(run, ("throughput", f"{which}_tokens_per_s"))
        if out[f"{which}_tokens_per_s_per_gpu"] is None and whole is not None:
            out[f"{which}_tokens_per_s_per_gpu"] = whole / gpus
    tpot = out["tpot_p50_ms"]
    if out["tokens_per_s_per_user"] is None and tpot:
        out["tokens_per_s_per_user"] = 1000.0 / tpot
    return out


def point_published(point: Point, gpus: int) -> dict[str, float | None]:
    """A point's published figures: its one run's, or the median over its rounds."""
    values = [published_figures(run, gpus) for run in point.runs]
    out: dict[str, float | None] = {}
    for name, _ in PUBLISHED:
        found = [x for v in values if (x := v[name]) is not None]
        out[name] = float(np.median(found)) if found else None
    return out


def loads(item: Input) -> dict[tuple[str, float], Point]:
    """An input's points by load (the first point of each load)."""
    out: dict[tuple[str, float], Point] = {}
    for point in item.points:
        if point.load is not None:
            out.setdefault(point.load, point)
    return out


#: Longest directory name taken as an input's label; a longer one falls back to A, B, ...
MAX_DEFAULT_LABEL = 32


def labels_for(count: int, given: Sequence[str], paths: Sequence[Path] = ()) -> list[str]:
    """The user's ``--label`` values (one per input, distinct, non-empty); else the inputs'
    directory names when they are distinct, short and printable (tables read "h200 / b300");
    else A, B, ..."""
    if given:
        if len(given) != count:
            raise ValidationError([Problem("command line", "--label", f"expected one per input "
                                           f"({count}), got {len(given)}")])  # fmt: skip
        if len(set(given)) != len(given) or not all(g.strip() for g in given):
            raise ValidationError([Problem("command line", "--label",
                                           f"expected distinct non-empty labels, got {list(given)}")])  # fmt: skip
        return list(given)
    names = [Path(p).resolve().name for p in paths]
    if (
        len(names) == count
        and len(set(names)) == count
        and all(
            0 < len(n) <= MAX_DEFAULT_LABEL and n.isprintable() and n.strip() == n for n in names
        )
    ):
        return names
    return [chr(ord("A") + i) for i in range(count)]
