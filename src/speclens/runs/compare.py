"""``speclens compare``: runs and sweeps side by side, comparability first.

Two runs are only worth a speed-up when they did the same work at the same acceptance. So every
pair is checked first, one line per check with its evidence: the same prompts (the dataset's
``prompts_sha256`` and the same measured indices and categories), the same sampling and client
(max_tokens, ignore_eos, temperature, stream, endpoint), input and output lengths that agree
(two-sample Kolmogorov-Smirnov), the same K (or a difference the user named), and acceptance:
forced runs must agree (realized AL intervals overlap, histograms pass a chi-square homogeneity
test), natural runs state their AL difference with its interval, and a forced run against a
natural one is no comparison. A pair that fails a check is "not comparable: <why>" and every
delta it prints says so.

Deltas, each with a 95% interval: the ratio B / A at matched concurrency (or request rate), and
at matched interactivity (tokens/s per user) read off each input's Pareto curve of throughput per
GPU, interpolated only where both curves reach. Every file is read through bounds and the record
validators (``record.row_problems``) and kept only in the fields compare reads, bounded in all
(``rundir.MAX_KEPT_BYTES``); nothing here trusts a figure it did not recompute.

Fidelity, for a pair of two single runs that sent the same requests (a simulator's replay of an
observed run keeps each request's index): B's error against A request by request, matched by
index, for TTFT, TPOT, ITL and E2E, and B's throughput error, the figure the deltas use.

Aggregate-only inputs (published figures, no records.jsonl: ``aggregate_pair``): every check
that needs per-request data (prompts, sampling, acceptance, histogram) says so and neither
passes nor fails; lengths, deployment (chip, engine, precision, parallelism, GPUs), load and
speculation are checked from the settings. The deltas are the published medians and throughput
per GPU, with no interval. Two verdicts of their own: a speculation A/B (same deployment and
load, speculation off in one, on in the other: InferenceX's "at X tok/s/user, MTP delivers +Y%
tok/s/GPU" and the TPOT speedup per concurrency), and a prediction against a measurement (the
fidelity block, point by point). Otherwise "published figures only", which is not comparable.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from scipy import stats as _stats

from speclens.acceptance import ValidationError
from speclens.acceptance.errors import Problem
from speclens.acceptance.quantity import is_finite_number
from speclens.runs import rundir
from speclens.runs.points import PointError, point_figures
from speclens.runs.record import MAX_SECONDS, TOLERANCE
from speclens.runs.rundir import Budget, InputError, Run, is_number, read_json
from speclens.runs.stats import CONFIDENCE, Interval, RealizedAL, realized_al

SCHEMA = "speclens.compare/1"
SWEEP_SCHEMA = "speclens.sweep/1"

#: The false-alarm rate of each distribution test (lengths, histograms).
ALPHA = 0.01

#: Check names, in the order they are reported.
CHECKS = ("model", "prompts", "sampling", "lengths", "k", "acceptance", "histogram")

#: Differences a user may name (``--differ``): they pass their check, stated.
NAMEABLE = ("k",)

#: Figures compared at matched load.
DELTA_FIGURES = ("output_tokens_per_s", "tokens_per_s_per_user", "ttft_ms")

#: Per-request figures of the fidelity block, in the order it lists them.
FIDELITY_FIGURES = ("e2e", "ttft", "tpot", "itl")

#: Fewest requests matched by index for a fidelity block: one request is an anecdote.
MIN_MATCHED = 2

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
                  "provenance": ("source", "run_url")}  # fmt: skip

_LOAD_KEYS = ("concurrency", "request_rate")
_POINT_KEYS = ("concurrency", "request_rate", "num_speculative_tokens", "acceptance_length")


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
        return bool(self.runs) and all(_predicted(run) for run in self.runs)

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


def _predicted(run: Run) -> bool:
    provenance = run.summary.get("provenance")
    source = provenance.get("source") if isinstance(provenance, dict) else None
    return run.settings.get("executor") == "sim" or source == "speclens-sim"


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
    one = _one(stated)
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
        key = (engine, *(settings.get(k) for k in _POINT_KEYS))
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
    for key in _POINT_KEYS:
        value = settings.get(key)
        if value is not None and not (is_number(value) and value > 0):
            raise InputError([f"{where}.settings.{key}: expected null or a number > 0, got "
                              f"{value!r:.60}"], 1)  # fmt: skip
    run_dir = root / rel
    kind_of(run_dir)
    return engine, {k: settings.get(k) for k in _POINT_KEYS}, run_dir


def _same_model(inputs: Sequence[Input]) -> None:
    seen: dict[str, str] = {}
    for item in inputs:
        for run in item.runs:
            seen.setdefault(str(run.settings["model"]), f"{item.label} ({run.path})")
    if len(seen) > 1:
        shown = ", ".join(f"{where} ran {model!r}" for model, where in seen.items())
        raise InputError([f"compare: runs of different models: {shown}"], 2)


# --- checks ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One comparability check: ``ok`` True (passed), False (failed) or None (not run: it
    needs per-request data an aggregate-only input does not have)."""

    name: str
    ok: bool | None
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


def _one(values: set[Any]) -> Any:
    return next(iter(values)) if len(values) == 1 else None


def check_model(a: Input, b: Input) -> Check:
    return Check("model", a.model == b.model, f"{a.label} and {b.label} ran {a.model!r}")


def _prompt_ids(item: Input) -> tuple[set[str | None], set[tuple[tuple[int, str], ...]]]:
    hashes = {run.settings.get("prompts_sha256") for run in item.runs}
    sent = {tuple(sorted((int(r["index"]), str(r.get("category"))) for r in run.rows))
            for run in item.runs}  # fmt: skip
    return hashes, sent


