"""One benchmark run, end to end: warm up, scrape the server, load it, scrape again, compute
every figure, cross-check against the server, and judge against the expected acceptance.

A run is only as good as its requests: a verdict is never PASS when more requests failed than
``max_failure_rate`` allows or when the server's counters, readable before the run, could not be
read after it. ``BenchOutcome.exit_code`` is the one place the CLI's exit codes are decided.
"""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass, field
from typing import Any

from speclens.acceptance import ValidationError
from speclens.bench.client import LoadConfig, LoadGenerator, RequestRecord, RunResult
from speclens.bench.datasets import Prompt
from speclens.bench.figures import summarize
from speclens.bench.server import cross_check, read_counters, server_info
from speclens.bench.verify import DEFAULT_Z, verify


@dataclass
class Expectation:
    """What the run was supposed to hit (and where that value came from)."""

    acceptance_length: float
    num_spec_tokens: int | None = None
    source: dict[str, Any] = field(default_factory=dict)
    z: float = DEFAULT_Z


#: Exit codes shared by ``bench``, ``measure`` and ``demo`` (2 is a usage error, decided earlier).
EXIT_OK, EXIT_VERDICT_FAILED, EXIT_TOO_MANY_FAILURES, EXIT_INTERRUPTED = 0, 1, 3, 130

#: Distinct error messages kept in the summary (and printed).
FIRST_ERRORS = 5


@dataclass
class BenchOutcome:
    summary: dict[str, Any]
    records: list[RequestRecord]

    @property
    def exit_code(self) -> int:
        """130 interrupted, 3 too many failed requests, 1 a failed verdict, else 0."""
        if self.summary["figures"]["interrupted"]:
            return EXIT_INTERRUPTED
        if self.summary["failures"]["exceeded"]:
            return EXIT_TOO_MANY_FAILURES
        verdict = self.summary.get("verdict")
        if verdict is not None and not verdict["passed"]:
            return EXIT_VERDICT_FAILED
        return EXIT_OK


def failures(records: list[RequestRecord], max_rate: float) -> dict[str, Any]:
    """How many measured requests failed, against the allowed share, and the first few distinct
    error messages (one line each, cut to 200 characters) with how often each occurred."""
    measured = [r for r in records if not r.warmup]
    failed = [r for r in measured if not r.success]
    first: dict[str, int] = {}
    for record in failed:
        message = " ".join(str(record.error or "no response").split())[:200]
        if message in first or len(first) < FIRST_ERRORS:
            first[message] = first.get(message, 0) + 1
    rate = len(failed) / len(measured) if measured else 0.0
    return {
        "failed": len(failed),
        "sent": len(measured),
        "rate": rate,
        "max_rate": max_rate,
        "exceeded": rate > max_rate,
        "first_errors": [{"error": e, "count": n} for e, n in first.items()],
    }


async def run_bench(
    config: LoadConfig,
    prompts: list[Prompt],
    expectation: Expectation | None = None,
    slo: dict[str, float] | None = None,
    expect_spec: bool = False,
    on_done: Any = None,
    settings: dict[str, Any] | None = None,
    max_failure_rate: float = 0.0,
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
    why_before: str | None = "the scrape before the run did not happen"

    async def snapshot() -> None:
        nonlocal before, why_before
        before, why_before = await read_counters(config.url, config.api_key, config.model)

    try:
        result = await generator.run(before_measure=snapshot)
    finally:
        if handler:
            loop.remove_signal_handler(signal.SIGINT)
    after, why_after = await read_counters(config.url, config.api_key, config.model)
    figures = _summarize(result, slo)
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
        "server_check": cross_check(before, after, acceptance, why_before, why_after),
        "failures": failures(result.records, max_failure_rate),
        "load": {  # a duration-bound run awaits what was in flight when it stopped sending
            "sending_s": result.sending_s,
            "in_flight_at_stop": result.in_flight_at_stop,
        },
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
            try:
                summary["verdict"] = verify(
                    acceptance["histogram"], expectation.acceptance_length, k, expectation.z
                )
            except ValidationError as exc:  # the expected AL does not fit the K the run used
                summary["verdict"] = {
                    "passed": False,
                    "expected_acceptance_length": expectation.acceptance_length,
                    "reason": f"expected AL at K = {k}: " + "; ".join(str(p) for p in exc.problems),
                    "expected_distribution": {},
                }
        summary["verdict"]["expectation_source"] = expectation.source
        _veto(summary)
    return BenchOutcome(summary, result.records)


_REPORT_ERRORS = (TypeError, KeyError, ValueError, AttributeError, ArithmeticError)


def _summarize(result: RunResult, slo: dict[str, float] | None) -> dict[str, Any]:
    """Every figure; a record the figures cannot use is marked failed (with why) rather than
    aborting the report of every other request."""
    try:
        return summarize(result, slo)
    except _REPORT_ERRORS:
        for record in result.records:
            try:
                summarize(RunResult([record], result.started, result.duration), slo)
            except _REPORT_ERRORS as exc:
                record.error = (
                    f"the report could not use this response: {type(exc).__name__}: {exc}"
                )
                record.spec = None
        return summarize(result, slo)


def _veto(summary: dict[str, Any]) -> None:
    """Turn the verdict to FAIL, reason first, when the run cannot vouch for it."""
    verdict, fails, check = summary["verdict"], summary["failures"], summary["server_check"]
    vetoes = []
    if fails["exceeded"]:
        vetoes.append(
            f"{fails['failed']} of {fails['sent']} requests failed (max {fails['max_rate'] * 100:g}%)"
        )
    if check.get("unreadable_after"):
        vetoes.append(check["note"])
    if summary["figures"]["interrupted"]:
        vetoes.append("the run was interrupted")
    if vetoes:
        verdict["schedule_passed"] = verdict["passed"]
        verdict["passed"] = False
        verdict["reason"] = "; ".join([*vetoes, verdict["reason"]])
