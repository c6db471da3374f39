"""A sweep: a grid of runs, each an ordinary run directory under ``DIR/points/<id>``, with
``DIR/sweep.json`` (schema ``speclens.sweep/1``) and ``DIR/sweep.csv`` rewritten after every
point, so an interrupted sweep keeps every point it finished.

Load axes (concurrency, request rate) sweep one running server; server axes come from a sweep
file (``runs.sweep_file``), its grid of points is ``runs.sweep_points``, and its servers are
started and stopped by ``runs.sweep_server``. This module never imports bench, sim, engine or
server: the caller passes the function that runs one point.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

from speclens.runs.points import FIGURES, PointError, RoundSummary, combine, summarize
from speclens.runs.sweep_points import Point

SCHEMA = "speclens.sweep/1"
#: Exit codes from the worst down: a sweep exits with its worst point's (``exit_code``).
SEVERITY = (130, 2, 3, 1, 4, 0)
EXIT_RUN_FAILED = 3  # a point whose server did not start or died


# ------------------------------------------------------------------------ the sweep files
def exit_code(codes: Sequence[int | None]) -> int:
    """The worst point's code: 130 interrupted, 2 usage, 3 a run failed, 1 a failed verdict,
    4 inconclusive, 0 ok (any other code ranks with 3)."""
    seen = [c if c in SEVERITY else EXIT_RUN_FAILED for c in codes if c is not None]
    return min(seen, key=SEVERITY.index) if seen else 0


def status_of(code: int) -> str:
    return {0: "ok", 130: "interrupted"}.get(code, "failed")


@dataclass
class Sweep:
    """The sweep directory as it fills: ``record`` after each point rewrites sweep.json and
    sweep.csv (atomically: a reader never sees half a file).

    Only points that finished ok have figures, count in ``rounds_ok`` and feed ``stats``: a
    failed verdict, too many failed requests, a server that died after its point, a cut point
    leave their row in sweep.csv without figures. ``record`` reads a point's run once (one
    bootstrap for its own figures) and recomputes only its own setting's statistics, from the
    rounds' kept estimates: N points cost N reads and N bootstraps, not N(N+1)/2."""

    root: Path
    kind: Literal["load", "server"]
    rounds: int
    axes: dict[str, list[Any]]
    points: list[Point] = field(default_factory=list)
    seed: int = 0
    _summaries: dict[str, RoundSummary] = field(default_factory=dict, init=False, repr=False)
    _stats: dict[str, dict[str, Any]] = field(default_factory=dict, init=False, repr=False)

    @staticmethod
    def _key(point: Point) -> str:
        """The point's setting (engine and settings) as text: its statistics' key."""
        return orjson.dumps([point.engine, point.settings]).decode()

    def record(self, point: Point, code: int, error: str | None = None) -> None:
        """The point's outcome (again, when a point that finished ok turns out failed: its
        server died after it), its setting's statistics, and both files rewritten."""
        point.exit_code, point.status, point.error = code, status_of(code), error
        point.figures = None
        self._summaries.pop(point.id, None)
        if code == 0:
            try:
                summary = summarize(self.root / point.dir, self.seed)
            except PointError as exc:
                point.status, point.error = "failed", str(exc)
            else:
                self._summaries[point.id] = summary
                point.figures = summary.figures
        self._restat(self._key(point))
        self.write()

    def ran(self) -> list[Point]:
        """The points that ran or were cut (a point not reached is in neither file)."""
        return [p for p in self.points if p.status != "pending"]

    def _restat(self, key: str) -> None:
        members = [p for p in self.ran() if self._key(p) == key]
        if not members:
            self._stats.pop(key, None)
            return
        ok = [self._summaries[p.id] for p in members if p.status == "ok" and p.id in self._summaries]  # fmt: skip
        self._stats[key] = {
            "engine": members[0].engine, "settings": members[0].settings, "rounds_ok": len(ok),
            "figures": {k: v.to_json() for k, v in combine(ok).items()},
        }  # fmt: skip

    def stats(self) -> list[dict[str, Any]]:
        """Per setting (engine and settings, in the order the points ran): its rounds that
        finished ok and their figures."""
        keys = list(dict.fromkeys(self._key(p) for p in self.ran()))
        for key in keys:
            if key not in self._stats:
                self._restat(key)
        return [self._stats[key] for key in keys]

    def document(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "kind": self.kind, "rounds": self.rounds, "axes": self.axes,
            "points": [p.to_json() for p in self.ran()], "stats": self.stats(),
        }  # fmt: skip

    def write(self) -> list[Path]:
        self.root.mkdir(parents=True, exist_ok=True)
        data = orjson.dumps(self.document(), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
        return [_replace(self.root / "sweep.json", data), _replace(self.root / "sweep.csv", self.csv())]  # fmt: skip

    def csv(self) -> bytes:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        head = ["id", "engine", "concurrency", "request_rate", "num_speculative_tokens",
                "acceptance_length", "round", "status", "exit_code"]  # fmt: skip
        writer.writerow(head + [f"{f}_{part}" for f in FIGURES for part in ("mean", "low", "high")])
        for p in self.ran():
            row = [p.id, p.engine or "", *(_cell(p.settings[k]) for k in head[2:6]), p.round,
                   p.status, _cell(p.exit_code)]  # fmt: skip
            shown = p.figures if p.status == "ok" else None
            for name in FIGURES:
                iv = shown.get(name) if shown else None
                row += [_cell(v) for v in ((iv.mean, iv.low, iv.high) if iv else (None,) * 3)]
            writer.writerow(row)
        return out.getvalue().encode("utf-8")


def _cell(value: Any) -> Any:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return value


def _replace(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file and a rename (a symbolic link planted
    at ``path`` is replaced, never written through)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)
    return path