def check_prompts(a: Input, b: Input) -> Check:
    """The same dataset (its digest) and the same measured indices and categories."""
    (ha, sa), (hb, sb) = _prompt_ids(a), _prompt_ids(b)
    for item, hashes in ((a, ha), (b, hb)):
        if None in hashes:
            return Check("prompts", False, f"unknown: {item.label} {_no_digest(item)}")
        if len(hashes) > 1:
            return Check("prompts", False, f"{item.label}'s runs drew from {len(hashes)} "
                         "different datasets (prompts_sha256)")  # fmt: skip
    if ha != hb:
        return Check("prompts", False, f"different datasets: prompts_sha256 {_one(ha)[:12]}… "
                     f"vs {_one(hb)[:12]}…")  # fmt: skip
    if len(sa) > 1 or len(sb) > 1 or sa != sb:
        counts = sorted({len(s) for s in sa | sb})
        return Check("prompts", False, f"same dataset ({_one(ha)[:12]}…) but different requests "
                     f"sent: measured request counts {counts} or their indices and categories "
                     "differ")  # fmt: skip
    return Check("prompts", True, f"prompts_sha256 {_one(ha)[:12]}… in both; "
                 f"{len(_one(sa))} measured requests at the same indices and categories")  # fmt: skip


def _no_digest(item: Input) -> str:
    """Why an input records no ``settings.prompts_sha256``: a run written before runs recorded
    it is named as such (``rundir.predates``); a fresh one never is."""
    run = next(r for r in item.runs if r.settings.get("prompts_sha256") is None)
    where = f"({run.path})" if len(item.runs) > 1 else ""
    if rundir.predates(run.settings):
        who = "speclens sim" if _predicted(run) else "speclens bench"
        return (
            f"records no settings.prompts_sha256: a run written before {who} recorded it {where}"
        ).rstrip()
    return (
        f"records no settings.prompts_sha256 {where}".rstrip() + ": its settings say "
        f"{rundir.SETTINGS_SCHEMA} but leave the digest null (its workload is unknown)"
    )


def _simulated(settings: dict[str, Any]) -> bool:
    return settings.get("sampling") == rundir.SAMPLING[0]


def check_sampling(a: Input, b: Input) -> Check:
    """What each request asked for and how it was sent: max_tokens, ignore_eos, temperature,
    and the client's stream and endpoint (a streamed run times its tokens as they come, a
    non-streamed one only at the end). A setting a run does not record is "unknown", and two
    runs that both leave it out agree on it."""

    def sampling(item: Input) -> set[tuple[Any, ...]]:
        return {(r.settings["max_tokens"], r.settings["ignore_eos"],
                 float(r.settings["temperature"]),
                 *((rundir.SAMPLING[0], None) if _simulated(r.settings)
                   else (r.settings.get("stream"), r.settings.get("endpoint"))))
                for r in item.runs}  # fmt: skip

    def show(s: tuple[Any, ...]) -> str:
        asked = f"max_tokens {s[0]}, ignore_eos {str(s[1]).lower()}, temperature {s[2]:g}, "
        if s[3] == rundir.SAMPLING[0]:
            return asked + "simulated (no request sent)"
        stream = "unknown" if s[3] is None else str(s[3]).lower()
        return asked + f"stream {stream}, endpoint {s[4] or 'none'}"

    sa, sb = sampling(a), sampling(b)
    for item, s in ((a, sa), (b, sb)):
        if len(s) > 1:
            return Check("sampling", False, f"{item.label}'s runs differ: "
                         + "; ".join(sorted(map(show, s))))  # fmt: skip
    if sa == sb:
        return Check("sampling", True, f"{show(_one(sa))} in both")
    sim_a, sim_b = (_one(s)[3] == rundir.SAMPLING[0] for s in (sa, sb))
    if sim_a != sim_b and _one(sa)[:3] == _one(sb)[:3]:
        # a simulation against a measurement: what the requests asked for must agree; how the
        # client sent them is the measurement's alone
        return Check("sampling", True, f"{a.label} {show(_one(sa))}; {b.label} "
                     f"{show(_one(sb))}: the same requests, a prediction against a "
                     "measurement")  # fmt: skip
    return Check("sampling", False, f"{show(_one(sa))} vs {show(_one(sb))}")


def _lengths(item: Input, name: str) -> list[int]:
    return [int(r[name]) for run in item.runs for r in run.completed if r.get(name) is not None]


def check_lengths(a: Input, b: Input) -> Check:
    """Two-sample Kolmogorov-Smirnov on input and output token counts of completed requests."""
    parts, ok = [], True
    for name, title in (("prompt_tokens", "input"), ("completion_tokens", "output")):
        xa, xb = _lengths(a, name), _lengths(b, name)
        if not xa or not xb:
            return Check("lengths", False, f"{title} lengths unknown: "
                         f"{a.label} {len(xa)} and {b.label} {len(xb)} requests report them")  # fmt: skip
        test = _stats.ks_2samp(xa, xb)
        p = float(test.pvalue)
        ok = ok and p >= ALPHA
        parts.append(f"{title} tokens KS D {float(test.statistic):.3f} p {p:.3g} "
                     f"({len(xa)} vs {len(xb)} requests)")  # fmt: skip
    return Check("lengths", ok, "; ".join(parts) + ("" if ok else f" (p below {ALPHA:g})"))


def _k(item: Input) -> set[int]:
    return {k for p in item.points for r in p.runs for k in r.ks()} | {
        int(p.settings["num_speculative_tokens"]) for p in item.points
        if p.settings.get("num_speculative_tokens") is not None
    }  # fmt: skip


def _show_k(ks: set[int]) -> str:
    return "K " + ",".join(map(str, sorted(ks))) if ks else "no K (no speculation reported)"


