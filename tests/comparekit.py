"""Run and sweep directories written by hand for the compare tests: records.jsonl rows in bench's
schema (they pass ``row_problems``) and a summary.json with the fields compare and points read,
drawn from a seeded generator so every test is deterministic."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from speclens.runs.compare_inputs import prompts_sha256

DIGEST = prompts_sha256([("random", 64, "hello world")])


def spec(histogram: dict[int, int], k: int) -> dict[str, Any]:
    steps = sum(histogram.values())
    accepted = sum(j * n for j, n in histogram.items())
    return {
        "engine": "vllm", "mean_acceptance_length": 1 + accepted / steps,
        "draft_acceptance_rate": accepted / (k * steps), "acceptance_histogram": histogram,
        "num_accepted_draft_tokens": accepted, "num_draft_tokens": k * steps,
        "num_spec_steps": steps, "num_spec_tokens": k, "num_decode_steps": steps,
        "completion_tokens": None, "per_step_accepted": None, "per_step_drafted": None,
        "draft_unit": "tokens", "acceptance_histogram_by_draft_length": None,
    }  # fmt: skip


def row(index: int, *, prompt_tokens: int, completion_tokens: int, tpot_s: float,
        histogram: dict[int, int] | None, k: int, category: str = "random") -> dict[str, Any]:  # fmt: skip
    ttft = 0.02
    latency = ttft + tpot_s * (completion_tokens - 1)
    return {
        "index": index, "category": category, "warmup": False, "replica": None,
        "success": True, "status": 200, "error": None, "scheduled_s": None,
        "start_s": 0.01 * index, "ttft_s": ttft, "latency_s": latency, "tpot_s": tpot_s,
        "itl_runs_s": [[tpot_s, completion_tokens - 1]], "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens, "finish_reason": "length",
        "unparsable_events": 0, "anomalies": [],
        "spec_decode_acceptance": spec(histogram, k) if histogram else None,
        "spec_decode_choices": None, "spec_decode_status": "ok" if histogram else "absent",
        "spec_decode_adapter": "vllm-root-metrics" if histogram else None,
        "spec_decode_message": None, "raw": [],
    }  # fmt: skip


def write_run(
    path: Path,
    *,
    seed: int = 0,
    requests: int = 24,
    k: int = 7,
    rates: tuple[float, ...] = (1.0, 1.0, 0.78),
    forced: bool = True,
    speed: float = 1.0,
    concurrency: int | None = 4,
    model: str = "dummy",
    max_tokens: int = 64,
    prompts: str | None = DIGEST,
    prompt_tokens: tuple[int, int] = (290, 300),
    completion_tokens: int | None = None,
    steps_per_request: int = 17,
) -> Path:
    """One run directory. ``rates`` are the per-position acceptance rates of the steps drawn
    (the forced schedule's shape), ``speed`` scales throughput (TPOT / speed); TPOT grows
    with concurrency, so a sweep's points trace a Pareto curve."""
    rng = np.random.default_rng(seed)
    load = 1 + 0.25 * ((concurrency or 1) - 1)  # a batch of more sequences steps slower
    rows = []
    for i in range(requests):
        accepted = Counter(_accepted(rng, rates) for _ in range(steps_per_request))
        rows.append(row(
            i, prompt_tokens=int(rng.integers(*prompt_tokens)),
            completion_tokens=completion_tokens or max_tokens,
            tpot_s=float(0.004 * load / speed * rng.uniform(0.9, 1.1)), histogram=dict(accepted), k=k,
        ))  # fmt: skip
    duration = sum(r["latency_s"] for r in rows) / (concurrency or 1)
    tokens = sum(r["completion_tokens"] for r in rows)
    summary = {
        "settings": {"url": "http://127.0.0.1:1", "model": model, "concurrency": concurrency,
                     "request_rate": None, "max_tokens": max_tokens, "ignore_eos": True,
                     "temperature": 0.0, "dataset": "random", "prompts_sha256": prompts},
        "server": {"engine": "speclens", "model": model, "acceptance": {
            "method": "draft_model", "num_speculative_tokens": k, "forced": forced,
            "acceptance_length": 1 + sum(rates) if forced else None}},
        "figures": {"duration_s": duration, "interrupted": False,
                    "throughput": {"output_tokens_per_s": tokens / duration}},
    }  # fmt: skip
    path.mkdir(parents=True, exist_ok=True)
    (path / "summary.json").write_bytes(orjson.dumps(summary))
    (path / "records.jsonl").write_bytes(
        b"".join(orjson.dumps(r, option=orjson.OPT_NON_STR_KEYS) + b"\n" for r in rows)
    )
    return path


def _accepted(rng: np.random.Generator, rates: tuple[float, ...]) -> int:
    """Accepted drafts of one step: position j accepted with rate j given all before it were."""
    n = 0
    for r in rates:
        if rng.random() >= r:
            break
        n += 1
    return n


def write_sweep(path: Path, points: list[tuple[int, int, dict[str, Any]]]) -> Path:
    """A sweep directory: (concurrency, round, write_run keywords) per point."""
    entries = []
    for concurrency, rnd, options in points:
        pid = f"c{concurrency}-r{rnd}"
        write_run(path / "points" / pid, concurrency=concurrency, **options)
        entries.append({
            "id": pid, "engine": None, "round": rnd, "dir": f"points/{pid}", "status": "ok",
            "exit_code": 0, "error": None,
            "settings": {"concurrency": concurrency, "request_rate": None,
                         "num_speculative_tokens": None, "acceptance_length": None},
        })  # fmt: skip
    sweep = {"schema": "speclens.sweep/1", "kind": "load", "rounds": 2,
             "axes": {"concurrency": sorted({c for c, _, _ in points})}, "points": entries,
             "stats": []}  # fmt: skip
    (path / "sweep.json").write_bytes(orjson.dumps(sweep))
    return path


def timed_row(
    index: int,
    *,
    latency_s: float | None,
    ttft_s: float | None,
    tpot_s: float | None,
    itl_runs_s: list[list[float]],
    completion_tokens: int = 64,
    success: bool = True,
) -> dict[str, Any]:
    """A request with the timings given (no acceptance record): for checks that need known
    per-request values. A failed one has an error and no times."""
    out = row(index, prompt_tokens=300, completion_tokens=completion_tokens, tpot_s=0.01,
              histogram=None, k=0)  # fmt: skip
    out.update(latency_s=latency_s, ttft_s=ttft_s, tpot_s=tpot_s, itl_runs_s=itl_runs_s)
    if not success:
        out.update(success=False, status=500, error="server error", latency_s=None,
                   ttft_s=None, tpot_s=None, itl_runs_s=[], completion_tokens=None,
                   finish_reason=None)  # fmt: skip
    return out


def write_rows(path: Path, rows: list[dict[str, Any]], *, duration_s: float) -> Path:
    """A run directory holding ``rows`` as given (their order kept), natural acceptance and no K;
    its summary's own throughput is a decoy (999) that compare must not read."""
    summary = {
        "settings": {"url": "http://127.0.0.1:1", "model": "dummy", "concurrency": 4,
                     "request_rate": None, "max_tokens": 64, "ignore_eos": True,
                     "temperature": 0.0, "dataset": "random", "prompts_sha256": DIGEST},
        "server": {"engine": "speclens", "model": "dummy", "acceptance": None},
        "figures": {"duration_s": duration_s, "interrupted": False,
                    "throughput": {"output_tokens_per_s": 999.0}},
    }  # fmt: skip
    path.mkdir(parents=True, exist_ok=True)
    (path / "summary.json").write_bytes(orjson.dumps(summary))
    (path / "records.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path
