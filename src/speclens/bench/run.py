"""One benchmark run, end to end: warm up, scrape the server, load it, scrape again, compute
every figure, cross-check against the server, and judge against the expected acceptance."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass, field
from typing import Any

from speclens.bench.client import LoadConfig, LoadGenerator, RequestRecord
from speclens.bench.datasets import Prompt
from speclens.bench.figures import summarize
from speclens.bench.server import cross_check, scrape, server_info
from speclens.bench.verify import DEFAULT_Z, verify


@dataclass
class Expectation:
    """What the run was supposed to hit (and where that value came from)."""

    acceptance_length: float
    num_spec_tokens: int | None = None
    source: dict[str, Any] = field(default_factory=dict)
    z: float = DEFAULT_Z


@dataclass
class BenchOutcome:
    summary: dict[str, Any]
    records: list[RequestRecord]


async def run_bench(
    config: LoadConfig,
    prompts: list[Prompt],
    expectation: Expectation | None = None,
    slo: dict[str, float] | None = None,
    expect_spec: bool = False,
    on_done: Any = None,
    settings: dict[str, Any] | None = None,
) -> BenchOutcome:
    generator = LoadGenerator(config, prompts)
    generator.on_done = on_done
    loop = asyncio.get_running_loop()
    try:  # Ctrl-C stops sending; in-flight requests get a grace period; nothing is lost
        loop.add_signal_handler(signal.SIGINT, generator.stop.set)
        handler = True
    except (NotImplementedError, RuntimeError):
        handler = False
    info = await server_info(config.url, config.api_key)
    before: dict[str, Any] | None = None

    async def snapshot() -> None:
        nonlocal before
        before = await scrape(config.url, config.api_key)

    try:
        result = await generator.run(before_measure=snapshot)
    finally:
        if handler:
            loop.remove_signal_handler(signal.SIGINT)
    after = await scrape(config.url, config.api_key)
    figures = summarize(result, slo)
    acceptance = figures["acceptance"]
    warnings = []
    if acceptance["requests_with_stats"] == 0 and (expect_spec or expectation is not None):
        warnings.append(
            "speculative decoding was expected, but no request carried per-request stats: is the "
            "server started with --per-request-spec-decode-stats (vLLM: "
            "--per-request-spec-decode-metrics), and does a proxy strip the field?"
        )
    detection = acceptance["detection"]
    for status in ("malformed", "conflict"):
        if detection.get(status):
            warnings.append(
                f"{detection[status]} responses had {status} speculative-decoding payloads (no record kept)"
            )
    if acceptance["inconsistent_requests"]:
        warnings.append(
            f"{len(acceptance['inconsistent_requests'])} requests report fewer steps and drafts than their completion_tokens need"
        )
    summary: dict[str, Any] = {
        "settings": settings or {},
        "server": info,
        "figures": figures,
        "server_check": cross_check(before, after, acceptance),
        "warnings": warnings,
    }
    if summary["server_check"].get("flags"):
        warnings.extend(summary["server_check"]["flags"])
    if expectation is not None:
        k = expectation.num_spec_tokens or acceptance["num_spec_tokens"]
        if k is None:
            summary["verdict"] = {
                "passed": False,
                "expected_acceptance_length": expectation.acceptance_length,
                "reason": "K is unknown: no request reported num_spec_tokens; pass --num-spec-tokens",
                "expected_distribution": {},
            }
        else:
            summary["verdict"] = verify(
                acceptance["histogram"], expectation.acceptance_length, k, expectation.z
            )
        summary["verdict"]["expectation_source"] = expectation.source
    return BenchOutcome(summary, result.records)