def check_k(a: Input, b: Input, named: Sequence[str]) -> Check:
    ka, kb = _k(a), _k(b)
    if ka == kb:
        return Check("k", True, f"{_show_k(ka)} in both")
    if "k" in named:
        return Check("k", True, f"{_show_k(ka)} vs {_show_k(kb)} (a named difference: --differ k)")
    return Check("k", False, f"{_show_k(ka)} vs {_show_k(kb)} (name it with --differ k to compare "
                 "across K)")  # fmt: skip


def pooled_al(item: Input) -> RealizedAL:
    specs = [s for run in item.runs for s in run.specs() if s.get("num_spec_steps") is not None]
    return realized_al([s["num_accepted_draft_tokens"] for s in specs],
                       [s["num_spec_steps"] for s in specs])  # fmt: skip


def _show_al(label: str, al: RealizedAL) -> str:
    if not al.verify_steps:
        return f"{label} AL unknown (no per-request acceptance stats)"
    ci = al.interval()
    span = f"95% CI {ci.low:.3f} to {ci.high:.3f}" if ci.method != "none" else "no interval"
    return f"{label} AL {al.al:.3f} ({span}, {al.requests} requests)"


def _mode(item: Input) -> str:
    """ "forced" when every run forced its acceptance, "natural" when none did, else "mixed"."""
    forced = {run.forced for run in item.runs}
    return "mixed" if len(forced) > 1 else "forced" if forced == {True} else "natural"


def _show_mode(item: Input) -> str:
    mode = _mode(item)
    if mode == "mixed":
        return f"{item.label} mixed (forced and natural runs)"
    targets = sorted({t for t in (r.forced_al for r in item.runs) if t is not None})
    said = f" (AL {', '.join(f'{t:g}' for t in targets)})" if mode == "forced" and targets else ""
    return f"{item.label} {mode}{said}"


def _same_targets(a: set[float | None], b: set[float | None]) -> bool:
    """The forced ALs two servers report, equal within the record's tolerance (3.78 and
    1 + 2.78 are one target)."""

    def close(x: float, ys: set[float]) -> bool:
        return any(math.isclose(x, y, rel_tol=0, abs_tol=TOLERANCE) for y in ys)

    fa, fb = {t for t in a if t is not None}, {t for t in b if t is not None}
    return all(close(x, fb) for x in fa) and all(close(y, fa) for y in fb)


def check_acceptance(a: Input, b: Input, named: Sequence[str]) -> Check:
    """Forced runs agree (their realized AL intervals overlap, same forced AL where both say);
    natural ones state the difference B - A with its interval. A forced run against a natural
    one (or an input that mixes them) is no comparison: the acceptance checks apply to forced
    pairs only, and a natural AL is no statement about a forced one."""
    ala, alb = pooled_al(a), pooled_al(b)
    both = f"{_show_al(a.label, ala)}; {_show_al(b.label, alb)}"
    modes = {_mode(a), _mode(b)}
    if modes != {"forced"} and modes != {"natural"} and a.prediction != b.prediction:
        # a prediction's acceptance is its input (forced, or replayed from the trace): stated
        # against the observed one, its difference part of the prediction's error
        return Check("acceptance", True, f"a prediction against a measurement: {_show_mode(a)}, "
                     f"{_show_mode(b)}: {both}{_difference(ala, alb, b.label, a.label)}")  # fmt: skip
    if modes != {"forced"} and modes != {"natural"}:
        return Check("acceptance", False, f"{_show_mode(a)}, {_show_mode(b)}: a forced "
                     f"acceptance is not comparable with a natural one: {both}")  # fmt: skip
    if modes == {"natural"} or "k" in named:
        why = "a named K difference" if "k" in named else "natural acceptance"
        return Check("acceptance", True, f"{why}: {both}{_difference(ala, alb, b.label, a.label)}")
    if not ala.verify_steps or not alb.verify_steps:
        return Check("acceptance", False, f"forced, but unknown: {both}")
    ta, tb = ({r.forced_al for r in x.runs} for x in (a, b))
    if None not in ta | tb and not _same_targets(ta, tb):
        shown = " vs ".join(
            ",".join(f"{t:g}" for t in sorted(t for t in s if t is not None)) for s in (ta, tb)
        )
        return Check("acceptance", False, f"forced at different ALs ({shown}): {both}")
    ia, ib = ala.interval(), alb.interval()
    if "none" in (ia.method, ib.method):
        return Check("acceptance", False, f"forced, too few requests for an interval: {both}")
    ok = ia.low <= ib.high and ib.low <= ia.high
    verdict = "intervals overlap" if ok else "intervals do not overlap"
    return Check("acceptance", ok, f"forced: {both}: {verdict}")


def _difference(a: RealizedAL, b: RealizedAL, label_b: str, label_a: str) -> str:
    if not (a.verify_steps and b.verify_steps and math.isfinite(a.se) and math.isfinite(b.se)):
        return ""
    q = float(_stats.norm.ppf((1 + CONFIDENCE) / 2))
    d, se = b.al - a.al, math.hypot(a.se, b.se)
    return f"; {label_b} - {label_a} {d:+.3f} (95% CI {d - q * se:+.3f} to {d + q * se:+.3f})"


def pooled_histogram(item: Input) -> Counter[int]:
    out: Counter[int] = Counter()
    for run in item.runs:
        for spec in run.specs():
            for j, n in (spec.get("acceptance_histogram") or {}).items():
                out[int(j)] += int(n)
    return out


