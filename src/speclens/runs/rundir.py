"""A run directory read back: its summary.json and records.jsonl, checked and bounded.

compare, ``sim --trace`` and calibrate read runs the same way: every field they read typed
(``summary_problems``, ``record.row_problems``), every file and row count bounded, and each row
kept only in the fields the reader uses (a row's raw wire payloads are dropped as its line is
read), what is kept of all inputs together bounded too (``Budget``, ``MAX_KEPT_BYTES``).

An aggregate-only run (a published result, or a prediction of one: ``"aggregate_only": true``
in its summary.json) has no records.jsonl: it is read as its summary alone, no rows, its
published figures checked (``aggregate_problems``). A records.jsonl beside such a summary is not
read, and the run says so (``Run.notes``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import orjson

from speclens.runs.record import MAX_COUNT, MAX_LINE_BYTES, parse_row

#: The most GPUs a run's settings may state.
MAX_GPUS = 4096
#: Bounds on what is read: one file, rows per run.
MAX_FILE_BYTES = 64 * 2**20
MAX_ROWS = 2**20
#: The most bytes (as JSON) a reader keeps of all its inputs together: the fields it reads of
#: every summary and records.jsonl row (compare's: about 300 bytes a request, held in about 3
#: times that, some 900,000 requests in 0.8 GB at most), whatever the rows' raw payloads weigh.
MAX_KEPT_BYTES = 256 * 2**20

_SHA256 = re.compile(r"[0-9a-f]{64}")

#: ``settings.settings_schema`` of a run that records every setting compare checks (the
#: workload's digest, sampling, K, the acceptance's source, the GPUs). A run without it was
#: written before that: a field it lacks is named as one it predates, never as missing.
SETTINGS_SCHEMA = "speclens.settings/2"
#: ``settings.sampling`` values: a simulated run sent no request (``speclens sim``).
SAMPLING = ("simulated",)

#: What a reader keeps of a checked row (or summary): the fields it reads.
Keep = Callable[[dict[str, Any]], dict[str, Any]]


class InputError(Exception):
    """An input that cannot be compared: one line per problem, and the exit code (1: an invalid
    file, 2: a usage error such as a directory that is not a run, or runs of different models)."""

    def __init__(self, lines: Sequence[str], code: int) -> None:
        super().__init__("\n".join(lines))
        self.lines = list(lines)
        self.code = code


@dataclass
class Run:
    """One run directory, checked: its summary and its measured rows."""

    path: Path
    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.summary["settings"])

    @property
    def aggregate_only(self) -> bool:
        """Published figures only, nothing per request (``is_aggregate_only``)."""
        return is_aggregate_only(self.summary)

    @property
    def completed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("success") and "row_error" not in r]

    @property
    def forced(self) -> bool:
        """The server forced its acceptance (speclens serve says so), or bench judged the run
        against an expected AL."""
        server = self.summary.get("server")
        acceptance = server.get("acceptance") if isinstance(server, dict) else None
        if isinstance(acceptance, dict) and acceptance.get("forced") is True:
            return True
        return isinstance(self.summary.get("verdict"), dict)

    @property
    def forced_al(self) -> float | None:
        server = self.summary.get("server")
        acceptance = server.get("acceptance") if isinstance(server, dict) else None
        if not isinstance(acceptance, dict) or acceptance.get("forced") is not True:
            return None
        value = acceptance.get("acceptance_length")
        return float(value) if is_number(value) else None

    @property
    def engine(self) -> str | None:
        server = self.summary.get("server")
        engine = server.get("engine") if isinstance(server, dict) else None
        return engine if isinstance(engine, str) else None

    def ks(self) -> set[int]:
        """The K its requests report; else the server's; else the one its settings state
        (``bench --num-spec-tokens``, for a server that reports none, as llama.cpp)."""
        out = {s["num_spec_tokens"] for s in self.specs() if s.get("num_spec_tokens")}
        if out:
            return out
        server = self.summary.get("server")
        acceptance = server.get("acceptance") if isinstance(server, dict) else None
        served = acceptance.get("num_speculative_tokens") if isinstance(acceptance, dict) else None
        for k in (served, self.settings.get("num_speculative_tokens")):
            if is_int(k) and k > 0:
                return {k}
        return set()

    def specs(self) -> list[dict[str, Any]]:
        return [r["spec_decode_acceptance"] for r in self.completed
                if isinstance(r.get("spec_decode_acceptance"), dict)]  # fmt: skip


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def read_json(path: Path) -> Any:
    """A JSON file within ``MAX_FILE_BYTES``, read at its size (a read of the bound itself
    would take that much memory first, whatever the file holds). An aggregate-only summary
    written with NaN or Infinity (Python's json writes them) is read, so that the field that
    holds one is named (``aggregate_problems``); any other file with them is not JSON."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise InputError([f"{path}: larger than {MAX_FILE_BYTES} bytes"], 1)
        with path.open("rb") as fh:
            data = fh.read(size + 1)
    except OSError as exc:
        raise InputError([f"{path}: cannot be read: {exc.strerror or exc}"], 1) from None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        error = InputError([f"{path}: not JSON ({exc})"[:300]], 1)
    try:
        lenient = json.loads(data)
    except (ValueError, RecursionError):
        raise error from None
    if not is_aggregate_only(lenient):
        raise error from None
    return lenient


def is_aggregate_only(summary: object) -> bool:
    """A summary of published figures only (``"aggregate_only": true``): no records.jsonl."""
    return isinstance(summary, dict) and summary.get("aggregate_only") is True


#: (field, test, what it must be) for every settings field compare reads.
_SETTINGS = (
    ("model", lambda v: isinstance(v, str) and v, "a model name"),
    ("max_tokens", lambda v: v is None or (is_int(v) and v > 0), "null or an integer > 0"),
    ("ignore_eos", lambda v: isinstance(v, bool), "true or false"),
    ("temperature", lambda v: is_number(v) and v >= 0, "a number >= 0"),
    ("concurrency", lambda v: v is None or (is_int(v) and v > 0), "null or an integer > 0"),
    ("request_rate", lambda v: v is None or (is_number(v) and v > 0), "null or a number > 0"),
    ("prompts_sha256", lambda v: v is None or (isinstance(v, str) and _SHA256.fullmatch(v)),
     "null or 64 lowercase hex digits"),
    ("stream", lambda v: v is None or isinstance(v, bool), "null or true or false"),
    ("endpoint", lambda v: v is None or (isinstance(v, str) and 0 < len(v) <= 64),
     "null or an endpoint name"),
    ("sampling", lambda v: v is None or v in SAMPLING,
     "null or " + " or ".join(repr(s) for s in SAMPLING)),
    ("gpus", lambda v: v is None or (is_int(v) and 0 < v <= MAX_GPUS),
     f"null or an integer in [1, {MAX_GPUS}]"),
    ("acceptance_source", lambda v: _name(v), "null or a name (at most 256 characters)"),
    ("acceptance_profile", lambda v: _name(v), "null or a name (at most 256 characters)"),
    ("settings_schema", lambda v: v is None or (isinstance(v, str) and 0 < len(v) <= 64),
     f"null or a schema name ({SETTINGS_SCHEMA!r})"),
    # The deployment a simulated run records (compare's deployment check reads it).
    ("hardware", lambda v: _name(v), "null or a chip name"),
    ("engine", lambda v: _name(v), "null or an engine name"),
    ("precision", lambda v: _name(v), "null or a precision name"),
    ("tensor_parallel", lambda v: _count(v), "null or an integer > 0"),
    ("expert_parallel", lambda v: _count(v), "null or an integer > 0"),
    ("dp_attention", lambda v: v is None or isinstance(v, bool), "null or true or false"),
    ("disaggregated", lambda v: v is None or isinstance(v, bool), "null or true or false"),
    ("method", lambda v: _name(v), "null or a method name"),
)  # fmt: skip


def predates(settings: dict[str, Any]) -> bool:
    """The run was written before runs recorded every setting compare checks (no
    ``settings.settings_schema``): a field it lacks is one it predates."""
    return settings.get("settings_schema") is None


def summary_problems(summary: object, where: str) -> list[str]:
    """What is wrong with a run's summary.json, for every field compare reads."""
    if not isinstance(summary, dict):
        return [f"{where}: expected a JSON object, got {type(summary).__name__}"]
    settings, figures = summary.get("settings"), summary.get("figures")
    if not isinstance(settings, dict) or not isinstance(figures, dict):
        return [f"{where}: settings, figures: missing: not a speclens run summary"]
    out = []
    for name, test, what in _SETTINGS:
        value = settings.get(name)
        if not test(value):
            out.append(f"{where}: settings.{name}: expected {what}, got {value!r:.60}")
    server = summary.get("server")
    if server is not None and not isinstance(server, dict):
        out.append(f"{where}: server: expected null or an object, got {server!r:.60}")
    if isinstance(server, dict) and not isinstance(server.get("acceptance", {}), dict | None):
        out.append(f"{where}: server.acceptance: expected an object, got "
                   f"{server['acceptance']!r:.60}")  # fmt: skip
    duration = figures.get("duration_s")
    if not (is_number(duration) and duration >= 0):
        out.append(f"{where}: figures.duration_s: expected seconds >= 0, got {duration!r:.60}")
    return out


def _name(value: object) -> bool:
    return value is None or (isinstance(value, str) and 0 < len(value) <= 256)


def _count(value: object) -> bool:
    return value is None or (is_int(value) and value > 0)


def _lengths(value: object) -> bool:
    if value is None:
        return True
    if not isinstance(value, dict):
        return False
    low, high = value.get("min"), value.get("max")
    return is_int(low) and is_int(high) and low <= high


#: (field, test, what it must be) for every settings field an aggregate-only run is read by.
_AGGREGATE_SETTINGS = (
    ("model", lambda v: isinstance(v, str) and 0 < len(v) <= 256, "a model name"),
    ("hardware", _name, "null or a chip name"),
    ("engine", _name, "null or an engine name"),
    ("image", _name, "null or an image name"),
    ("precision", _name, "null or a precision name"),
    ("tensor_parallel", _count, "null or an integer > 0"),
    ("expert_parallel", _count, "null or an integer > 0"),
    ("dp_attention", lambda v: v is None or isinstance(v, bool), "null or true or false"),
    ("disaggregated", lambda v: v is None or isinstance(v, bool), "null or true or false"),
    ("gpus", _count, "null or an integer > 0"),
    ("input_tokens", _lengths, "null or {min, max}: integers, min <= max"),
    ("output_tokens", _lengths, "null or {min, max}: integers, min <= max"),
    ("max_tokens", _count, "null or an integer > 0"),
    ("concurrency", _count, "null or an integer > 0"),
    ("request_rate", lambda v: v is None or (is_number(v) and v > 0), "null or a number > 0"),
    ("method", _name, "null or a method name"),
    ("num_spec_tokens", _count, "null or an integer > 0"),
    ("date", _name, "null or a date"),
    ("executor", _name, "null or an executor name"),
)  # fmt: skip

#: The published latency figures (milliseconds) and the statistics of each that are read.
AGGREGATE_LATENCY = ("ttft", "tpot", "itl", "e2e")
AGGREGATE_STATS = ("mean", "p50", "p90", "p99")
#: The published throughput figures (tokens/s; whole deployment and per GPU).
AGGREGATE_THROUGHPUT = ("output_tokens_per_s", "total_tokens_per_s",
                        "output_tokens_per_s_per_gpu", "total_tokens_per_s_per_gpu",
                        "requests_per_s")  # fmt: skip


def _figure(value: object) -> bool:
    return value is None or (is_number(value) and value >= 0)


def aggregate_problems(summary: object, where: str) -> list[str]:
    """What is wrong with an aggregate-only summary, for every field its readers use: the
    settings that name the deployment and load, and the published figures (each null, or a
    finite number >= 0). One line per problem, ``<file>: <field>: expected ...``."""
    if not isinstance(summary, dict):
        return [f"{where}: expected a JSON object, got {type(summary).__name__}"]
    settings, figures = summary.get("settings"), summary.get("figures")
    out = []
    if not isinstance(settings, dict):
        out.append(f"{where}: settings: expected an object, got {settings!r:.60}")
    else:
        for name, test, what in _AGGREGATE_SETTINGS:
            value = settings.get(name)
            if not test(value):
                out.append(f"{where}: settings.{name}: expected {what}, got {value!r:.60}")
    for key in ("server", "provenance"):
        if summary.get(key) is not None and not isinstance(summary.get(key), dict):
            out.append(f"{where}: {key}: expected null or an object, got {summary[key]!r:.60}")
    provenance = summary.get("provenance")
    if isinstance(provenance, dict):
        url = provenance.get("run_url")
        if not _name(provenance.get("source")):
            out.append(f"{where}: provenance.source: expected null or a name, got "
                       f"{provenance.get('source')!r:.60}")  # fmt: skip
        if url is not None and not (isinstance(url, str) and len(url) <= 2048):
            out.append(f"{where}: provenance.run_url: expected null or a URL, got {url!r:.60}")
    if not isinstance(figures, dict):
        got = "nothing" if "figures" not in summary else f"{figures!r:.60}"
        return [*out, f"{where}: figures: expected the published figures (an object), got {got}"]
    latency = figures.get("latency_ms")
    if not isinstance(latency, dict):
        out.append(f"{where}: figures.latency_ms: expected an object, got {latency!r:.60}")
        latency = {}
    for name in AGGREGATE_LATENCY:
        dist = latency.get(name)
        if dist is None:
            continue
        if not isinstance(dist, dict):
            out.append(f"{where}: figures.latency_ms.{name}: expected null or an object, got "
                       f"{dist!r:.60}")  # fmt: skip
            continue
        for stat in AGGREGATE_STATS:
            if not _figure(dist.get(stat)):
                out.append(f"{where}: figures.latency_ms.{name}.{stat}: expected null or "
                           f"milliseconds >= 0, got {dist.get(stat)!r:.60}")  # fmt: skip
    for part, names, what in (
        ("throughput", AGGREGATE_THROUGHPUT, "tokens/s >= 0"),
        ("interactivity", ("p50", "mean"), "tokens/s per user >= 0"),
    ):
        block = figures.get(part)
        if block is None:
            continue
        if not isinstance(block, dict):
            out.append(f"{where}: figures.{part}: expected null or an object, got {block!r:.60}")
            continue
        for name in names:
            if not _figure(block.get(name)):
                out.append(f"{where}: figures.{part}.{name}: expected null or {what}, got "
                           f"{block.get(name)!r:.60}")  # fmt: skip
    acceptance = figures.get("acceptance")
    if isinstance(acceptance, dict):
        al = acceptance.get("acceptance_length")
        if al is not None and not (is_number(al) and al >= 1):
            out.append(f"{where}: figures.acceptance.acceptance_length: expected null or a "
                       f"number >= 1, got {al!r:.60}")  # fmt: skip
    elif acceptance is not None:
        out.append(f"{where}: figures.acceptance: expected null or an object, got "
                   f"{acceptance!r:.60}")  # fmt: skip
    return out


class Budget:
    """What a reader may still keep, in bytes of JSON (``MAX_KEPT_BYTES`` for one reading)."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = MAX_KEPT_BYTES if limit is None else limit
        self.left = self.limit

    def take(self, kept: object, where: str) -> None:
        self.left -= len(orjson.dumps(kept, option=orjson.OPT_NON_STR_KEYS))
        if self.left < 0:
            raise InputError([f"{where}: the fields kept of its inputs pass "
                              f"{self.limit:,} bytes in all: expected fewer or smaller runs"], 1)  # fmt: skip


def read_rows(path: Path, budget: Budget, keep: Keep) -> list[dict[str, Any]]:
    """The measured rows of records.jsonl, each through ``row_problems`` and kept only in the
    fields the reader uses (``keep``, counted against ``budget``); the first bad lines raise one
    InputError."""
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    try:
        with path.open("rb") as fh:
            for number in range(1, MAX_ROWS + 2):
                line = fh.readline(MAX_LINE_BYTES + 1)
                if not line:
                    break
                if number > MAX_ROWS:
                    problems.append(f"{path}: holds more than {MAX_ROWS} rows")
                    break
                if not line.strip():
                    continue
                row, wrong = parse_row(line)
                problems += [f"{path}: line {number}{': ' + f if f else ''}: {w}" for f, w in wrong]
                if len(problems) >= 10:
                    break
                if row is not None and not row.get("warmup"):
                    kept = keep(row)
                    budget.take(kept, f"{path}: line {number}")
                    rows.append(kept)
    except OSError as exc:
        raise InputError([f"{path}: cannot be read: {exc.strerror or exc}"], 1) from None
    if problems:
        raise InputError(problems[:10], 1)
    return rows


def read_run(path: Path, keep_row: Keep, keep_summary: Keep, budget: Budget | None = None) -> Run:
    """A run directory, checked, in the fields its reader uses (``keep_row``, ``keep_summary``);
    what it keeps is counted against ``budget`` (one reading's, or ``MAX_KEPT_BYTES`` for this
    run alone)."""
    budget = budget if budget is not None else Budget()
    summary_path = path / "summary.json"
    summary = read_json(summary_path)
    aggregate = is_aggregate_only(summary)
    check = aggregate_problems if aggregate else summary_problems
    problems = check(summary, str(summary_path))
    if problems:
        raise InputError(problems, 1)
    kept = keep_summary(summary)
    if aggregate:  # the marker travels with what is kept, whatever the reader keeps
        kept["aggregate_only"] = True
    budget.take(kept, str(summary_path))
    if aggregate:
        records = path / "records.jsonl"
        notes = ([f"{records}: not read: summary.json says aggregate-only (published figures, "
                  "no per-request data)"] if records.exists() else [])  # fmt: skip
        return Run(path, kept, [], notes)
    return Run(path, kept, read_rows(path / "records.jsonl", budget, keep_row))


def fields(names: Sequence[str]) -> Keep:
    """A ``Keep`` of the named top-level fields."""
    return lambda row: {key: row[key] for key in names if key in row}


def fields_but_acceptance(names: Sequence[str]) -> Keep:
    """``fields``, with ``figures`` less its ``acceptance``: for a reader of each request's own
    acceptance (a replay, a calibration), to whom the summary's per-request distribution would
    only count against the bound."""

    def keep(summary: dict[str, Any]) -> dict[str, Any]:
        out = fields(names)(summary)
        if isinstance(out.get("figures"), dict):
            out["figures"] = {k: v for k, v in out["figures"].items() if k != "acceptance"}
        return out

    return keep
