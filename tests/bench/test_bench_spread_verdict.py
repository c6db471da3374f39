"""bench's side of a verdict against a stated spread: each evidence request's counts reach the
verdict, the spread comes from ``--expect-acceptance-spread`` or the profile's own, and the
exit code and the console say what the spread check found."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from speclens.acceptance import AcceptanceSpread
from speclens.acceptance.spread import LEVEL_NAMES, RequestDraw, implied_mean, request_uniform
from speclens.bench.run import (
    EXIT_INCONCLUSIVE,
    EXIT_OK,
    EXIT_VERDICT_FAILED,
    BenchOutcome,
    Expectation,
    evidence_requests,
    judge,
)
from speclens.cli import bench as bench_cli
from speclens.runs.request import RequestRecord

K = 4
QUANTILES = [1.6, 2.0, 2.2, 2.6, 3.1, 3.6, 4.0, 4.3, 4.9]
TARGET = implied_mean(QUANTILES)
SPREAD = AcceptanceSpread(
    num_spec_tokens=K, quantiles=dict(zip(LEVEL_NAMES, QUANTILES, strict=True)), requests=200
)


def record(i: int, histogram: dict[int, int], **kw: Any) -> RequestRecord:
    """A completed request whose stats are ``histogram`` (accepted drafts: steps)."""
    steps = sum(histogram.values())
    accepted = sum(j * n for j, n in histogram.items())
    spec = {
        "num_spec_tokens": K, "num_spec_steps": steps, "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": K * steps, "acceptance_histogram": {str(j): n for j, n in histogram.items()},
        "mean_acceptance_length": 1 + accepted / steps if steps else 1.0,
        "draft_acceptance_rate": accepted / (K * steps) if steps else 0.0,
    }  # fmt: skip
    fields: dict[str, Any] = {"index": i, "category": "c", "start": 0.0, "end": 1.0,
                              "completion_tokens": steps + accepted + 1, "spec": spec,
                              "spec_status": "ok", **kw}  # fmt: skip
    return RequestRecord(**fields)


def forced_records(n: int, spread: bool = True, tokens: int = 64) -> list[RequestRecord]:
    draw, rng = RequestDraw(QUANTILES, TARGET, K), random.Random(7)
    out = []
    for i in range(n):
        al = draw.al(request_uniform(7, str(i))) if spread else TARGET
        whole = min(int(al - 1.0 + 1e-9), K)
        frac = 0.0 if whole == K else al - 1.0 - whole
        histogram: dict[int, int] = {}
        emitted = 1
        while emitted < tokens:
            count = whole + (rng.random() < frac)
            histogram[count] = histogram.get(count, 0) + 1
            emitted += count + 1
        out.append(record(i, histogram))
    return out


def acceptance_of(records: list[RequestRecord]) -> dict[str, Any]:
    pooled: dict[str, int] = {}
    for r in records:
        assert r.spec is not None
        for j, n in r.spec["acceptance_histogram"].items():
            pooled[j] = pooled.get(j, 0) + n
    steps = sum(pooled.values())
    return {"num_spec_tokens": K, "counts_only_requests": 0, "counts_only_engines": [],
            "histogram_steps": steps, "histogram": pooled, "inconsistent_requests": [],
            "evidence_histogram": pooled, "evidence_steps": steps,
            "evidence_requests": len(records)}  # fmt: skip


def exit_code(verdict: dict[str, Any]) -> int:
    summary = {"figures": {"interrupted": False}, "failures": {"exceeded": False},
               "verdict": verdict}  # fmt: skip
    return BenchOutcome(summary, []).exit_code


def test_the_evidence_requests_are_the_verdicts_histogram_request_by_request() -> None:
    kept = record(0, {2: 5, 3: 5})
    records = [
        kept,
        record(1, {2: 3}, warmup=True),
        record(2, {2: 3}, error="boom"),
        record(3, {3: 40}, completion_tokens=10),  # more than its completion_tokens allow
        record(4, {}),  # no verify step
    ]
    counts_only = record(5, {2: 3})
    assert counts_only.spec is not None
    counts_only.spec.update(num_spec_steps=None, acceptance_histogram=None)
    assert evidence_requests([*records, counts_only]) == [(10, 25)]


def test_a_run_forced_with_the_spread_passes_and_one_without_it_fails() -> None:
    expectation = Expectation(TARGET, K, spread=SPREAD)
    right = forced_records(150)
    verdict = judge(acceptance_of(right), expectation, requests=evidence_requests(right))
    assert verdict["passed"] and verdict["spread"]["passed"], verdict["reason"]
    assert verdict["evidence_requests"] == 150 and exit_code(verdict) == EXIT_OK
    flat = forced_records(150, spread=False)
    verdict = judge(acceptance_of(flat), expectation, requests=evidence_requests(flat))
    assert not verdict["passed"] and not verdict["inconclusive"]
    assert exit_code(verdict) == EXIT_VERDICT_FAILED
    few = forced_records(12)
    verdict = judge(acceptance_of(few), expectation, requests=evidence_requests(few))
    assert verdict["inconclusive"] and exit_code(verdict) == EXIT_INCONCLUSIVE


def test_a_spread_at_another_k_than_the_run_fails_naming_the_field() -> None:
    records = forced_records(40)
    spread = SPREAD.model_copy(update={"num_spec_tokens": 5})
    verdict = judge(acceptance_of(records), Expectation(TARGET, spread=spread),
                    requests=evidence_requests(records))  # fmt: skip
    assert not verdict["passed"] and exit_code(verdict) == EXIT_VERDICT_FAILED
    assert verdict["reason"].startswith("expected AL at K = 4: spread.num_spec_tokens: is 5")


def options(**changes: Any) -> bench_cli.BenchOptions:
    flags: dict[str, Any] = dict(
        url=["http://127.0.0.1:9"], routing=bench_cli.RoutingChoice.round_robin, workers=1,
        shard=None, api_key=None, model="m", endpoint=bench_cli.EndpointChoice.completions,
        backend=bench_cli.BackendChoice.openai, dataset="random", dataset_path=None, category=[],
        input_len=8, num_requests=6, duration=None, concurrency=None, request_rate=None,
        burstiness=1.0, warmup=0, max_tokens=8, ignore_eos=False, temperature=0.0, seed=0,
        stream=True, slo=None, expect_acceptance_length=None, expect_profile=False, method=None,
        num_spec_tokens=None, thinking=None, registry=[], output_dir=None, timeout=10.0,
        max_failure_rate=0.0,
    )  # fmt: skip
    return bench_cli.BenchOptions(**{**flags, **changes})


def test_the_command_lines_spread_reaches_the_expectation(tmp_path: Path) -> None:
    path = tmp_path / "spread.yaml"
    quantiles = ", ".join(f"{k}: {v}" for k, v in SPREAD.quantiles.items())
    path.write_text(f"num_spec_tokens: 4\nrequests: 200\nquantiles: {{{quantiles}}}\n")
    stated = options(expect_acceptance_length=3.1, expect_acceptance_spread=path,
                     num_spec_tokens=4).checked()  # fmt: skip
    expectation = stated.expectation()
    assert expectation is not None and expectation.spread is not None
    assert expectation.spread.values == QUANTILES
    assert expectation.source["spread"]["file"] == str(path)
    plain = options(expect_acceptance_length=3.1).checked().expectation()
    assert plain is not None and plain.spread is None
    assert plain.source == {"cli": "--expect-acceptance-length"}


def test_a_profiles_spread_reaches_the_expectation(tmp_path: Path) -> None:
    quantiles = "{" + ", ".join(f"{k}: {v}" for k, v in SPREAD.quantiles.items()) + "}"
    (tmp_path / "measured.yaml").write_text(
        "kind: AcceptanceProfileSet\nname: measured\nprofiles:\n"
        "  - {model: m, speculative_method: ngram, num_spec_tokens: 4, thinking: 'off',\n"
        f"     category: all, acceptance_length: {TARGET}, method: assumed, rationale: test,\n"
        f"     spread: {{num_spec_tokens: 4, requests: 200, quantiles: {quantiles}}}}}\n"
    )
    chosen = options(expect_profile=True, method="ngram", num_spec_tokens=4, thinking="off",
                     category=["all"], registry=[tmp_path])  # fmt: skip
    expectation = chosen.expectation()
    assert expectation is not None and expectation.spread is not None
    assert expectation.spread.values == QUANTILES
    assert expectation.acceptance_length == pytest.approx(TARGET)


def test_the_console_prints_the_spread_checks_line(monkeypatch: pytest.MonkeyPatch) -> None:
    records = forced_records(150)
    verdict = judge(acceptance_of(records), Expectation(TARGET, K, spread=SPREAD),
                    requests=evidence_requests(records))  # fmt: skip
    console = Console(record=True, width=400)
    monkeypatch.setattr(bench_cli, "out_console", console)
    monkeypatch.setattr("speclens.runs.report.print_summary", lambda *a: None)
    outcome = BenchOutcome({"figures": {"interrupted": False}, "failures": {"exceeded": False},
                            "verdict": verdict}, [])  # fmt: skip
    bench_cli.report(outcome, None)
    text = console.export_text()
    assert text.startswith("spread check PASS: chi-square goodness of fit")
    assert "150 requests" in text and "detects total variation" in text