def check_histogram(a: Input, b: Input, named: Sequence[str]) -> Check:
    """Chi-square homogeneity of the pooled histograms {accepted drafts: verify steps}; required
    of forced runs only (natural ones differ by design, and the test is stated)."""
    ha, hb = pooled_histogram(a), pooled_histogram(b)
    required = _mode(a) == _mode(b) == "forced" and "k" not in named
    why = ("a named K difference" if "k" in named and _mode(a) == _mode(b)
           else "natural acceptance" if _mode(a) == _mode(b) == "natural"
           else f"{_show_mode(a)}, {_show_mode(b)}")  # fmt: skip
    if not ha or not hb:
        return Check("histogram", not required, f"unknown: {a.label} has {sum(ha.values())}, "
                     f"{b.label} {sum(hb.values())} verify steps in histograms")  # fmt: skip
    p, df = homogeneity(ha, hb)
    steps = f"{sum(ha.values())} vs {sum(hb.values())} verify steps"
    if not required:
        return Check("histogram", True, f"chi-square p {p:.3g} (df {df}, {steps}): stated, "
                     f"not required ({why})")  # fmt: skip
    ok = p >= ALPHA
    return Check("histogram", ok, f"chi-square p {p:.3g} (df {df}, {steps})"
                 + ("" if ok else f": below {ALPHA:g}, the forced histograms differ"))  # fmt: skip


def homogeneity(a: Counter[int], b: Counter[int]) -> tuple[float, int]:
    """(p-value, degrees of freedom) of the chi-square test that two histograms share one
    distribution; p 1 when every step fell in one bucket."""
    keys = sorted(set(a) | set(b))
    if len(keys) < 2:
        return 1.0, 0
    table = np.array([[a.get(k, 0) for k in keys], [b.get(k, 0) for k in keys]], dtype=float)
    result = _stats.chi2_contingency(table, correction=False)
    return float(result.pvalue), int(result.dof)


def checks(a: Input, b: Input, named: Sequence[str]) -> list[Check]:
    return [check_model(a, b), check_prompts(a, b), check_sampling(a, b), check_lengths(a, b),
            check_k(a, b, named), check_acceptance(a, b, named),
            check_histogram(a, b, named)]  # fmt: skip


# --- deltas ---------------------------------------------------------------------------------------


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
        q = _quantile(df, interval.confidence)
        return cls(interval.mean, interval.half_width / q, df)


def _quantile(df: float, confidence: float = CONFIDENCE) -> float:
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
    q = _quantile(_welch_df([(va, a.df), (vb, b.df)]))
    point, spread = b.mean / a.mean, q * math.sqrt(va + vb)
    return point, point * math.exp(-spread), point * math.exp(spread)


def _num(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _ratio_text(r: float, low: float, high: float) -> str:
    if not math.isfinite(r):
        return "no ratio (a figure has no data)"
    if not math.isfinite(low):
        return f"{r:.2f}x (no interval)"
    return f"{r:.2f}x (95% CI {low:.2f}x to {high:.2f}x)"


def matched_concurrency(a: Input, b: Input) -> list[dict[str, Any]]:
    """Ratio B / A of each delta figure at every load setting both inputs ran; where the two
    run on different GPU counts, the output tokens/s per GPU too (``PER_GPU``)."""
    out = []
    names = [*DELTA_FIGURES, *([PER_GPU] if a.gpus != b.gpus else [])]
    for key, pa, pb in _matched_points(a, b):
        for name in names:
            if name == PER_GPU:
                ia, ib = (_per_gpu(p.figures[DELTA_FIGURES[0]], x.gpus)
                          for p, x in ((pa, a), (pb, b)))  # fmt: skip
            else:
                ia, ib = pa.figures[name], pb.figures[name]
            r, low, high = ratio(Estimate.of(ia), Estimate.of(ib))
            row: dict[str, Any] = {"concurrency": None, "request_rate": None}
            row[key[0]] = int(key[1]) if key[0] == "concurrency" else key[1]
            row.update(figure=name, a=ia.to_json(), b=ib.to_json(), ratio=_num(r),
                       ratio_low=_num(low), ratio_high=_num(high),
                       interval_basis=_basis(ia, ib))  # fmt: skip
            out.append(row)
    return out


#: The per-GPU delta figure, for inputs on different GPU counts.
PER_GPU = "output_tokens_per_s_per_gpu"


def _per_gpu(interval: Interval, gpus: int) -> Interval:
    """An output tokens/s interval over ``gpus`` GPUs."""
    return dataclasses.replace(interval, mean=interval.mean / gpus, low=interval.low / gpus,
                               high=interval.high / gpus)  # fmt: skip


def _matched_points(a: Input, b: Input) -> list[tuple[tuple[str, float], Point, Point]]:
    """Points of equal load; on the full settings (K, AL) where an input has several per load."""

    def by(item: Input, full: bool) -> dict[Any, Point]:
        return {(p.load, *(p.settings.get(k) for k in _POINT_KEYS[2:])) if full else p.load: p
                for p in item.points if p.load is not None}  # fmt: skip

    full = any(len({p.load for p in x.points}) < len(x.points) for x in (a, b))
    ma, mb = by(a, full), by(b, full)
    keys = [k for k in ma if k in mb]
    return [(ma[k].load, ma[k], mb[k]) for k in keys]  # type: ignore[misc]


@dataclass(frozen=True)
class CurvePoint:
    x: float  # tokens/s per user
    y: Estimate  # output tokens/s per GPU


def pareto(item: Input) -> list[CurvePoint]:
    """The input's Pareto front of throughput per GPU against tokens/s per user: the points no
    other point beats on both, by rising interactivity."""
    points = []
    for p in item.points:
        x, y = p.figures["tokens_per_s_per_user"], Estimate.of(p.figures["output_tokens_per_s"])
        if y is not None and math.isfinite(x.mean) and x.mean > 0:
            points.append(CurvePoint(x.mean, Estimate(y.mean / item.gpus, y.se / item.gpus, y.df)))
    points.sort(key=lambda c: (-c.x, -c.y.mean))
    front: list[CurvePoint] = []
    for c in points:  # by falling x: keep a point only when it beats every point to its right
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


def matched_interactivity(a: Input, b: Input, prefix: str) -> tuple[list[dict[str, Any]], str]:
    """B's throughput per GPU against A's at each interactivity both Pareto curves reach (every
    curve point inside the overlap), InferenceX's way; and a note on what was left out."""
    ca, cb = pareto(a), pareto(b)
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
            "delta_pct": _num(delta), "low_pct": _num(dl), "high_pct": _num(dh),
            "sentence": f"{prefix}at {x:.{digits}f} tok/s/user, {b.label} delivers {delta:+.0f}% "
                        f"tok/s/GPU ({ci})",
        })  # fmt: skip
    return out, f"{span}: compared inside {low:.1f} to {high:.1f} only"


