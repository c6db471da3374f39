"""A sweep's grid: the server settings (engine, K, AL) crossed with the load axis (concurrency
or request rate) and the rounds, each point a run directory ``points/<id>``, and the bound on
how many points a sweep may have, checked from the axes' sizes before any point is planned.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from speclens.runs.stats import Interval
from speclens.runs.sweep_file import Engine

MAX_POINTS = 10_000


# ------------------------------------------------------------------------------ the grid
@dataclass(frozen=True)
class ServerSetting:
    """One server start: an engine at K and AL (None: not on an axis)."""

    engine: str | None
    k: int | None = None
    al: float | None = None


@dataclass
class Point:
    id: str
    engine: str | None
    settings: dict[str, Any]
    round: int
    dir: str
    status: str = "pending"
    exit_code: int | None = None
    error: str | None = None
    figures: dict[str, Interval] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "engine": self.engine, "settings": self.settings,
                "round": self.round, "dir": self.dir, "status": self.status,
                "exit_code": self.exit_code, "error": self.error}  # fmt: skip


def _num(value: float) -> str:
    return f"{value:g}"


def point_id(server: ServerSetting, load: tuple[str, float | None], rnd: int) -> str:
    parts = [server.engine] if server.engine else []
    if server.k is not None:
        parts.append(f"k{server.k}")
    if server.al is not None:
        parts.append(f"al{_num(server.al)}")
    axis, value = load
    if value is not None:
        parts.append(f"c{int(value)}" if axis == "concurrency" else f"rate{_num(value)}")
    parts.append(f"r{rnd}")
    return "-".join(parts)


def load_values(
    concurrency: Sequence[int] | None, rate: Sequence[float] | None
) -> list[tuple[str, float | None]]:
    """The load axis as (name, value) pairs; neither given: one point at bench's default."""
    if rate:
        return [("request_rate", float(r)) for r in rate]
    if concurrency:
        return [("concurrency", int(c)) for c in concurrency]
    return [("concurrency", None)]


def _load_count(concurrency: Sequence[int] | None, rate: Sequence[float] | None) -> int:
    return len(rate or concurrency or [None])


def engine_points(
    engine: Engine, concurrency: Sequence[int] | None, rate: Sequence[float] | None, rounds: int
) -> tuple[int, str]:
    """How many points an engine's axes make (K x AL x load x rounds, counted, not listed),
    and the product as text."""
    axes = engine.axes
    ks = len(axes.num_speculative_tokens or [None])
    als = 1 if axes.acceptance_profile is not None else len(axes.acceptance_length or [None])
    own = axes.concurrency is not None or axes.request_rate is not None
    loads = _load_count(axes.concurrency, axes.request_rate) if own else _load_count(concurrency, rate)  # fmt: skip
    text = f"{ks} K x {als} AL x {loads} loads x {rounds} rounds"
    return ks * als * loads * rounds, text


def points_problem(
    engines: Sequence[Engine] | None, concurrency: Sequence[int] | None,
    rate: Sequence[float] | None, rounds: int,
) -> str | None:  # fmt: skip
    """One line when the sweep would run more than ``MAX_POINTS`` points, from the axes' sizes
    alone (before any point is planned): ``<file>: axes: ...`` or ``command line: ...``."""
    if not engines:
        total = _load_count(concurrency, rate) * rounds
        if total <= MAX_POINTS:
            return None
        flag = "--request-rate" if rate else "--concurrency"
        return (f"command line: {flag}: {total:,} points ({_load_count(concurrency, rate)} loads "
                f"x {rounds} rounds): expected at most {MAX_POINTS:,}")  # fmt: skip
    counts = [engine_points(e, concurrency, rate, rounds) for e in engines]
    total = sum(n for n, _ in counts)
    if total <= MAX_POINTS:
        return None
    largest = max(range(len(engines)), key=lambda i: counts[i][0])
    engine = engines[largest]
    return (f"{engine.file}: axes: {total:,} points (engines[{largest}] {engine.spec.name}: "
            f"{counts[largest][1]}): expected at most {MAX_POINTS:,}")  # fmt: skip


def points_for(
    server: ServerSetting, loads: list[tuple[str, float | None]], rounds: int
) -> list[Point]:
    out = []
    for (axis, value), rnd in itertools.product(loads, range(rounds)):
        pid = point_id(server, (axis, value), rnd)
        settings = {
            "concurrency": int(value) if axis == "concurrency" and value is not None else None,
            "request_rate": value if axis == "request_rate" else None,
            "num_speculative_tokens": server.k,
            "acceptance_length": server.al,
        }
        out.append(Point(pid, server.engine, settings, rnd, f"points/{pid}"))
    return out
