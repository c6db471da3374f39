"""A verdict rests only on evidence the run itself believes: requests whose stats claim more
tokens than their response carried are left out of it, and with none left it is inconclusive."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from garbage_server import GarbageServer, Reply, sse

from speclens.bench.run import EXIT_INCONCLUSIVE


def _stats(steps: int) -> dict[str, Any]:
    """``steps`` verify steps at K = 3 accepting 2 drafts each: AL 3.0 exactly."""
    return {
        "mean_acceptance_length": 3.0,
        "draft_acceptance_rate": 2 / 3,
        "acceptance_histogram": {"2": steps},
        "num_accepted_draft_tokens": 2 * steps,
        "num_draft_tokens": 3 * steps,
        "num_spec_steps": steps,
        "num_spec_tokens": 3,
    }


def _reply(steps: int, completion_tokens: int) -> Reply:
    choice = {
        "index": 0,
        "text": "x" * completion_tokens,
        "finish_reason": "length",
        "speculative_decoding_stats": _stats(steps),
    }
    usage = {"prompt_tokens": 4, "completion_tokens": completion_tokens}
    event = {"id": "c", "object": "text_completion", "model": "m", "choices": [choice]}
    return Reply(chunks=sse({**event, "usage": {**usage, "total_tokens": 4 + completion_tokens}}))


def _bench(run_cli: Any, url: str, out: Path) -> tuple[int, str, dict[str, Any]]:
    code, stdout, stderr = run_cli(
        "bench", "--url", url, "--model", "m", "--num-requests", "8", "--max-tokens", "25",
        "--expect-acceptance-length", "3", "--num-spec-tokens", "3", "--output-dir", out,
    )  # fmt: skip
    assert "Traceback" not in stdout + stderr
    return code, stdout, json.loads((out / "summary.json").read_text())


@pytest.mark.timeout(60)
def test_a_thousand_steps_in_25_tokens_is_no_evidence_and_never_pass(
    run_cli: Any, tmp_path: Path
) -> None:
    """1,000 verify steps a request (3,001 tokens' worth) with completion_tokens 25. Before: every
    request flagged, then "verification PASS ... over 8000 verify steps", exit 0."""
    with GarbageServer(_reply(1000, 25)) as server:
        code, stdout, summary = _bench(run_cli, server.url, tmp_path / "run")
    flat = " ".join(stdout.split())
    assert "verification PASS" not in flat and "8000 verify steps" not in flat
    assert code == EXIT_INCONCLUSIVE, stdout
    verdict = summary["verdict"]
    assert not verdict["passed"] and verdict["inconclusive"]
    assert verdict["verify_steps"] == 0 and verdict["left_out_requests"] == 8
    acc = summary["figures"]["acceptance"]
    assert len(acc["inconsistent_requests"]) == 8
    assert (
        "stats account for 3001 tokens but completion_tokens is 25"
        in (acc["inconsistent_requests"][0]["problem"])
    )
    assert acc["evidence_steps"] == 0 and acc["evidence_requests"] == 0
    assert "verification INCONCLUSIVE: inconclusive: 8 requests report more verify steps" in flat
    assert "evidence: 0 verify steps in 0 requests with stats" in flat
    warning = (
        "8 requests report more verify steps and accepted drafts than their completion_tokens allow"
    )
    assert any(w.startswith(warning) for w in summary["warnings"])
    assert "fewer steps" not in flat


@pytest.mark.timeout(60)
def test_consistent_requests_still_judge_without_the_inconsistent_ones(
    run_cli: Any, tmp_path: Path
) -> None:
    """Half the requests are consistent (8 steps in 25 tokens), half claim 1,000 steps: the
    verdict judges the 4 consistent ones alone (32 steps), not 4,032."""
    replies = [_reply(8, 25), _reply(1000, 25)] * 4
    with GarbageServer(replies) as server:
        code, stdout, summary = _bench(run_cli, server.url, tmp_path / "run")
    verdict = summary["verdict"]
    assert verdict["passed"] and verdict["verify_steps"] == 32, verdict
    acc = summary["figures"]["acceptance"]
    assert len(acc["inconsistent_requests"]) == 4
    assert acc["evidence_histogram"] == {"2": 32} and acc["evidence_requests"] == 4
    assert verdict["left_out_requests"] == 4
    assert "4 requests whose stats exceed their completion_tokens left out" in verdict["reason"]
    assert code == 0, stdout
    assert "evidence: 32 verify steps in 4 requests with stats" in " ".join(stdout.split())
