"""Diagnoses that point at the cause: a run whose requests carried no per-request stats is told
so first, with the switch of the engine it ran against; K comes from the server where it says
it; the server counters' AL is the fallback; the exit codes are the documented ones."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from speclens.bench.run import (
    EXIT_INCONCLUSIVE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TOO_MANY_FAILURES,
    EXIT_VERDICT_FAILED,
    STATS_HINTS,
    UNKNOWN_HINT,
    BenchOutcome,
    Expectation,
    judge,
    no_stats_verdict,
    served_k,
    serving_engine,
    uncompared,
)

ROOT = Path(__file__).resolve().parents[2]
SPECLENS_VERSION = {
    "engine": "speclens",
    "acceptance": {"method": "ngram", "num_speculative_tokens": 3},
}
VLLM = {"source": "metrics:vllm", "accepted_per_position": {0: 10.0, 1: 5.0, 2: 0.0}}


@pytest.mark.parametrize(
    ("info", "backend", "scrape", "engine"),
    [
        (SPECLENS_VERSION, "openai", (VLLM, None), "speclens"),  # speclens renders vLLM's names
        ({"version": "0.32.0"}, "openai", (VLLM, None), "vllm"),
        ({"engine": "llama.cpp"}, "openai", (None, "no counters"), "llama.cpp"),
        (None, "llamacpp", (None, None), "llama.cpp"),
        (None, "sglang", (None, None), "sglang"),
        (None, "openai", (None, "the server exposes gauges only (sglang:spec_accept_length)"),
         "sglang"),
        (None, "openai", ({"source": "metrics:trtllm-iteration-stats"}, None), "tensorrt-llm"),
        (None, "openai", ({"source": "metrics:atom"}, None), "atom"),
        (None, "openai", ({"source": "debug/mtp_stats"}, None), "atom"),
        (None, "openai", ({"source": "metrics:llama.cpp"}, None), "llama.cpp"),
        (None, "openai", (None, "the server exposes no acceptance counters"), None),
    ],
)  # fmt: skip
def test_the_engine_is_told_from_what_the_run_saw(
    info: Any, backend: str, scrape: Any, engine: str | None
) -> None:
    assert serving_engine(info, backend, scrape) == engine


def test_each_engine_gets_its_own_switch() -> None:
    assert "--per-request-spec-decode-metrics summary" in STATS_HINTS["vllm"]
    assert "--per-request-spec-decode-stats summary" in STATS_HINTS["speclens"]
    assert "--backend sglang" in STATS_HINTS["sglang"]
    assert "--spec-type" in STATS_HINTS["llama.cpp"]
    assert "enable_iter_perf_stats" in STATS_HINTS["tensorrt-llm"]
    assert len(set(STATS_HINTS.values())) == len(STATS_HINTS)
    assert "--per-request-spec-decode-metrics" in UNKNOWN_HINT


def test_k_comes_from_the_server_where_it_says_it() -> None:
    assert served_k(SPECLENS_VERSION, VLLM) == (3, "the server's /version")
    k, where = served_k({"version": "0.32.0"}, VLLM)  # type: ignore[misc]
    assert k == 3 and "per-position counter on /metrics" in where
    gap = {"source": "metrics:vllm", "accepted_per_position": {0: 1.0, 2: 1.0}}
    assert served_k(None, gap) is None  # positions with a hole say nothing of K
    assert served_k(None, {**VLLM, "source": "metrics:llama.cpp"}) is None
    assert served_k({"acceptance": {"num_speculative_tokens": "3"}}, None) is None
    assert served_k(None, None) is None


def _acceptance(**kw: Any) -> dict[str, Any]:
    base = {
        "num_spec_tokens": None, "counts_only_requests": 0, "counts_only_engines": [],
        "histogram_steps": 40, "histogram": {"2": 40}, "inconsistent_requests": [],
        "evidence_histogram": {"2": 40}, "evidence_steps": 40, "evidence_requests": 4,
        "requests_with_stats": 4,
    }  # fmt: skip
    return {**base, **kw}


def test_a_k_the_server_states_is_never_called_unknown() -> None:
    unknown = judge(_acceptance(), Expectation(3.0))
    assert unknown["reason"].startswith("inconclusive: K is unknown")
    judged = judge(_acceptance(), Expectation(3.0), (3, "the server's /version"))
    assert judged["passed"] and judged["num_spec_tokens"] == 3


def _check(server_al: float | None = 2.5) -> dict[str, Any]:
    return {
        "available": True, "unreadable_after": False, "source": "metrics:vllm",
        "server_delta": {"drafts": 48.0, "draft_tokens": 144.0, "accepted_tokens": 72.0},
        "server_al": server_al, "consistent": False,
        "flags": ["server counted 48 more drafts than the client's requests carried: traffic "
                  "the client did not send"],
    }  # fmt: skip


def test_no_stats_heads_the_verdict_with_the_switch_k_and_the_fallback() -> None:
    verdict = no_stats_verdict(Expectation(2.5), "vllm", _check(), (3, "the server's /version"))
    assert verdict["reason"] == (
        "inconclusive: no request carried per-request speculative-decoding stats: "
        f"{STATS_HINTS['vllm']}; fallback: AL 2.5000 from the server's counters (metrics:vllm, "
        "48 verify steps), not judged; K 3 (from the server's /version)"
    )
    assert verdict["inconclusive"] and not verdict["passed"]
    assert verdict["server_acceptance_length"] == 2.5
    summary = {"figures": {"interrupted": False}, "failures": {"exceeded": False}}
    assert BenchOutcome({**summary, "verdict": verdict}, []).exit_code == EXIT_INCONCLUSIVE
    stated = no_stats_verdict(Expectation(2.5, 4), None, _check(None), (3, "the server"))
    assert stated["num_spec_tokens"] == 4 and "K 4 (from --num-spec-tokens)" in stated["reason"]
    assert UNKNOWN_HINT in stated["reason"] and "no fallback" in stated["reason"]
    bare = no_stats_verdict(Expectation(2.5), None, {"available": False, "note": "x"}, None)
    assert bare["reason"].endswith("K unknown") and bare["num_spec_tokens"] is None


def test_a_check_with_nothing_to_compare_never_agrees_nor_blames_traffic() -> None:
    no_stats = _check()
    uncompared(no_stats, _acceptance(requests_with_stats=0), completed=6)
    assert no_stats["compared"] is False and no_stats["flags"] == []
    assert not no_stats["consistent"]
    assert no_stats["note"].startswith("no request carried per-request stats: nothing to compare")
    assert (
        "AL from the server's counters (fallback): 2.5000 over 48 verify steps" in no_stats["note"]
    )
    none_done = {**_check(), "consistent": True, "flags": []}
    uncompared(none_done, _acceptance(requests_with_stats=0), completed=0)
    assert none_done["compared"] is False and not none_done["consistent"]
    assert (
        none_done["note"] == "no request completed: nothing to compare the server's counters with"
    )
    compared = _check()
    uncompared(compared, _acceptance(), completed=6)
    assert "compared" not in compared and compared["flags"]  # a real comparison is untouched
    unread = {"available": False, "unreadable_after": False, "note": "no counters"}
    uncompared(unread, _acceptance(requests_with_stats=0), completed=0)
    assert unread == {"available": False, "unreadable_after": False, "note": "no counters"}


def _table(text: str, heading: str) -> dict[int, str]:
    """The rows ``| code | meaning |`` of the first table after ``heading``."""
    rows: dict[int, str] = {}
    for line in text[text.index(heading) :].splitlines()[1:]:
        match = re.match(r"\|\s*(\d+)\s*\|(.*)\|\s*$", line)
        if match:
            rows[int(match[1])] = match[2]
        elif rows and not line.startswith("|"):
            break
    return rows


BENCH_CODES = {EXIT_OK, EXIT_VERDICT_FAILED, 2, EXIT_TOO_MANY_FAILURES, EXIT_INCONCLUSIVE,
               EXIT_INTERRUPTED}  # fmt: skip


def test_the_exit_code_table_is_the_codes_bench_uses() -> None:
    text = (ROOT / "docs" / "exit-codes.md").read_text(encoding="utf-8")
    rows = _table(text, "# Exit codes")
    assert set(rows) == BENCH_CODES
    assert "inconclusive" in rows[EXIT_INCONCLUSIVE] and "K unknown" in rows[EXIT_INCONCLUSIVE]
    assert "--max-failure-rate" in rows[EXIT_TOO_MANY_FAILURES]
    assert "failed verdict" in rows[EXIT_VERDICT_FAILED]
    assert "interrupted" in rows[EXIT_INTERRUPTED]
    assert "INCONCLUSIVE (exit 1)" not in text
