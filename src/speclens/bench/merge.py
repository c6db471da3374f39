"""``speclens bench merge``: one report from runs sharded across machines (``--shard i/n``).

A shard sends the arrivals whose index is i modulo n, at the times the whole run would, so the
shards of one run together send exactly its requests. The merge refuses what would not add up:
settings that differ in anything but the shard, shards missing, repeated or of different n, a
request index seen twice. Every figure is recomputed from the merged records, never averaged.
Times in a shard's records count from its own start; the merged duration is the longest shard's
(the shards are meant to run at the same time). Each shard's server check saw the other shards'
traffic, so the merge keeps them per shard and does not judge them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from speclens.acceptance import ValidationError
from speclens.acceptance.errors import Problem
from speclens.bench.client import RequestRecord, RunResult
from speclens.bench.report import record_from_row
from speclens.bench.run import BenchOutcome, _summarize, failures

#: Settings that may differ between the shards of one run.
SHARD_KEYS = frozenset({"shard", "part"})

#: The most of a summary.json read (records.jsonl is read line by line).
MAX_SUMMARY_BYTES = 64 * 2**20


@dataclass
class Shard:
    directory: Path
    summary: dict[str, Any]
    records: list[RequestRecord]

    @property
    def shard(self) -> tuple[int, int]:
        i, n = self.summary["settings"].get("shard") or (0, 1)
        return int(i), int(n)


def read_run(directory: Path) -> Shard:
    """A run's summary.json and records.jsonl; every problem found raises one ValidationError."""
    problems: list[Problem] = []
    summary_path, records_path = directory / "summary.json", directory / "records.jsonl"
    summary: dict[str, Any] = {}
    try:
        if summary_path.stat().st_size > MAX_SUMMARY_BYTES:
            problems.append(
                Problem(str(summary_path), "", f"larger than {MAX_SUMMARY_BYTES} bytes")
            )
        else:
            loaded = orjson.loads(summary_path.read_bytes())
            if not isinstance(loaded, dict) or not isinstance(loaded.get("settings"), dict):
                problems.append(
                    Problem(str(summary_path), "settings", "missing: not a bench summary")
                )
            else:
                summary = loaded
    except (OSError, orjson.JSONDecodeError) as exc:
        problems.append(Problem(str(summary_path), "", f"cannot be read: {exc}"))
    records: list[RequestRecord] = []
    try:
        with records_path.open("rb") as fh:
            for number, line in enumerate(fh, 1):
                try:
                    records.append(record_from_row(orjson.loads(line)))
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                    problems.append(
                        Problem(
                            str(records_path), f"line {number}", f"not a record row ({exc})"[:300]
                        )
                    )
    except OSError as exc:
        problems.append(Problem(str(records_path), "", f"cannot be read: {exc.strerror or exc}"))
    if problems:
        raise ValidationError(problems)
    return Shard(directory, summary, records)


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
    first = shards[0]
    base = {k: v for k, v in first.summary["settings"].items() if k not in SHARD_KEYS}
    for shard in shards[1:]:
        settings = {k: v for k, v in shard.summary["settings"].items() if k not in SHARD_KEYS}
        for key in sorted(set(base) | set(settings)):
            if base.get(key) != settings.get(key):
                problems.append(
                    Problem(
                        str(shard.directory / "summary.json"), f"settings.{key}",
                        f"{settings.get(key)!r:.80} differs from {base.get(key)!r:.80} in "
                        f"{first.directory}: not shards of one run",
                    )
                )  # fmt: skip
    count = first.shard[1]
    seen: dict[int, Path] = {}
    for shard in shards:
        i, n = shard.shard
        where = str(shard.directory / "summary.json")
        if n != count:
            problems.append(Problem(where, "settings.shard", f"of {n} shards, not {count}"))
        elif i in seen:
            problems.append(Problem(where, "settings.shard", f"shard {i} is also {seen[i]}"))
        seen[i] = shard.directory
    missing = sorted(set(range(count)) - set(seen))
    if missing:
        problems.append(Problem("command line", "DIR", f"shards {missing} of {count} are missing"))
    indices: dict[int, Path] = {}
    for shard in shards:
        for record in shard.records:
            if record.index in indices:
                problems.append(
                    Problem(str(shard.directory / "records.jsonl"), f"index {record.index}",
                            f"also in {indices[record.index]}")
                )  # fmt: skip
                break
            indices[record.index] = shard.directory
    if problems:
        raise ValidationError(problems)
    records = sorted((r for s in shards for r in s.records), key=lambda r: r.index)
    figures = [s.summary.get("figures") or {} for s in shards]
    loads = [s.summary.get("load") or {} for s in shards]
    result = RunResult(
        records,
        min(float(load.get("started") or 0.0) for load in loads),
        max(float(f.get("duration_s") or 0.0) for f in figures),
        any(bool(f.get("interrupted")) for f in figures),
        max(float(load.get("sending_s") or 0.0) for load in loads),
        sum(int(load.get("in_flight_at_stop") or 0) for load in loads),
    )
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
             "server_check": s.summary.get("server_check"),
             "duration_s": (s.summary.get("figures") or {}).get("duration_s")}
            for s in sorted(shards, key=lambda s: s.shard)
        ],
        "warnings": [],
    }  # fmt: skip
    return BenchOutcome(summary, records)