# --- fidelity: B against A, request by request ----------------------------------------------------


def _seconds(value: object) -> float | None:
    """A time a row holds, bounded as every checked time is (``tpot_s`` is not checked on read)."""
    return float(value) if is_number(value) and 0 <= value <= MAX_SECONDS else None


#: One request's per-request figures (``request_figures``), in seconds.
RequestFigures = dict[str, float | None]


def request_figures(row: dict[str, Any]) -> RequestFigures:
    """One request's E2E, TTFT, TPOT and ITL in seconds (ITL: its token-weighted mean gap, the
    per-request form of what the ITL figure pools); None where the request has none."""
    runs = row.get("itl_runs_s") or []
    tokens = sum(n for _, n in runs)
    return {
        "e2e": _seconds(row.get("latency_s")),
        "ttft": _seconds(row.get("ttft_s")),
        "tpot": _seconds(row.get("tpot_s")),
        "itl": sum(g * n for g, n in runs) / tokens if tokens else None,
    }


def _by_index(run: Run) -> dict[int, dict[str, Any]]:
    """A run's completed requests by index; an index completed twice is ambiguous, so dropped."""
    seen = Counter(int(r["index"]) for r in run.completed)
    return {int(r["index"]): r for r in run.completed if seen[int(r["index"])] == 1}


def match_requests(a: Run, b: Run) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], int]:
    """(A's row, B's row) of each request completed in both, by index, never by position (the
    files may list them in another order); and how many measured indices of either run were
    left out (absent or failed in one, or repeated)."""
    ra, rb = _by_index(a), _by_index(b)
    keys = sorted(ra.keys() & rb.keys())
    measured = {int(r["index"]) for r in (*a.rows, *b.rows)}
    return [(ra[k], rb[k]) for k in keys], len(measured) - len(keys)


def _signed_error(observed: float | None, other: float | None) -> float | None:
    """(B - A) / A; None where A has no value to divide by (none, 0, or so near 0 that the
    error is past any float)."""
    if observed is None or observed <= 0 or other is None:
        return None
    error = (other - observed) / observed
    return error if math.isfinite(error) else None


def figure_errors(
    values: Sequence[tuple[RequestFigures, RequestFigures]], name: str
) -> dict[str, Any]:
    """One figure's per-request error of B against A: the median, P90 (linear between order
    statistics) and mean (MAPE) of |B - A| / A, and the bias, the median of (B - A) / A, so a
    simulator that is as often fast as slow does not look exact."""
    found = [_signed_error(a[name], b[name]) for a, b in values]
    signed = np.array([e for e in found if e is not None], dtype=float)
    if not len(signed):
        return {"median_ape": None, "p90_ape": None, "mape": None, "bias": None, "requests": 0}
    ape = np.abs(signed)
    with np.errstate(over="ignore", invalid="ignore"):  # huge errors: a sum past floats is null
        stats = [float(np.median(ape)), float(np.percentile(ape, 90)), float(ape.mean()),
                 float(np.median(signed))]  # fmt: skip
    median, p90, mape, bias = (_num(v) for v in stats)
    return {"median_ape": median, "p90_ape": p90, "mape": mape, "bias": bias,
            "requests": len(signed)}  # fmt: skip


def throughput_error(a: Input, b: Input) -> float | None:
    """(B - A) / A of output tokens/s, from the figures the deltas use (``point_figures``)."""
    ia = a.points[0].figures.get("output_tokens_per_s")
    ib = b.points[0].figures.get("output_tokens_per_s")
    return None if ia is None or ib is None else _signed_error(ia.mean, ib.mean)


def fidelity(a: Input, b: Input) -> dict[str, Any] | None:
    """How closely B reproduces A (the observed run) request by request: a mean can agree while
    every request is off. None unless both are single runs with ``MIN_MATCHED`` requests in
    common."""
    if a.kind != "run" or b.kind != "run" or len(a.runs) != 1 or len(b.runs) != 1:
        return None
    pairs, unmatched = match_requests(a.runs[0], b.runs[0])
    if len(pairs) < MIN_MATCHED:
        return None
    values = [(request_figures(ra), request_figures(rb)) for ra, rb in pairs]
    return {"matched": len(pairs), "unmatched": unmatched,
            "figures": {name: figure_errors(values, name) for name in FIDELITY_FIGURES},
            "throughput_error": throughput_error(a, b)}  # fmt: skip


# --- the comparison -------------------------------------------------------------------------------


def _figures(point: Point, seed: int) -> dict[str, Interval]:
    try:
        return point_figures([run.path for run in point.runs], seed=seed)
    except PointError as exc:
        raise InputError([str(exc)], 1) from None


def _basis(a: Interval, b: Interval) -> str | None:
    """What a ratio's interval covers: "rounds" where both sides repeated the point (Student t
    across rounds: run-to-run variation), "requests" where a side is one run (a bootstrap over
    its requests: request-to-request variation only); None without an interval."""
    if a.method == "none" or b.method == "none":
        return None
    return "rounds" if all(i.method == "t" and i.n > 1 for i in (a, b)) else "requests"


