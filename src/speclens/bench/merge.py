"""``speclens bench merge``: one report from runs sharded across machines (``--shard i/n``).

A shard sends the arrivals whose index is i modulo n, at the times the whole run would, so the
shards of one run together send exactly its requests. The shards' files are user files, so each
is checked before it is believed: the summary's fields the merge reads, every record row
(``record.row_problems``: the acceptance records through the validator every adapter's record
passed), and the shard's indices against its settings (shard i/n of W warm-up and N measured
requests holds exactly the indices below W + N that are i modulo n, unless it was interrupted).
The merge refuses what would not add up: settings that differ in anything but the shard, shards
missing, repeated or of different n, a request index seen twice. Every figure is recomputed from
the merged records, never averaged; the duration is ``workers.run_duration``'s, as for workers.
Each shard's server check saw the other shards' traffic, so the merge keeps them per shard and
does not judge them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from speclens.acceptance import ValidationError
from speclens.acceptance.errors import Problem
from speclens.bench.client import RequestRecord, RunResult
from speclens.bench.run import BenchOutcome, _summarize, failures
from speclens.bench.workers import run_duration
from speclens.runs.record import MAX_COUNT, MAX_LINE_BYTES, MAX_SECONDS, parse_row
from speclens.runs.report import record_from_row

#: Settings that may differ between the shards of one run (``host``: each shard's own machine
#: and moment; the merged run keeps the first shard's).
SHARD_KEYS = frozenset({"shard", "part", "host"})

#: The most of a summary.json read, and of one records.jsonl line.
MAX_SUMMARY_BYTES = 64 * 2**20

#: The most shards of one run, and records read from a shard whose request count is not fixed
#: (a ``--duration`` run).
MAX_SHARDS = 2**16
MAX_RECORDS = 2**24

#: Problems reported per records.jsonl before the rest are counted only.
MAX_PROBLEMS = 20


@dataclass
class Shard:
    directory: Path
    summary: dict[str, Any]
    records: list[RequestRecord]
    shard: tuple[int, int]  # (i, n), checked

    @property
    def duration(self) -> float:
        return float(self.summary["figures"].get("duration_s") or 0.0)


# --- the summary ------------------------------------------------------------------------------


def _is_int(value: object, low: int = 0, high: int = MAX_COUNT) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _is_number(value: object, low: float = 0.0, high: float = math.inf) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and low <= value <= high
    )


#: (section, field, test, what it must be, whether it may be absent or null)
_SUMMARY_FIELDS = (
    ("settings", "num_requests", _is_int, "an integer >= 0", True),
    ("settings", "warmup", _is_int, "an integer >= 0", True),
    ("settings", "duration", lambda v: _is_number(v) and v > 0, "seconds > 0", True),
    ("settings", "max_failure_rate", lambda v: _is_number(v, 0, 1), "a number in [0, 1]", True),
    ("load", "started", lambda v: _is_number(v, 0, 2**40), "a wall-clock time (seconds)", True),
    ("load", "sending_s", lambda v: _is_number(v, 0, MAX_SECONDS), "seconds >= 0", True),
    ("load", "in_flight_at_stop", _is_int, "an integer >= 0", True),
    ("figures", "duration_s", lambda v: _is_number(v, 0, MAX_SECONDS), "seconds >= 0", True),
    ("figures", "interrupted", lambda v: isinstance(v, bool), "true or false", False),
)


def summary_problems(summary: object, where: str) -> list[Problem]:
    """What is wrong with a shard's summary.json, for every field the merge reads."""
    if not isinstance(summary, dict) or not isinstance(summary.get("settings"), dict):
        return [Problem(where, "settings", "missing: not a bench summary")]
    out = []
    for section in ("load", "figures"):
        if not isinstance(summary.get(section), dict):
            got = summary.get(section)
            out.append(Problem(where, section, f"expected an object, got {got!r:.60}"))
    if out:
        return out
    for section, key, test, what, optional in _SUMMARY_FIELDS:
        value = summary[section].get(key)
        if value is None and optional:
            continue
        if not test(value):
            out.append(Problem(where, f"{section}.{key}", f"expected {what}, got {value!r:.60}"))
    shard = summary["settings"].get("shard")
    if shard is not None and not _is_part(shard):
        out.append(
            Problem(where, "settings.shard", f"expected null or [I, N] with 0 <= I < N, got "
                    f"{shard!r:.60}")
        )  # fmt: skip
    return out


def _is_part(value: object) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and _is_int(value[1], 1, MAX_SHARDS)
        and _is_int(value[0], 0, value[1] - 1)
    )


def _read_summary(path: Path) -> tuple[dict[str, Any], list[Problem]]:
    try:
        if path.stat().st_size > MAX_SUMMARY_BYTES:
            return {}, [Problem(str(path), "", f"larger than {MAX_SUMMARY_BYTES} bytes")]
        loaded = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        return {}, [Problem(str(path), "", f"cannot be read: {exc}")]
    problems = summary_problems(loaded, str(path))
    return (loaded if not problems else {}), problems


