"""One benchmark run, end to end: warm up, scrape the server, load it, scrape again, compute
every figure, cross-check against the server, and judge against the expected acceptance.

A run is only as good as its requests: a verdict is never PASS when more requests failed than
``max_failure_rate`` allows or when the server's counters, readable before the run, could not be
read after it. ``BenchOutcome.exit_code`` is the one place the CLI's exit codes are decided.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from speclens.acceptance import (
    MAX_NUM_SPEC_TOKENS,
    AcceptanceSpread,
    ValidationError,
    acceptance_length,
)
from speclens.bench.client import LoadConfig, LoadGenerator, RequestRecord, RunResult
from speclens.bench.datasets import Prompt
from speclens.bench.server import cross_check, read_counters, served_speculation, server_info
from speclens.bench.workers import WorkerPool
from speclens.runs.figures import consistency_problem, summarize
from speclens.runs.verify import DEFAULT_Z, verify


@dataclass
class Expectation:
    """What the run was supposed to hit (and where that value came from)."""

    acceptance_length: float
    num_spec_tokens: int | None = None
    source: dict[str, Any] = field(default_factory=dict)
    z: float = DEFAULT_Z
    #: The per-request AL's spread the run was forced with (None: every request at the mean).
    spread: AcceptanceSpread | None = None


#: Exit codes shared by ``bench``, ``measure`` and ``demo`` (2 is a usage error, decided earlier).
EXIT_OK, EXIT_VERDICT_FAILED, EXIT_TOO_MANY_FAILURES, EXIT_INTERRUPTED = 0, 1, 3, 130
EXIT_INCONCLUSIVE = 4

#: Distinct error messages kept in the summary (and printed).
FIRST_ERRORS = 5


@dataclass
class BenchOutcome:
    summary: dict[str, Any]
    records: list[RequestRecord]

    @property
    def exit_code(self) -> int:
        """130 interrupted, 3 too many failed requests, 4 a verdict without the evidence to
        judge (unless a veto made it a FAIL), 1 a failed verdict, else 0."""
        if self.summary["figures"]["interrupted"]:
            return EXIT_INTERRUPTED
        if self.summary["failures"]["exceeded"]:
            return EXIT_TOO_MANY_FAILURES
        verdict = self.summary.get("verdict")
        if verdict is not None and not verdict["passed"]:
            if verdict.get("inconclusive") and "schedule_passed" not in verdict:
                return EXIT_INCONCLUSIVE
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
    workers: int = 1,
) -> BenchOutcome:
    """One run; with ``workers`` > 1 the load comes from that many processes (``WorkerPool``),
    while the scrapes, the figures and the verdict stay here, once."""
    runner: LoadGenerator | WorkerPool
    if workers > 1:
        runner = WorkerPool(config, prompts, workers)
        stop = runner.stop
    else:
        runner = LoadGenerator(config, prompts)
        stop = runner.stop.set
    runner.on_done = on_done
    loop = asyncio.get_running_loop()
    try:  # Ctrl-C stops sending; in-flight requests get a grace period; nothing is lost
        loop.add_signal_handler(signal.SIGINT, stop)
        handler = True
    except (NotImplementedError, RuntimeError):
        handler = False
    replicas = config.replicas
    infos = [await server_info(url, config.api_key) for url in replicas]
    missing = (None, "the scrape before the run did not happen")
    before: list[tuple[dict[str, Any] | None, str | None]] = [missing] * len(replicas)

    async def snapshot() -> None:
        before[:] = [await read_counters(url, config.api_key, config.model) for url in replicas]

    try:
        result = await runner.run(before_measure=snapshot)
    finally:
        if handler:
            loop.remove_signal_handler(signal.SIGINT)
    after = [await read_counters(url, config.api_key, config.model) for url in replicas]
    figures = _summarize(result, slo)
    acceptance = figures["acceptance"]
    warnings = []
    completed = figures["requests"]["completed"]
    no_stats = completed > 0 and acceptance["requests_with_stats"] == 0
    engine = serving_engine(infos[0], config.backend, before[0])
    if no_stats and (expect_spec or expectation is not None):
        warnings.append(
            "speculative decoding was expected, but no request carried per-request stats: "
            f"{stats_hint(engine)}; or does a proxy strip the field?"
        )
    detection = acceptance["detection"]
    for status in ("malformed", "conflict"):
        if detection.get(status):
            warnings.append(
                f"{detection[status]} responses had {status} speculative-decoding payloads (no record kept)"
            )
    if acceptance["inconsistent_requests"]:
        warnings.append(
            f"{len(acceptance['inconsistent_requests'])} requests report more verify steps and "
            "accepted drafts than their completion_tokens allow: left out of the verdict's evidence"
        )
    summary: dict[str, Any] = {
        "settings": settings or {},
        "server": infos[0],
        "engine": engine,  # as far as the run could tell (``serving_engine``); None: unknown
        "figures": figures,
        "server_check": cross_check(
            before[0][0], after[0][0], acceptance, before[0][1], after[0][1]
        ),
        "failures": failures(result.records, max_failure_rate),
        "load": {  # a duration-bound run awaits what was in flight when it stopped sending
            "started": result.started,
            "sending_s": result.sending_s,
            "in_flight_at_stop": result.in_flight_at_stop,
        },
        "warnings": warnings,
    }
    if len(replicas) > 1:
        summary["replicas"] = per_replica(result, slo, replicas, infos, before, after)
        summary["server_check"] = combined_check(summary["replicas"])
    uncompared(summary["server_check"], acceptance, completed)
    if summary["server_check"].get("flags"):
        warnings.extend(summary["server_check"]["flags"])
    add_derivation(acceptance, summary["server_check"])
    if acceptance["draft_rate_refused"]:
        warnings.append(acceptance["draft_rate_refused"])
    if expectation is not None:
        server_k = served_k(infos[0], after[0][0])
        if no_stats:
            summary["verdict"] = no_stats_verdict(
                expectation, engine, summary["server_check"], server_k
            )
        else:
            evidence = evidence_requests(result.records)
            summary["verdict"] = judge(acceptance, expectation, server_k, evidence)
        summary["verdict"]["expectation_source"] = expectation.source
        _veto(summary)
    return BenchOutcome(summary, result.records)


def evidence_requests(records: Iterable[RequestRecord]) -> list[tuple[int, int]]:
    """Each request the verdict's histogram rests on, as (verify steps, accepted drafts) read
    from its own histogram: measured, completed, with a histogram and stats that fit its
    completion_tokens (``figures.acceptance``'s evidence), at least one verify step."""
    out = []
    for r in records:
        spec = r.spec
        if r.warmup or not r.success or spec is None or spec.get("num_spec_steps") is None:
            continue
        histogram = spec.get("acceptance_histogram")
        if histogram is None or consistency_problem(r) is not None:
            continue
        steps = sum(histogram.values())
        if steps:
            out.append((steps, sum(int(j) * n for j, n in histogram.items())))
    return out


def judge(
    acceptance: dict[str, Any],
    expectation: Expectation,
    server_k: tuple[int, str] | None = None,
    requests: Sequence[tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """The run's verdict against its expected AL: inconclusive (never PASS) when K is unknown or
    every request carried counts only, so there is no histogram to judge. K is the stated one,
    else the requests', else the server's own (``served_k``). Requests whose stats claim more
    tokens than their completion_tokens (``inconsistent_requests``) are no evidence: the verdict
    judges the other requests' histogram, and with none left it is inconclusive. With a stated
    spread, ``requests`` (``evidence_requests``) carries each evidence request's counts."""
    k = expectation.num_spec_tokens or acceptance["num_spec_tokens"]
    if k is None and server_k is not None:
        k = server_k[0]
    if k is None:
        return {
            "passed": False,
            "inconclusive": True,
            "expected_acceptance_length": expectation.acceptance_length,
            "reason": "inconclusive: K is unknown: no request reported num_spec_tokens and "
            "the server does not say it; pass --num-spec-tokens",
            "expected_distribution": {},
        }
    if acceptance["counts_only_requests"] and not acceptance["histogram_steps"]:
        return {
            "passed": False,
            "inconclusive": True,
            "expected_acceptance_length": expectation.acceptance_length,
            "reason": f"inconclusive: {acceptance['counts_only_requests']} requests carried "
            f"counts only ({', '.join(acceptance['counts_only_engines'])}): no histogram "
            "to judge",
            "expected_distribution": {},
        }
    left_out = len(acceptance["inconsistent_requests"])
    if left_out and not acceptance["evidence_steps"]:
        return {
            "passed": False,
            "inconclusive": True,
            "expected_acceptance_length": expectation.acceptance_length,
            "reason": f"inconclusive: {left_out} requests report more verify steps and "
            "accepted drafts than their completion_tokens allow; left out, they leave no "
            "verify step to judge",
            "expected_distribution": {},
            "verify_steps": 0,
            "evidence_requests": 0,
            "left_out_requests": left_out,
        }
    try:
        verdict = verify(
            acceptance["evidence_histogram"], expectation.acceptance_length, k, expectation.z,
            spread=expectation.spread, requests=requests,
        )  # fmt: skip
    except ValidationError as exc:  # the expected AL does not fit the K the run used
        return {
            "passed": False,
            "expected_acceptance_length": expectation.acceptance_length,
            "reason": f"expected AL at K = {k}: " + "; ".join(str(p) for p in exc.problems),
            "expected_distribution": {},
        }
    verdict["evidence_requests"] = acceptance["evidence_requests"]
    verdict["left_out_requests"] = left_out
    if left_out:
        verdict["reason"] += (
            f" ({left_out} requests whose stats exceed their completion_tokens left out)"
        )
    return verdict


def add_derivation(acceptance: dict[str, Any], check: dict[str, Any]) -> None:
    """Complete the per-engine "what could be derived" with AL from the server's counters, and
    say where the AL of counts-only requests comes from (``counts_only_al``)."""
    server_al = check.get("server_al") if check.get("available") else None
    for row in acceptance["derivable"].values():
        row["al_from_server_counters"] = "yes" if server_al is not None else "no"
    n = acceptance["counts_only_requests"]
    if n:
        engines = ", ".join(acceptance["counts_only_engines"])
        source = (
            f"AL from the server's counters: {server_al:.4f}"
            if server_al is not None
            else "AL not derivable (no server counters)"
        )
        acceptance["counts_only_al"] = (
            f"{n} requests carried counts only ({engines}): {source}; they are left out of the "
            "token-weighted AL and the histogram, and counted in the draft acceptance rate"
        )


#: Per engine: how to get per-request speculative-decoding stats out of it (docs/engines.md's table).
STATS_HINTS = {
    "speclens": "start `speclens serve` with --per-request-spec-decode-stats summary",
    "vllm": "start vLLM with --per-request-spec-decode-metrics summary "
    "--enable-per-request-metrics",
    "sglang": "SGLang sends them when asked (bench --backend sglang asks with "
    "return_spec_tokens_details) and only for requests that ran verify steps: is it started with "
    "--speculative-algorithm?",
    "llama.cpp": "llama-server reports timings.draft_n only for requests that drafted: start it "
    "with --spec-type draft-simple -md DRAFT.gguf or --spec-type ngram-simple",
    "tensorrt-llm": "trtllm-serve sends no per-request stats (the per-choice "
    "speculative_decoding field is a proposal upstream); its iteration stats, with "
    "enable_iter_perf_stats: true in --extra_llm_api_options, give the run's AL",
    "atom": "ATOM reports acceptance per run only (/debug/mtp_stats, atom:mtp_* on /metrics)",
}
#: An engine we cannot tell: the switches of the two that have one.
UNKNOWN_HINT = (
    "start the server with its per-request switch (vLLM: --per-request-spec-decode-metrics "
    "summary --enable-per-request-metrics; speclens serve: --per-request-spec-decode-stats "
    "summary; SGLang: bench --backend sglang)"
)


def serving_engine(
    info: dict[str, Any] | None, backend: str, scrape: tuple[dict[str, Any] | None, str | None]
) -> str | None:
    """The engine behind a URL, as far as the run saw it: ``/version``'s or ``/props``'s
    ``engine``, the backend bench spoke, the counters' source on ``/metrics``; None if unknown."""
    engine = info.get("engine") if isinstance(info, dict) else None
    if engine in ("speclens", "llama.cpp"):
        return str(engine)
    if backend in ("sglang", "llamacpp"):
        return "sglang" if backend == "sglang" else "llama.cpp"
    counters, why = scrape
    source = str(counters.get("source")) if counters else ""
    if why and "sglang:" in why:  # SGLang's /metrics has acceptance gauges only
        return "sglang"
    for prefix, name in (
        ("metrics:llama.cpp", "llama.cpp"),
        ("metrics:trtllm", "tensorrt-llm"),
        ("metrics:atom", "atom"),
        ("debug/mtp_stats", "atom"),
        ("metrics:vllm", "vllm"),
    ):
        if source.startswith(prefix):
            return name
    return None


def stats_hint(engine: str | None) -> str:
    """What turns per-request stats on for ``engine`` (``serving_engine``), one clause."""
    return STATS_HINTS.get(engine or "", UNKNOWN_HINT)


def served_k(
    info: dict[str, Any] | None, counters: dict[str, Any] | None
) -> tuple[int, str] | None:
    """K as the server states it, and where: ``/version``'s acceptance block (speclens), else the
    positions of vLLM's per-position counter on ``/metrics`` (one series per draft position,
    0..K-1, from the start); None when it says nothing."""
    k = served_speculation(info)["num_speculative_tokens"]
    if k is not None:
        return k, "the server's /version"
    k = counter_k(counters)
    if k is not None:
        return k, "the positions of the server's per-position counter on /metrics"
    return None


def counter_k(counters: dict[str, Any] | None) -> int | None:
    """K from vLLM's per-position counter: it is created for positions 0..K-1 at start-up
    (``vllm/v1/spec_decode/metrics.py``, ``SpecDecodingProm``), so a scrape before any traffic
    shows all K. Positions that are not exactly 0..K-1 prove nothing (None)."""
    positions = counters.get("accepted_per_position") if isinstance(counters, dict) else None
    source = str(counters.get("source")) if isinstance(counters, dict) else ""
    if not isinstance(positions, dict) or not positions or source != "metrics:vllm":
        return None
    width = max(positions) + 1
    return width if width == len(positions) and 1 <= width <= MAX_NUM_SPEC_TOKENS else None


def no_stats_verdict(
    expectation: Expectation,
    engine: str | None,
    check: dict[str, Any],
    server_k: tuple[int, str] | None,
) -> dict[str, Any]:
    """The verdict of a run whose completed requests carried no per-request stats: inconclusive,
    headed by that and by the engine's switch, with K as far as known and the server counters'
    AL as the fallback figure (not judged: a pooled AL has no histogram)."""
    k = expectation.num_spec_tokens
    k_source = "--num-spec-tokens" if k is not None else None
    if k is None and server_k is not None:
        k, k_source = server_k
    server_al = check.get("server_al") if check.get("available") else None
    if server_al is not None:
        drafts = check["server_delta"]["drafts"]
        fallback = (
            f"fallback: AL {server_al:.4f} from the server's counters ({check.get('source')}, "
            f"{drafts:g} verify steps), not judged"
        )
    else:
        fallback = "no fallback: the server's counters give no AL either"
    known = f"K {k} (from {k_source})" if k is not None else "K unknown"
    out: dict[str, Any] = {
        "passed": False,
        "inconclusive": True,
        "no_per_request_stats": True,
        "engine": engine,
        "expected_acceptance_length": expectation.acceptance_length,
        "num_spec_tokens": k,
        "num_spec_tokens_source": k_source,
        "server_acceptance_length": server_al,
        "reason": f"inconclusive: no request carried per-request speculative-decoding stats: "
        f"{stats_hint(engine)}; {fallback}; {known}",
        "expected_distribution": {},
        "verify_steps": 0,
        "evidence_requests": 0,
    }
    return out


def uncompared(check: dict[str, Any], acceptance: dict[str, Any], completed: int) -> None:
    """A server check with nothing on the client's side to compare: no request completed, or
    none carried per-request stats. Its counters cannot "agree" or name "traffic the client did
    not send"; the check says there is nothing to compare (``compared``: False) and keeps the
    server's AL as the fallback figure."""
    if not check.get("available") or (acceptance["requests_with_stats"] and completed):
        return
    if completed == 0:
        why = "no request completed: nothing to compare the server's counters with"
    else:
        why = "no request carried per-request stats: nothing to compare the server's counters with"
    server_al = check.get("server_al")
    delta = check.get("server_delta") or {}
    if server_al is not None and completed:
        why += (
            f"; AL from the server's counters (fallback): {server_al:.4f} over "
            f"{delta.get('drafts', 0):g} verify steps"
        )
    previous = check.get("note")
    check.update(
        flags=[],
        consistent=None,
        compared=False,
        note=why if not previous else f"{why}; {previous}",
    )


def per_replica(
    result: RunResult,
    slo: dict[str, float] | None,
    replicas: tuple[str, ...],
    infos: list[dict[str, Any] | None],
    before: list[tuple[dict[str, Any] | None, str | None]],
    after: list[tuple[dict[str, Any] | None, str | None]],
) -> dict[str, Any]:
    """Each replica's figures (its own records over the run's duration) and its own server check
    (its counters against the requests it served)."""
    out = {}
    for url, info, (b, why_b), (a, why_a) in zip(replicas, infos, before, after, strict=True):
        mine = [r for r in result.records if r.replica == url]
        figures = _summarize(replace(result, records=mine), slo)
        check = cross_check(b, a, figures["acceptance"], why_b, why_a)
        uncompared(check, figures["acceptance"], figures["requests"]["completed"])
        add_derivation(figures["acceptance"], check)
        out[url] = {
            "server": info,
            "figures": figures,
            "server_check": check,
        }
    return out


def combined_check(replicas: dict[str, Any]) -> dict[str, Any]:
    """The run's server check over several replicas: available when every replica's is, each
    flag and note prefixed with its replica's URL."""
    checks = {url: row["server_check"] for url, row in replicas.items()}
    flags = [f"{url}: {flag}" for url, c in checks.items() for flag in c.get("flags", [])]
    notes = [f"{url}: {c['note']}" for url, c in checks.items() if not c["available"]]
    out: dict[str, Any] = {
        "available": not notes,
        "unreadable_after": any(c["unreadable_after"] for c in checks.values()),
        "consistent": not notes and all(c.get("consistent") for c in checks.values()),
        "flags": flags,
        "source": ", ".join(
            sorted({str(c.get("source")) for c in checks.values() if c["available"]})
        ),
        "per_replica": "see replicas[URL].server_check",
    }
    if notes:
        out["note"] = "; ".join(notes)
    else:  # every replica's counters read: the run's AL from their summed deltas
        drafts = sum(c["server_delta"]["drafts"] for c in checks.values())
        accepted = sum(c["server_delta"]["accepted_tokens"] for c in checks.values())
        out["server_al"] = acceptance_length(accepted, drafts) if drafts else None
    return out


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