#: What compare says of intervals from one run a side: they are no evidence of a difference.
ONE_RUN_EACH = ("one run each: the interval covers request-to-request variation only, not "
                "run-to-run (on a loaded machine two identical runs differ by 5% to 24%); no "
                "difference is significant on it alone: repeat each point (sweep --rounds 3)")  # fmt: skip


def compare_pair(a: Input, b: Input, named: Sequence[str]) -> dict[str, Any]:
    if a.aggregate_only or b.aggregate_only:
        return aggregate_pair(a, b, named)
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
    interactivity, note = matched_interactivity(a, b, prefix)
    rows = matched_concurrency(a, b)
    one_run = any(row["interval_basis"] == "requests" for row in rows)
    return {
        "a": a.label, "b": b.label, "comparable": comparable, "verdict": verdict,
        "checks": [c.to_json() for c in found],
        "deltas": {"matched_concurrency": rows,
                   "matched_interactivity": interactivity, "interactivity_note": note,
                   "noise_note": ONE_RUN_EACH if one_run else None},
        "fidelity": fidelity(a, b), "label": label,
    }  # fmt: skip


# --- aggregate-only inputs: published figures, nothing per request ------------------------------

#: The published figures an aggregate-only pair is compared on, each (name, path in figures):
#: median TPOT and TTFT, total tokens/s per GPU, median interactivity (tokens/s per user).
PUBLISHED = (("tpot_p50_ms", ("latency_ms", "tpot", "p50")),
             ("ttft_p50_ms", ("latency_ms", "ttft", "p50")),
             ("total_tokens_per_s_per_gpu", ("throughput", "total_tokens_per_s_per_gpu")),
             ("tokens_per_s_per_user", ("interactivity", "p50")))  # fmt: skip
#: The figures a prediction is scored on against the measurement it predicts.
PREDICTED = ("tpot_p50_ms", "ttft_p50_ms", "total_tokens_per_s_per_gpu")
#: The settings that make a deployment (an aggregate-only run states them).
DEPLOYMENT = ("hardware", "engine", "precision", "tensor_parallel", "expert_parallel",
              "dp_attention", "gpus", "disaggregated")  # fmt: skip
NO_INTERVAL = "no interval: aggregate-only"
#: Verdicts a pair can have; compare exits 0 only when every pair's is one of the first three.
VERDICTS = ("comparable", "speculation A/B", "prediction", "published figures only",
            "not comparable")  # fmt: skip


def _published_value(run: Run, path: Sequence[str]) -> float | None:
    node: Any = run.summary.get("figures")
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return float(node) if is_number(node) and node >= 0 else None


def published_figures(run: Run, gpus: int) -> dict[str, float | None]:
    """A run's published figures (``PUBLISHED``): total tokens/s per GPU from the deployment's
    total over ``gpus`` where no per-GPU figure is published, interactivity 1000 / median TPOT
    where none is."""
    out = {name: _published_value(run, path) for name, path in PUBLISHED}
    total = _published_value(run, ("throughput", "total_tokens_per_s"))
    if out["total_tokens_per_s_per_gpu"] is None and total is not None:
        out["total_tokens_per_s_per_gpu"] = total / gpus
    tpot = out["tpot_p50_ms"]
    if out["tokens_per_s_per_user"] is None and tpot:
        out["tokens_per_s_per_user"] = 1000.0 / tpot
    return out


def _point_published(point: Point, gpus: int) -> dict[str, float | None]:
    """A point's published figures: its one run's, or the median over its rounds."""
    values = [published_figures(run, gpus) for run in point.runs]
    out: dict[str, float | None] = {}
    for name, _ in PUBLISHED:
        found = [x for v in values if (x := v[name]) is not None]
        out[name] = float(np.median(found)) if found else None
    return out


def _loads(item: Input) -> dict[tuple[str, float], Point]:
    """An input's points by load (the first point of each load)."""
    out: dict[tuple[str, float], Point] = {}
    for point in item.points:
        if point.load is not None:
            out.setdefault(point.load, point)
    return out


def _who(a: Input, b: Input) -> str:
    names = [x.label for x in (a, b) if x.aggregate_only]
    return " and ".join(names) + (" are" if len(names) > 1 else " is") + " aggregate-only"


def _not_run(name: str, a: Input, b: Input) -> Check:
    return Check(name, None, f"needs per-request data: {_who(a, b)}")


def _speculation(run: Run) -> tuple[str, int | None] | None:
    """(method, K) of a run that speculates; None when speculation is off (method null/none)."""
    method = run.settings.get("method")
    if not isinstance(method, str) or method.strip().lower() in ("", "none"):
        return None
    k = run.settings.get("num_spec_tokens")
    return method, k if rundir.is_int(k) else None


def _show_spec(spec: tuple[str, int | None] | None) -> str:
    if spec is None:
        return "speculation off"
    return spec[0].upper() + (f" K {spec[1]}" if spec[1] is not None else "")


def _settings_of(item: Input, names: Sequence[str]) -> set[tuple[Any, ...]]:
    return {tuple(orjson.dumps(run.settings.get(n)).decode() for n in names) for run in item.runs}


def check_deployment(a: Input, b: Input, lenient: bool) -> Check:
    """The same chip, engine, precision, parallelism and GPUs (an aggregate-only run states
    them; a field a prediction leaves null is not compared when ``lenient``)."""
    for item in (a, b):
        if not all(run.aggregate_only for run in item.runs):
            return Check("deployment", None, f"unknown: {item.label} is not aggregate-only and "
                         "records no chip, parallelism or GPUs")  # fmt: skip
        found = _settings_of(item, DEPLOYMENT)
        if len(found) > 1:
            return Check("deployment", False, f"{item.label}'s runs differ in their deployment")
    da = dict(zip(DEPLOYMENT, next(iter(_settings_of(a, DEPLOYMENT))), strict=True))
    db = dict(zip(DEPLOYMENT, next(iter(_settings_of(b, DEPLOYMENT))), strict=True))
    differ = [f"{n} {da[n]} vs {db[n]}" for n in DEPLOYMENT
              if da[n] != db[n] and not (lenient and "null" in (da[n], db[n]))]  # fmt: skip
    if differ:
        return Check("deployment", False, "; ".join(differ).replace('"', ""))
    shown = ", ".join(f"{n} {da[n]}" for n in DEPLOYMENT if da[n] != "null").replace('"', "")
    return Check("deployment", True, f"{shown or 'nothing stated'} in both")


