"""A verification verdict names the evidence it rests on, and too little evidence is never PASS."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from speclens.acceptance import acceptance_length
from speclens.bench.run import EXIT_VERDICT_FAILED, BenchOutcome
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


def test_an_inconclusive_verdict_does_not_exit_0() -> None:
    summary = {
        "figures": {"interrupted": False},
        "failures": {"exceeded": False},
        "verdict": verify({"2": 1}, 3.0, 3),
    }
    assert BenchOutcome(summary, []).exit_code == EXIT_VERDICT_FAILED
