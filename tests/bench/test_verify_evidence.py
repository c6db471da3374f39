"""A verification verdict names the evidence it rests on, and too little evidence is never PASS."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from speclens.acceptance import acceptance_length
from speclens.bench.run import (
    EXIT_INCONCLUSIVE,
    EXIT_VERDICT_FAILED,
    BenchOutcome,
    Expectation,
    judge,
)
from speclens.runs.report import print_verdict
from speclens.runs.verify import MIN_VERIFY_STEPS, verify


def test_one_verify_step_that_matches_is_inconclusive_not_pass() -> None:
    """AL 3 at K 3 accepts exactly 2 drafts a step: one such step matched the schedule, and
    was a PASS before."""
    verdict = verify({"2": 1}, 3.0, 3)
    assert not verdict["passed"] and verdict["inconclusive"]
    assert verdict["verify_steps"] == 1
    assert f"1 verify steps were reported, at least {MIN_VERIFY_STEPS}" in verdict["reason"]
    assert verify({}, 3.0, 3)["inconclusive"]


def test_the_floor_is_min_verify_steps_and_a_pass_names_its_steps() -> None:
    below = verify({"2": MIN_VERIFY_STEPS - 1}, 3.0, 3)
    at = verify({"2": MIN_VERIFY_STEPS}, 3.0, 3)
    assert not below["passed"] and below["inconclusive"]
    assert at["passed"] and not at["inconclusive"]
    assert f"over {MIN_VERIFY_STEPS} verify steps" in at["reason"]
    assert at["realized_acceptance_length"] == acceptance_length(
        2 * MIN_VERIFY_STEPS, MIN_VERIFY_STEPS
    )


def _line(verdict: dict[str, Any], requests: int = 3) -> str:
    console = Console(record=True, width=400)
    acc = {"verify_steps": verdict["verify_steps"], "requests_with_stats": requests}
    print_verdict(console, verdict, acc)
    return console.export_text()


def test_the_verdict_line_shows_its_evidence() -> None:
    passed = _line(verify({"2": 440, "3": 1560}, 3.78, 7), requests=24)
    assert passed.startswith("verification PASS: ")
    assert "evidence: 2000 verify steps in 24 requests with stats" in passed
    thin = _line(verify({"2": 1}, 3.0, 3), requests=1)
    assert thin.startswith("verification INCONCLUSIVE: ") and "evidence: 1 verify steps" in thin
    vetoed = verify({"2": 1}, 3.0, 3)
    vetoed.update(schedule_passed=False, reason="1 of 2 requests failed (max 0%); ...")
    assert _line(vetoed).startswith("verification FAIL: 1 of 2 requests failed")


def test_an_inconclusive_verdict_exits_4_and_a_vetoed_one_1() -> None:
    summary = {
        "figures": {"interrupted": False},
        "failures": {"exceeded": False},
        "verdict": verify({"2": 1}, 3.0, 3),
    }
    assert BenchOutcome(summary, []).exit_code == EXIT_INCONCLUSIVE
    summary["verdict"]["schedule_passed"] = False  # a veto (failed requests, unreadable counters)
    assert BenchOutcome(summary, []).exit_code == EXIT_VERDICT_FAILED


def _acceptance(**kw: Any) -> dict[str, Any]:
    base = {
        "num_spec_tokens": 3,
        "counts_only_requests": 0,
        "counts_only_engines": [],
        "histogram_steps": 40,
        "histogram": {"2": 40},
        "inconsistent_requests": [],
        "evidence_histogram": {"2": 40},
        "evidence_steps": 40,
        "evidence_requests": 4,
    }
    return {**base, **kw}


@pytest.mark.parametrize(
    ("acceptance", "start"),
    [
        (_acceptance(num_spec_tokens=None), "inconclusive: K is unknown"),
        (
            _acceptance(
                counts_only_requests=4,
                counts_only_engines=["llama.cpp"],
                histogram_steps=0,
                histogram={},
            ),
            "inconclusive: 4 requests carried counts only (llama.cpp)",
        ),
    ],
    ids=["k-unknown", "counts-only"],
)
def test_a_verdict_without_a_histogram_to_judge_is_inconclusive(
    acceptance: dict[str, Any], start: str
) -> None:
    verdict = judge(acceptance, Expectation(3.0))
    assert verdict["inconclusive"] and not verdict["passed"]
    assert verdict["reason"].startswith(start)
    summary = {
        "figures": {"interrupted": False},
        "failures": {"exceeded": False},
        "verdict": verdict,
    }
    assert BenchOutcome(summary, []).exit_code == EXIT_INCONCLUSIVE
    assert _line({**verdict, "verify_steps": 0}).startswith("verification INCONCLUSIVE: ")


def test_a_judged_histogram_is_not_inconclusive() -> None:
    verdict = judge(
        _acceptance(
            histogram={"2": 4000}, histogram_steps=4000,
            evidence_histogram={"2": 4000}, evidence_steps=4000,
        ),
        Expectation(3.0),
    )  # fmt: skip
    assert verdict["passed"] and not verdict["inconclusive"]
    assert verdict["left_out_requests"] == 0 and verdict["evidence_requests"] == 4


def test_the_verdict_judges_the_evidence_not_the_pooled_histogram() -> None:
    """The pooled histogram (every request) would PASS at AL 3; the consistent requests alone
    accept 1 draft a step, a FAIL. With no consistent step left it is inconclusive, not PASS."""
    flagged = [{"index": i, "problem": "stats account for ..."} for i in range(3)]
    mixed = _acceptance(
        histogram={"1": 40, "2": 4000}, histogram_steps=4040, inconsistent_requests=flagged,
        evidence_histogram={"1": 40}, evidence_steps=40, evidence_requests=1,
    )  # fmt: skip
    verdict = judge(mixed, Expectation(3.0))
    assert not verdict["passed"] and not verdict["inconclusive"]
    assert verdict["verify_steps"] == 40 and verdict["left_out_requests"] == 3
    assert verdict["reason"].endswith(
        "(3 requests whose stats exceed their completion_tokens left out)"
    )
    assert "evidence: 40 verify steps in 1 requests with stats; 3 requests left out" in _line(
        verdict
    )
    none_left = _acceptance(
        histogram={"2": 4000}, histogram_steps=4000, inconsistent_requests=flagged,
        evidence_histogram={}, evidence_steps=0, evidence_requests=0,
    )  # fmt: skip
    verdict = judge(none_left, Expectation(3.0))
    assert verdict["inconclusive"] and not verdict["passed"] and verdict["verify_steps"] == 0
    assert verdict["reason"].startswith("inconclusive: 3 requests report more verify steps")
    summary = {"figures": {"interrupted": False}, "failures": {"exceeded": False}}
    assert BenchOutcome({**summary, "verdict": verdict}, []).exit_code == EXIT_INCONCLUSIVE