# --- the records --------------------------------------------------------------------------------


def _lines(fh: BinaryIO, most: int) -> Iterator[tuple[int, bytes | None]]:
    """(line number, line) for at most ``most`` lines; a line longer than MAX_LINE_BYTES is
    given as None (and skipped to its end), so no line is ever held whole past the bound."""
    for number in range(1, most + 1):
        line = fh.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while (rest := fh.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                pass
            yield number, None
            continue
        yield number, line


def _row(line: bytes | None) -> tuple[RequestRecord | None, list[tuple[str, str]]]:
    """One line's record, or what is wrong with it."""
    row, problems = parse_row(line)
    if row is None:
        return None, problems
    try:
        return record_from_row(row), []
    except (KeyError, TypeError, ValueError) as exc:
        return None, [("", f"not a record row ({exc})"[:200])]


def _read_records(path: Path, most: int) -> tuple[list[RequestRecord], list[Problem], int]:
    """The records of ``path``, the problems of its first bad lines, and how many lines were
    read (at most ``most`` + 1, so a file holding too many is noticed without reading it all)."""
    records: list[RequestRecord] = []
    problems: list[Problem] = []
    bad = read = 0
    try:
        with path.open("rb") as fh:
            for number, line in _lines(fh, most + 1):
                read = number
                record, wrong = _row(line)
                if record is not None:
                    records.append(record)
                    continue
                bad += 1
                if bad <= MAX_PROBLEMS:
                    problems += [
                        Problem(str(path), f"line {number}" + (f": {f}" if f else ""), what)
                        for f, what in wrong
                    ]
    except OSError as exc:
        return [], [Problem(str(path), "", f"cannot be read: {exc.strerror or exc}")], 0
    if bad > MAX_PROBLEMS:
        problems.append(Problem(str(path), "", f"{bad - MAX_PROBLEMS} more lines are not valid"))
    return records, problems, read


# --- one shard ----------------------------------------------------------------------------------


def _owned(settings: dict[str, Any], i: int, n: int) -> range | None:
    """The indices shard i/n of this run sends, warm-up first; None when the count is not fixed
    (a ``--duration`` run)."""
    warmup, count = settings.get("warmup") or 0, settings.get("num_requests")
    if settings.get("duration") or count is None:
        return None
    return range(i, warmup + count, n)


def index_problems(
    records: list[RequestRecord], summary: dict[str, Any], i: int, n: int, where: str
) -> list[Problem]:
    """The shard's records against its settings: each index one shard i/n sends (i modulo n,
    below W + N, warm-up exactly below W), and every one of them unless the run was
    interrupted; its summary's count of measured requests is the count in records.jsonl."""
    settings, figures = summary["settings"], summary["figures"]
    warmup = settings.get("warmup") or 0
    owned = _owned(settings, i, n)
    out = []
    for record in records:
        j = record.index
        if j % n != i or (owned is not None and j not in owned):
            below = f" below {owned.stop}" if owned is not None else ""
            out.append(Problem(where, f"index {j}", f"expected an index of shard {i}/{n} "
                               f"({i} modulo {n}{below})"))  # fmt: skip
        elif record.warmup != (j < warmup):
            out.append(Problem(where, f"index {j}: warmup", f"expected {j < warmup} "
                               f"({warmup} warm-up requests)"))  # fmt: skip
        if len(out) >= MAX_PROBLEMS:
            break
    if owned is not None and not figures["interrupted"]:
        missing = sorted(set(owned) - {r.index for r in records})
        if missing:
            out.append(Problem(where, "", f"holds {len(owned) - len(missing)} of the "
                               f"{len(owned)} requests shard {i}/{n} of this run sends "
                               f"(and it was not interrupted): missing indices {missing[:10]}"))  # fmt: skip
    requests = figures.get("requests")
    sent = requests.get("sent") if isinstance(requests, dict) else None
    measured = sum(1 for r in records if not r.warmup)
    if sent is not None and sent != measured:
        out.append(Problem(where, "", f"holds {measured} measured requests; its summary.json's "
                           f"figures.requests.sent says {sent!r:.40}"))  # fmt: skip
    return out


def read_run(directory: Path) -> Shard:
    """A run's summary.json and records.jsonl, each checked; every problem found raises one
    ValidationError."""
    summary_path, records_path = directory / "summary.json", directory / "records.jsonl"
    summary, problems = _read_summary(summary_path)
    if problems:
        raise ValidationError(problems)
    part = summary["settings"].get("shard") or [0, 1]
    i, n = int(part[0]), int(part[1])
    owned = _owned(summary["settings"], i, n)
    most = MAX_RECORDS if owned is None else len(owned)
    records, problems, read = _read_records(records_path, most)
    if read > most:
        problems.append(
            Problem(str(records_path), "", f"holds more than the {most} records shard {i}/{n} "
                    "of this run can")
        )  # fmt: skip
    if not problems:
        problems = index_problems(records, summary, i, n, str(records_path))
    if problems:
        raise ValidationError(problems)
    return Shard(directory, summary, records, (i, n))


# --- the merge ----------------------------------------------------------------------------------


def output_problem(output_dir: Path, directories: list[Path]) -> str | None:
    """Why ``output_dir`` cannot take the merge: it is one of the shards it would overwrite."""
    for directory in directories:
        same = output_dir.resolve() == directory.resolve()
        if not same and output_dir.exists() and directory.exists():
            same = os.path.samefile(output_dir, directory)
        if same:
            return (
                f"command line: --output-dir: expected a directory that is not one of the "
                f"shards, got {str(output_dir)!r} (the shard {str(directory)!r})"
            )
    return None


def _setting_problems(shards: list[Shard]) -> list[Problem]:
    first = shards[0]
    base = {k: v for k, v in first.summary["settings"].items() if k not in SHARD_KEYS}
    out = []
    for shard in shards[1:]:
        settings = {k: v for k, v in shard.summary["settings"].items() if k not in SHARD_KEYS}
        for key in sorted(set(base) | set(settings)):
            if base.get(key) != settings.get(key):
                out.append(
                    Problem(
                        str(shard.directory / "summary.json"), f"settings.{key}",
                        f"{settings.get(key)!r:.80} differs from {base.get(key)!r:.80} in "
                        f"{first.directory}: not shards of one run",
                    )
                )  # fmt: skip
    return out


def _shard_problems(shards: list[Shard]) -> list[Problem]:
    """Each of the n shards exactly once."""
    count = shards[0].shard[1]
    seen: dict[int, Path] = {}
    out = []
    for shard in shards:
        i, n = shard.shard
        where = str(shard.directory / "summary.json")
        if n != count:
            out.append(Problem(where, "settings.shard", f"of {n} shards, not {count}"))
        elif i in seen:
            out.append(Problem(where, "settings.shard", f"shard {i} is also {seen[i]}"))
        seen[i] = shard.directory
    missing = sorted(set(range(count)) - set(seen))
    if missing:
        out.append(Problem("command line", "DIR", f"shards {missing[:10]} of {count} are missing"))
    return out


def _duplicate_problems(shards: list[Shard]) -> list[Problem]:
    """A request index seen twice, in one shard or two."""
    indices: dict[int, Path] = {}
    out = []
    for shard in shards:
        for record in shard.records:
            if record.index in indices:
                out.append(
                    Problem(str(shard.directory / "records.jsonl"), f"index {record.index}",
                            f"also in {indices[record.index]}")
                )  # fmt: skip
                break
            indices[record.index] = shard.directory
    return out


def merge(directories: list[Path]) -> BenchOutcome:
    """One outcome from the runs in ``directories``: the shards of one run, each exactly once."""
    shards, problems = [], []
    for directory in directories:
        try:
            shards.append(read_run(directory))
        except ValidationError as exc:
            problems += exc.problems
    if problems:
        raise ValidationError(problems)
    problems = _setting_problems(shards) + _shard_problems(shards) + _duplicate_problems(shards)
    if problems:
        raise ValidationError(problems)
    return _outcome(shards)


def _outcome(shards: list[Shard]) -> BenchOutcome:
    first = shards[0]
    count = first.shard[1]
    records = sorted((r for s in shards for r in s.records), key=lambda r: r.index)
    loads = [s.summary["load"] for s in shards]
    result = RunResult(
        records,
        min(float(load.get("started") or 0.0) for load in loads),
        run_duration(records, [s.duration for s in shards]),
        any(s.summary["figures"]["interrupted"] for s in shards),
        max(float(load.get("sending_s") or 0.0) for load in loads),
        sum(int(load.get("in_flight_at_stop") or 0) for load in loads),
    )
    base = {k: v for k, v in first.summary["settings"].items() if k not in SHARD_KEYS}
    settings = {**base, "shard": None, "shards": count}
    max_rate = float(settings.get("max_failure_rate") or 0.0)
    summary: dict[str, Any] = {
        "settings": settings,
        "server": first.summary.get("server"),
        "figures": _summarize(result, None),
        "server_check": {
            "available": False,
            "unreadable_after": False,
            "note": "not checked across shards: each shard's scrape saw the others' traffic "
            "(see shards[].server_check)",
        },
        "failures": failures(records, max_rate),
        "load": {"started": result.started, "sending_s": result.sending_s,
                 "in_flight_at_stop": result.in_flight_at_stop},
        "shards": [
            {"directory": str(s.directory), "shard": list(s.shard),
             "server_check": s.summary.get("server_check"), "duration_s": s.duration}
            for s in sorted(shards, key=lambda s: s.shard)
        ],
        "warnings": [],
    }  # fmt: skip
    return BenchOutcome(summary, records)
