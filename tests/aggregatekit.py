"""Aggregate-only run and sweep directories written by hand, in the shape ``speclens import``
writes (a published InferenceX point, a ``vllm bench serve`` result, or a prediction of one):
summary.json with ``"aggregate_only": true`` and the published figures, and no records.jsonl."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson


def summary(
    *,
    concurrency: int = 4,
    tpot_p50: float = 10.0,
    ttft_p50: float = 100.0,
    interactivity: float | None = None,
    total_per_gpu: float = 1000.0,
    method: str | None = None,
    k: int | None = None,
    hardware: str | None = "mi355x",
    engine: str = "sglang",
    precision: str = "fp8",
    isl: int = 1024,
    osl: int = 1024,
    tp: int = 8,
    gpus: int = 8,
    model: str = "deepseek-r1",
    executor: str | None = None,
    source: str = "inferencex",
    date: str = "2026-05-21",
) -> dict[str, Any]:
    """One published point. Interactivity defaults to 1000 / median TPOT; output throughput
    is half the total (equal input and output lengths)."""
    per_user = 1000.0 / tpot_p50 if interactivity is None else interactivity
    output_per_gpu = total_per_gpu * osl / (isl + osl)

    def dist(p50: float) -> dict[str, float]:
        return {"mean": p50 * 1.05, "p50": p50, "p99": p50 * 1.6}

    return {
        "aggregate_only": True,
        "settings": {
            "model": model, "hardware": hardware, "engine": engine,
            "image": f"lmsysorg/{engine}:v0.5.12", "precision": precision,
            "tensor_parallel": tp, "expert_parallel": 1, "dp_attention": False, "gpus": gpus,
            "disaggregated": False, "input_tokens": {"min": isl, "max": isl},
            "output_tokens": {"min": osl, "max": osl}, "max_tokens": osl,
            "concurrency": concurrency, "request_rate": None, "method": method,
            "num_spec_tokens": k, "date": date, "dataset": "random", "stream": True,
            "temperature": None, "executor": executor,
        },
        "server": {"engine": engine, "version": "v0.5.12", "model": model, "hardware": hardware},
        "provenance": {"source": source,
                       "run_url": "https://github.com/example/InferenceX/actions/runs/123",
                       "file": "benchmarks.json", "index": 12},
        "figures": {
            "aggregate_only": True,
            "latency_ms": {"ttft": dist(ttft_p50), "tpot": dist(tpot_p50),
                           "itl": dist(tpot_p50 * 0.98),
                           "e2e": dist(ttft_p50 + tpot_p50 * (osl - 1))},
            "throughput": {"output_tokens_per_s": output_per_gpu * gpus,
                           "total_tokens_per_s": total_per_gpu * gpus,
                           "output_tokens_per_s_per_gpu": output_per_gpu,
                           "total_tokens_per_s_per_gpu": total_per_gpu},
            "interactivity": {"p50": per_user, "mean": per_user * 1.02},
            "acceptance": None,
        },
    }  # fmt: skip


def write_point(path: Path, data: dict[str, Any], *, raw: bytes | None = None) -> Path:
    """A run directory holding summary.json only (``raw``: these bytes instead of ``data``)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "summary.json").write_bytes(raw if raw is not None else orjson.dumps(data))
    return path


def write_sweep(path: Path, points: list[dict[str, Any]]) -> Path:
    """A sweep directory of aggregate-only points (one per concurrency, ids ``c<C>``): sweep.json
    and sweep.csv written by runs/sweep.py's own ``Sweep``, each point recorded as finished."""
    from speclens.runs import sweep as sw
    from speclens.runs import sweep_points

    planned = []
    for point in points:
        concurrency = point["settings"]["concurrency"]
        pid = f"c{concurrency}"
        write_point(path / "points" / pid, point)
        settings = {"concurrency": concurrency, "request_rate": None,
                    "num_speculative_tokens": point["settings"]["num_spec_tokens"],
                    "acceptance_length": None}  # fmt: skip
        planned.append(sweep_points.Point(pid, None, settings, 0, f"points/{pid}"))
    axes = {"concurrency": [p["settings"]["concurrency"] for p in points]}
    state = sw.Sweep(path, "load", 1, axes, planned)
    for point in planned:
        state.record(point, 0)
    return path
