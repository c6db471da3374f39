"""Sweep directories over K and concurrency for the compare tests: every point a run of
``comparekit.write_run`` (the same requests), one round a point."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from comparekit import write_run

CONCURRENCY = (1, 2, 4, 8)


def k_sweep(path: Path, ks: dict[int, float], *, prompts: str | None = "same") -> Path:
    """A sweep over K (value: the K's speed) and concurrency, one round a point, every point a
    run of the same requests (``prompts`` None: runs that record no prompts digest, as the
    simulator's did)."""
    extra: dict[str, Any] = {} if prompts == "same" else {"prompts": prompts}
    entries = []
    for k, speed in ks.items():
        for c in CONCURRENCY:
            pid = f"k{k}-c{c}-r0"
            write_run(path / "points" / pid, concurrency=c, k=k, speed=speed, requests=16,
                      rates=(0.8,) * k, **extra)  # fmt: skip
            entries.append({
                "id": pid, "engine": None, "round": 0, "dir": f"points/{pid}", "status": "ok",
                "exit_code": 0, "error": None,
                "settings": {"concurrency": c, "request_rate": None,
                             "num_speculative_tokens": k, "acceptance_length": None},
            })  # fmt: skip
    sweep = {"schema": "speclens.sweep/1", "kind": "server", "rounds": 1,
             "axes": {"num_speculative_tokens": list(ks), "concurrency": list(CONCURRENCY)},
             "points": entries, "stats": []}  # fmt: skip
    (path / "sweep.json").write_bytes(orjson.dumps(sweep))
    return path


def load_sweep(path: Path, c_speed: float) -> Path:
    """A sweep over concurrency only (K 3), throughput scaled by ``c_speed``."""
    return k_sweep(path, {3: c_speed})
