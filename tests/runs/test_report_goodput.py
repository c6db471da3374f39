"""The terminal report: goodput reads as a sentence (never a Python dict), and the server
counters never "agree" about requests that were not compared."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from speclens.runs.report import (
    goodput_sentence,
    print_summary,
    replica_table,
    server_counters_text,
)


def _text(renderable: Any) -> str:
    console = Console(record=True, width=300)
    console.print(renderable)
    return console.export_text()


def test_goodput_is_a_sentence_with_each_slo_in_ms() -> None:
    good = {"slo_ms": {"ttft": 200.0, "e2e": 2500.0}, "requests_per_s": 3.5, "fraction": 0.75}
    assert goodput_sentence(good, 8) == (
        "3.50 req/s met the SLO (TTFT ≤ 200 ms, E2E latency ≤ 2,500 ms): 6 of 8 completed "
        "requests (75.0%)"
    )
    none = {"slo_ms": {"tpot": 20.0}, "requests_per_s": 0.0, "fraction": 0.0}
    assert goodput_sentence(none, 0) == "no request completed, so none met the SLO (TPOT ≤ 20 ms)"


def _summary(check: dict[str, Any], completed: int = 4) -> dict[str, Any]:
    acceptance = {
        "requests_with_stats": 0, "adapters": [], "token_weighted_al": None,
        "per_request_al": None, "draft_acceptance_rate": None, "accepted_per_step": None,
        "verify_steps": 0, "histogram": {}, "zero_step_requests": 0, "al_by_category": {},
        "inconsistent_requests": [],
    }  # fmt: skip
    figures = {
        "requests": {"completed": completed, "failed": 0, "warmup": 0},
        "duration_s": 1.0, "interrupted": False,
        "throughput": {"requests_per_s": 4.0, "output_tokens_per_s": 100.0},
        "goodput": {"slo_ms": {"ttft": 200.0}, "requests_per_s": 2.0, "fraction": 0.5},
        "latency_ms": {"ttft": None}, "acceptance": acceptance,
    }  # fmt: skip
    return {"figures": figures, "server_check": check, "warnings": []}


def test_the_printed_report_has_no_dict_and_no_agreement_about_nothing() -> None:
    check = {
        "available": True, "consistent": None, "flags": [], "compared": False,
        "source": "metrics:vllm", "note": "no request completed: nothing to compare the "
        "server's counters with",
    }  # fmt: skip
    console = Console(record=True, width=400)
    print_summary(console, _summary(check))
    text = console.export_text()
    assert "2.00 req/s met the SLO (TTFT ≤ 200 ms): 2 of 4 completed requests (50.0%)" in text
    assert "{" not in text and "'ttft'" not in text
    row = next(line for line in text.splitlines() if "server counters" in line)
    assert "agree" not in row and "nothing to compare" in row


def test_server_counters_text_agrees_only_after_a_comparison() -> None:
    agreed = {"available": True, "consistent": True, "flags": [], "source": "metrics:vllm"}
    assert server_counters_text(agreed) == "agree (metrics:vllm)"
    flagged = {**agreed, "consistent": False, "flags": ["a", "b"]}
    assert server_counters_text(flagged) == "a; b (metrics:vllm)"
    nothing = {**agreed, "consistent": None, "compared": False, "note": "nothing to compare"}
    assert server_counters_text(nothing) == "nothing to compare"
    assert server_counters_text({"available": False, "note": "no counters"}) == "no counters"
    replicas = {
        "http://a": {
            "figures": {"requests": {"completed": 0, "failed": 2},
                        "throughput": {"requests_per_s": 0.0},
                        "acceptance": {"token_weighted_al": None}},
            "server_check": nothing,
        }
    }  # fmt: skip
    text = _text(replica_table(replicas))
    assert "nothing to compare" in text and "agree" not in text