def check_published_lengths(a: Input, b: Input) -> Check:
    """The published input and output lengths (settings), since no request's are known."""
    names = ("input_tokens", "output_tokens")
    for item in (a, b):
        if not all(run.aggregate_only for run in item.runs):
            return _not_run("lengths", a, b)
    la, lb = _settings_of(a, names), _settings_of(b, names)
    for item, found in ((a, la), (b, lb)):
        if len(found) > 1:
            return Check("lengths", False, f"{item.label}'s runs differ in their lengths")

    def show(found: set[tuple[Any, ...]]) -> str:
        lengths = [orjson.loads(v) for v in _one(found)]
        return " / ".join("unknown" if x is None else f"{x['min']}" if x["min"] == x["max"]
                          else f"{x['min']}-{x['max']}" for x in lengths)  # fmt: skip

    if la != lb:
        return Check("lengths", False, f"published input / output tokens {show(la)} vs {show(lb)}")
    return Check("lengths", True, f"published input / output tokens {show(la)} in both (no "
                 f"per-request lengths: {_who(a, b)})")  # fmt: skip


def check_load(a: Input, b: Input) -> Check:
    """Single runs: the same concurrency (or request rate); sweeps: load axes that overlap."""
    la, lb = _loads(a), _loads(b)

    def show(loads: Iterable[tuple[str, float]]) -> str:
        return ", ".join(f"{v:g}" for _, v in sorted(loads)) or "none"

    common = sorted(la.keys() & lb.keys())
    if a.kind == b.kind == "run":
        if not common:
            return Check("load", False, f"concurrency {show(la)} vs {show(lb)}")
        return Check("load", True, f"{common[0][0].replace('_', ' ')} {show(common)} in both")
    if not common:
        return Check("load", False, f"no load in common: {a.label} {show(la)}, "
                     f"{b.label} {show(lb)}")  # fmt: skip
    return Check("load", True, f"{common[0][0].replace('_', ' ')} {show(common)} in both "
                 f"({a.label} {show(la)}, {b.label} {show(lb)})")  # fmt: skip


def check_speculation(
    a: Input, b: Input, named: Sequence[str]
) -> tuple[Check, tuple[Input, Input, tuple[str, int | None]] | None]:
    """The K check of aggregate-only inputs, from their settings (method, K); and, when
    speculation is off in one and on in the other, (off, on, (method, K)): a speculation A/B."""
    sa = {_speculation(run) for run in a.runs}
    sb = {_speculation(run) for run in b.runs}
    for item, found in ((a, sa), (b, sb)):
        if len(found) > 1:
            return Check("k", False, f"{item.label}'s runs differ: "
                         + ", ".join(sorted(map(_show_spec, found)))), None  # fmt: skip
    xa, xb = _one(sa), _one(sb)
    if xa == xb:
        return Check("k", True, f"{_show_spec(xa)} in both"), None
    if (xa is None) != (xb is None):
        off, on = (a, b) if xa is None else (b, a)
        spec = xb if xa is None else xa
        assert spec is not None
        return Check("k", True, f"{off.label} {_show_spec(None)}, {on.label} {_show_spec(spec)}: "
                     "a speculation A/B"), (off, on, spec)  # fmt: skip
    if "k" in named:
        return Check("k", True, f"{_show_spec(xa)} vs {_show_spec(xb)} (a named difference: "
                     "--differ k)"), None  # fmt: skip
    return Check("k", False, f"{_show_spec(xa)} vs {_show_spec(xb)} (name it with --differ k "
                 "to compare across K)"), None  # fmt: skip


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


def throughput_curve(item: Input) -> list[tuple[float, float]]:
    """(median interactivity, total tokens/s per GPU) of each point that publishes both,
    sorted by interactivity (one point per interactivity)."""
    out: dict[float, float] = {}
    for point in item.points:
        fig = _point_published(point, item.gpus)
        x, y = fig["tokens_per_s_per_user"], fig["total_tokens_per_s_per_gpu"]
        if x is not None and y is not None and x > 0 and y > 0:
            out.setdefault(x, y)
    return sorted(out.items())


def _x_text(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}"


def _pct_change(ratio_: float) -> str:
    return f"{(ratio_ - 1) * 100:+.0f}%"


def speculation_ab(off: Input, on: Input, spec: tuple[str, int | None]) -> dict[str, Any]:
    """InferenceX's reading of a speculation A/B: at X tok/s/user, METHOD delivers +Y% tok/s/GPU
    (total tokens/s per GPU, on over off). Single runs: at the one concurrency both ran, X the
    speculating run's interactivity. Sweeps: each side's throughput interpolated against
    interactivity (``log_interpolate``), a row at each of the speculating side's points inside
    both curves, the headline at the highest interactivity both reach. And the TPOT speedup
    (off over on, median TPOT) at each concurrency both ran."""
    method = spec[0].upper()
    out: dict[str, Any] = {"off": off.label, "on": on.label, "method": method,
                           "num_spec_tokens": spec[1], "table": [], "headline": None}  # fmt: skip

    def row(x: float, y_off: float, y_on: float) -> dict[str, Any]:
        r = y_on / y_off
        return {"tokens_per_s_per_user": x, "off_tok_s_gpu": y_off, "on_tok_s_gpu": y_on,
                "delta_pct": (r - 1) * 100,
                "sentence": f"at {_x_text(x)} tok/s/user, {method} delivers {_pct_change(r)} "
                            "tok/s/GPU"}  # fmt: skip

    c_off, c_on = throughput_curve(off), throughput_curve(on)
    if off.kind == on.kind == "run":
        out["basis"] = "same concurrency: X is the speculating run's interactivity"
        if c_off and c_on:
            out["headline"] = row(c_on[0][0], c_off[0][1], c_on[0][1])
            out["table"] = [out["headline"]]
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
                top_off, top_on = log_interpolate(c_off, high), log_interpolate(c_on, high)
                if top_off is not None and top_on is not None:
                    out["headline"] = row(high, top_off, top_on)
    speedup = []
    points_off, points_on = _loads(off), _loads(on)
    for load in sorted(points_off.keys() & points_on.keys()):
        t_off = _point_published(points_off[load], off.gpus)["tpot_p50_ms"]
        t_on = _point_published(points_on[load], on.gpus)["tpot_p50_ms"]
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


