"""Synthetic requests and bench run directories for the spread-between-requests tests: each
request's acceptance histogram drawn from its own acceptance rate (seeded), so requests differ
as natural ones do, and a run directory in bench's schema (records.jsonl rows from
``report.record_row``, summary.json from ``figures.summarize``) that the run readers accept."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson

from speclens.runs.figures import summarize
from speclens.runs.record import SpecDecodeAcceptanceRecord
from speclens.runs.report import record_row
from speclens.runs.request import RequestRecord, RunResult


def spec(
    histogram: dict[int, int] | None, k: int, steps: int = 0, accepted: int = 0
) -> dict[str, Any]:
    """A validated acceptance record of ``histogram`` at K (None: counts without a histogram,
    ``steps`` verify steps and ``accepted`` drafts)."""
    if histogram is not None:
        steps = sum(histogram.values())
        accepted = sum(j * n for j, n in histogram.items())
    record = SpecDecodeAcceptanceRecord(
        engine="vllm", mean_acceptance_length=1 + accepted / steps if steps else 1.0,
        draft_acceptance_rate=accepted / (k * steps) if steps else 0.0,
        acceptance_histogram=histogram, num_accepted_draft_tokens=accepted,
        num_draft_tokens=k * steps, num_spec_steps=steps, num_spec_tokens=k, draft_unit="tokens",
    )  # fmt: skip
    return record.model_dump()


def counts_only(drafted: int, accepted: int) -> dict[str, Any]:
    """A llama.cpp-style record: drafted and accepted tokens, no steps."""
    return SpecDecodeAcceptanceRecord(
        engine="llama.cpp", mean_acceptance_length=None, draft_acceptance_rate=accepted / drafted,
        acceptance_histogram=None, num_accepted_draft_tokens=accepted, num_draft_tokens=drafted,
        num_spec_steps=None, draft_unit="tokens",
    ).model_dump()  # fmt: skip


def drawn_histogram(rng: random.Random, rate: float, steps: int, k: int) -> dict[int, int]:
    """``steps`` verify steps, each accepting drafts one by one at ``rate`` up to K."""
    out: dict[int, int] = {}
    for _ in range(steps):
        j = 0
        while j < k and rng.random() < rate:
            j += 1
        out[j] = out.get(j, 0) + 1
    return out


def record(index: int, category: str, acceptance: dict[str, Any] | None) -> RequestRecord:
    """A finished request carrying ``acceptance`` (None: no stats)."""
    tokens = 1
    if acceptance is not None:
        tokens += (acceptance["num_spec_steps"] or 0) + acceptance["num_accepted_draft_tokens"]
    return RequestRecord(
        index=index, category=category, start=0.01 * index, end=0.01 * index + 1.0, ttft=0.05,
        itl_runs=[(0.01, max(tokens - 1, 1))], prompt_tokens=32, completion_tokens=tokens,
        finish_reason="length", status=200, spec=acceptance,
        spec_status="ok" if acceptance is not None else "absent",
        spec_adapter="vllm-root-metrics" if acceptance is not None else None,
    )  # fmt: skip


def natural_requests(
    categories: dict[str, int], k: int = 3, seed: int = 0, steps: tuple[int, int] = (4, 40)
) -> list[RequestRecord]:
    """``categories[c]`` requests of each category, each with its own acceptance rate (spread
    over (0.15, 0.9)) and number of verify steps, so requests differ in AL and weight."""
    rng = random.Random(seed)
    out: list[RequestRecord] = []
    for category, n in categories.items():
        for _ in range(n):
            rate = rng.uniform(0.15, 0.9)
            hist = drawn_histogram(rng, rate, rng.randint(*steps), k)
            out.append(record(len(out), category, spec(hist, k)))
    return out


def write_run(
    path: Path, records: list[RequestRecord], *, k: int | None = 3, forced: float | None = None,
    method: str = "ngram", hardware: str | None = "cpu-x86_64", **summary: Any,
) -> Path:  # fmt: skip
    """A bench run directory of ``records`` against a speclens server (natural acceptance, or
    forced at AL ``forced``); ``summary`` keys replace the summary's own."""
    path.mkdir(parents=True, exist_ok=True)
    with (path / "records.jsonl").open("wb") as fh:
        for r in records:
            fh.write(orjson.dumps(record_row(r), option=orjson.OPT_NON_STR_KEYS) + b"\n")
    acceptance: dict[str, Any] = {"method": method, "num_speculative_tokens": k,
                                  "forced": forced is not None}  # fmt: skip
    if forced is not None:
        acceptance["acceptance_length"] = forced
    server = {"version": "0.9", "engine": "speclens", "model": "dummy", "acceptance": acceptance}
    if hardware:
        server["hardware"] = hardware
    document: dict[str, Any] = {
        "settings": {"model": "dummy", "url": "http://127.0.0.1:8000", "endpoint": "chat",
                     "max_tokens": 64, "ignore_eos": True, "temperature": 0.0,
                     "dataset": "jsonl", "dataset_path": "questions.jsonl"},
        "server": server, "engine": "speclens",
        "figures": summarize(RunResult(records, 0.0, 2.0)),
        "failures": {"sent": len(records), "failed": 0, "max_rate": 0.01, "exceeded": False},
        **summary,
    }  # fmt: skip
    (path / "summary.json").write_bytes(orjson.dumps(document, option=orjson.OPT_NON_STR_KEYS))
    return path