def prediction_fidelity(measured: Input, predicted: Input) -> dict[str, Any]:
    """A prediction against the measurement it predicts, both aggregate-only, points matched
    by load: per point the predicted and measured median TPOT, median TTFT and total tokens/s
    per GPU with the signed error predicted / measured - 1; and the median absolute error of
    each over the points."""
    points_m, points_p = _loads(measured), _loads(predicted)
    errors: dict[str, list[float]] = {name: [] for name in PREDICTED}
    rows = []
    for load in sorted(points_m.keys() & points_p.keys()):
        fm = _point_published(points_m[load], measured.gpus)
        fp = _point_published(points_p[load], predicted.gpus)
        figures = {}
        for name in PREDICTED:
            m, pr = fm[name], fp[name]
            error = pr / m - 1 if m and pr is not None else None
            if error is not None:
                errors[name].append(error)
            figures[name] = {"predicted": pr, "measured": m, "error": error}
        rows.append({"concurrency": int(load[1]) if load[0] == "concurrency" else None,
                     "request_rate": load[1] if load[0] == "request_rate" else None,
                     "figures": figures})  # fmt: skip
    return {"kind": "aggregate", "measured": measured.label, "predicted": predicted.label,
            "points": rows, "median_abs_error": {
                name: float(np.median(np.abs(e))) if e else None for name, e in errors.items()}}  # fmt: skip


def published_deltas(a: Input, b: Input) -> list[dict[str, Any]]:
    """B / A of each published figure at every load both ran, with no interval."""
    out = []
    pa, pb = _loads(a), _loads(b)
    for load in sorted(pa.keys() & pb.keys()):
        fa, fb = _point_published(pa[load], a.gpus), _point_published(pb[load], b.gpus)
        for name, _ in PUBLISHED:
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


def published_interactivity(a: Input, b: Input, prefix: str) -> tuple[list[dict[str, Any]], str]:
    """B's total tokens/s per GPU against A's at every curve point inside both curves
    (``log_interpolate``), with no interval."""
    ca, cb = throughput_curve(a), throughput_curve(b)
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
                                f"{_pct_change(yb / ya)} tok/s/GPU ({NO_INTERVAL})"})  # fmt: skip
    return out, f"{span}: compared inside {low:.1f} to {high:.1f} only (total tokens/s per GPU)"


def aggregate_pair(a: Input, b: Input, named: Sequence[str]) -> dict[str, Any]:
    """A pair with an aggregate-only input: the checks that need per-request data say so and
    neither pass nor fail; the deployment, published lengths, load and speculation are checked
    from the settings. Its verdict: not comparable (a check failed), a speculation A/B, a
    prediction against a measurement, or published figures only (checks did not run)."""
    both = a.aggregate_only and b.aggregate_only
    predicted = [x for x in (a, b) if x.prediction]
    one_prediction = both and len(predicted) == 1
    spec_check, ab = check_speculation(a, b, named)
    found = [check_model(a, b), _not_run("prompts", a, b), _not_run("sampling", a, b),
             check_published_lengths(a, b), check_deployment(a, b, one_prediction),
             check_load(a, b), spec_check, _not_run("acceptance", a, b),
             _not_run("histogram", a, b)]  # fmt: skip
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
        speculation = speculation_ab(*ab)
        label = "comparable as a speculation A/B"
        if predicted:  # a predicted side is said, whichever it is
            label += f" ({' and '.join(x.label for x in predicted)} predicted)"
    else:
        verdict = "published figures only"
        label = (f"published figures only: {len(not_run)} checks need per-request data "
                 f"({', '.join(not_run)}; {_who(a, b)}): deltas without intervals")  # fmt: skip
    comparable = verdict in VERDICTS[:3]
    prefix = "" if comparable else ("NOT COMPARABLE: " if failed else "UNCHECKED: ")
    interactivity, note = published_interactivity(a, b, prefix)
    return {
        "a": a.label, "b": b.label, "comparable": comparable, "verdict": verdict,
        "checks": [c.to_json() for c in found],
        "deltas": {"matched_concurrency": published_deltas(a, b),
                   "matched_interactivity": interactivity, "interactivity_note": note},
        "fidelity": fid, "speculation": speculation, "label": label,
    }  # fmt: skip


def compare(inputs: Sequence[Input], named: Sequence[str] = (), seed: int = 0) -> dict[str, Any]:
    """compare.json: every input, and every pair (A against each later input) with its checks,
    deltas and, for two single runs of the same requests, fidelity."""
    for item in inputs:
        for point in item.points:
            point.figures = _figures(point, seed)
    pairs = [compare_pair(a, b, named) for i, a in enumerate(inputs) for b in inputs[i + 1 :]]
    return {"schema": SCHEMA, "inputs": [item.to_json() for item in inputs], "pairs": pairs}


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
