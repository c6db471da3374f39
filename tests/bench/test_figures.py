"""Figures, goodput, cross-checks and the verdict, on hand-made records."""

from __future__ import annotations

import math

import pytest

from speclens.acceptance import ValidationError
from speclens.bench.client import RequestRecord, RunResult
from speclens.bench.datasets import jsonl_prompts, random_prompts
from speclens.bench.server import cross_check, parse_metrics
from speclens.runs.figures import consistency_problem, parse_slo, summarize
from speclens.runs.verify import verify


def _record(
    i: int, hist: dict[int, int], tokens: int, ttft: float, end: float, cat: str = "x"
) -> RequestRecord:
    steps = sum(hist.values())
    accepted = sum(j * n for j, n in hist.items())
    return RequestRecord(
        index=i, category=cat, start=0.0, end=end, ttft=ttft, itl_runs=[(0.01, tokens - 1)],
        prompt_tokens=10, completion_tokens=tokens, spec_status="ok", spec_adapter="a",
        spec={
            "mean_acceptance_length": 1 + accepted / steps if steps else 1.0,
            "draft_acceptance_rate": accepted / (7 * steps) if steps else 0.0,
            "acceptance_histogram": hist, "num_accepted_draft_tokens": accepted,
            "num_draft_tokens": 7 * steps, "num_spec_steps": steps, "num_spec_tokens": 7,
        },
    )  # fmt: skip


def test_token_weighted_al_pools_steps_not_requests() -> None:
    a = _record(0, {2: 1}, 4, 0.1, 1.0)  # AL 3 over one step
    b = _record(1, {3: 3}, 13, 0.1, 1.0)  # AL 4 over three steps
    figs = summarize(RunResult([a, b], 0.0, 2.0))
    acc = figs["acceptance"]
    assert acc["token_weighted_al"] == pytest.approx(1 + (2 + 9) / 4)
    assert acc["per_request_al"]["mean"] == pytest.approx(3.5)
    assert acc["histogram"] == {"2": 1, "3": 3}
    assert figs["throughput"]["output_tokens_per_s"] == pytest.approx(17 / 2.0)
    assert figs["throughput"]["requests_per_s"] == pytest.approx(1.0)


def test_draft_coverage_pools_steps_over_records_that_report_it() -> None:
    """Pooled coverage = sum verify steps / sum decode steps over the records carrying decode
    steps; tokens per decode step = 1 + accepted / decode steps over the same records."""
    a = _record(0, {2: 1}, 6, 0.1, 1.0)  # 1 verify step of 3 decode steps
    a.spec["num_decode_steps"] = 3
    b = _record(1, {3: 3}, 14, 0.1, 1.0)  # 3 verify steps of 4 decode steps
    b.spec["num_decode_steps"] = 4
    c = _record(2, {1: 50}, 101, 0.1, 1.0)  # no decode steps reported: left out
    acc = summarize(RunResult([a, b, c], 0.0, 1.0))["acceptance"]
    assert acc["draft_coverage"] == (1 + 3) / (3 + 4)
    assert acc["draft_coverage_requests"] == 2
    assert acc["decode_steps"] == 7
    assert acc["tokens_per_decode_step"] == 1 + (2 + 9) / 7
    assert acc["verify_steps"] == 54  # AL still pools every record
    none = summarize(RunResult([c], 0.0, 1.0))["acceptance"]
    assert none["draft_coverage"] is None and none["draft_coverage_requests"] == 0
    assert none["decode_steps"] is None and none["tokens_per_decode_step"] is None


def test_warmup_is_excluded_from_every_figure() -> None:
    warm = _record(0, {0: 50}, 51, 5.0, 9.0)
    warm.warmup = True
    figs = summarize(RunResult([warm, _record(1, {2: 2}, 7, 0.1, 1.0)], 0.0, 1.0))
    assert figs["requests"]["completed"] == 1 and figs["requests"]["warmup"] == 1
    assert figs["acceptance"]["histogram"] == {"2": 2}
    assert figs["latency_ms"]["ttft"]["max"] == pytest.approx(100.0)


def test_goodput_counts_requests_within_every_slo() -> None:
    fast = _record(0, {2: 1}, 4, 0.05, 0.1)
    slow = _record(1, {2: 1}, 4, 0.5, 1.0)
    figs = summarize(RunResult([fast, slow], 0.0, 1.0), parse_slo("ttft:100,tpot:50"))
    assert figs["goodput"]["fraction"] == 0.5
    with pytest.raises(ValueError):
        parse_slo("latency:3")


def test_consistency_flags_stats_that_claim_more_tokens_than_arrived() -> None:
    # 2 steps accepting 2 each: 2 + 4 + 1 = 7 tokens; the last step may be cut by up to K = 7.
    assert consistency_problem(_record(0, {2: 2}, 7, 0.1, 1.0)) is None
    assert (
        consistency_problem(_record(0, {2: 2}, 9, 0.1, 1.0)) is None
    )  # undrafted steps add tokens
    short = _record(0, {3: 10}, 41, 0.1, 1.0)
    short.completion_tokens = 30  # 10 + 30 + 1 = 41 claimed; 30 + 7 < 41
    assert "stats account for 41 tokens" in (consistency_problem(short) or "")


def test_the_evidence_histogram_leaves_out_inconsistent_requests() -> None:
    """The pooled histogram keeps every request (it is what the server reported); the verdict's
    evidence keeps only those whose stats fit their completion_tokens."""
    good = _record(0, {2: 2}, 7, 0.1, 1.0)
    bad = _record(1, {3: 10}, 41, 0.1, 1.0)
    bad.completion_tokens = 30  # 10 + 30 + 1 = 41 claimed; 30 + 7 < 41
    acc = summarize(RunResult([good, bad], 0.0, 1.0))["acceptance"]
    assert [item["index"] for item in acc["inconsistent_requests"]] == [1]
    assert acc["histogram"] == {"2": 2, "3": 10}
    assert acc["evidence_histogram"] == {"2": 2}
    assert acc["evidence_steps"] == 2 and acc["evidence_requests"] == 1


def test_verdict_passes_at_the_forced_al_and_fails_off_by_0_3() -> None:
    # 2000 steps at AL 3.78: 440 accept 2, 1560 accept 3 (the exact 22/78 split).
    hist = {"2": 440, "3": 1560}
    assert verify(hist, 3.78, 7)["passed"]
    off = verify(hist, 3.48, 7)
    # AL 3.48 draws 2 or 3 as well, but 48/52: the AL and the split are both off.
    assert not off["passed"] and not off["al_ok"] and not off["histogram_ok"]
    assert off["unexpected_buckets"] == {}
    assert verify(hist, 4.08, 7)["unexpected_buckets"] == {"2": 440}
    assert not verify({"2": 440, "3": 1500, "4": 60}, 3.78, 7)["histogram_ok"]


def test_verdict_tolerance_is_z_standard_errors() -> None:
    steps = 10_000
    se = math.sqrt(0.78 * 0.22 / steps)
    inside = round((0.78 + 3.5 * se) * steps)
    outside = round((0.78 + 4.5 * se) * steps)
    assert verify({"2": steps - inside, "3": inside}, 3.78, 7)["passed"]
    assert not verify({"2": steps - outside, "3": outside}, 3.78, 7)["passed"]


def test_server_cross_check_flags_foreign_traffic() -> None:
    client = {"verify_steps": 10, "draft_tokens": 70, "accepted_tokens": 25}
    before = {"drafts": 5.0, "draft_tokens": 35.0, "accepted_tokens": 10.0, "source": "s"}
    same = {"drafts": 15.0, "draft_tokens": 105.0, "accepted_tokens": 35.0, "source": "s"}
    more = {"drafts": 16.0, "draft_tokens": 112.0, "accepted_tokens": 37.0, "source": "s"}
    assert cross_check(before, same, client)["consistent"]
    check = cross_check(before, more, client)
    assert not check["consistent"] and "did not send" in check["flags"][0]


def test_parse_metrics_reads_vllm_then_atom_names() -> None:
    vllm = (
        "# TYPE vllm:spec_decode_num_drafts counter\nvllm:spec_decode_num_drafts_total 4\n"
        "# TYPE vllm:spec_decode_num_draft_tokens counter\nvllm:spec_decode_num_draft_tokens_total 28\n"
        "# TYPE vllm:spec_decode_num_accepted_tokens counter\nvllm:spec_decode_num_accepted_tokens_total 11\n"
    )
    assert parse_metrics(vllm) == {
        "drafts": 4,
        "draft_tokens": 28,
        "accepted_tokens": 11,
        "source": "metrics:vllm",
    }
    atom = (
        '# TYPE atom:mtp_decode_steps gauge\natom:mtp_decode_steps{accepted_tokens="2"} 3\n'
        'atom:mtp_decode_steps{accepted_tokens="3"} 1\n# TYPE atom:mtp_accepted_tokens gauge\n'
        "atom:mtp_accepted_tokens 9\n"
    )
    parsed = parse_metrics(atom)
    assert parsed is not None and parsed["drafts"] == 4 and parsed["accepted_tokens"] == 9
    assert parse_metrics("# TYPE other gauge\nother 1\n") is None


def test_datasets(tmp_path) -> None:
    prompts = random_prompts(5, 8, 16, seed=1)
    assert prompts == random_prompts(5, 8, 16, seed=1) and len(prompts[0].text.split()) == 8
    good = tmp_path / "q.jsonl"
    good.write_text('{"question_id": 1, "category": "coding", "turns": ["hi"]}\n'
                    '{"question_id": 2, "category": "math", "turns": ["2+2?", "and 3?"]}\n')  # fmt: skip
    assert [p.category for p in jsonl_prompts(good)] == ["coding", "math"]
    assert [p.text for p in jsonl_prompts(good, ["math"])] == ["2+2?"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"category": "x", "turns": []}\nnot json\n')
    with pytest.raises(ValidationError) as info:
        jsonl_prompts(bad)
    assert {p.path for p in info.value.problems} == {"line 1.turns", "line 2"}


def test_spec_bench_prompts_load() -> None:
    from pathlib import Path

    path = Path(__file__).parents[2] / ".." / "shared" / "data" / "spec-bench" / "question.jsonl"
    if not path.exists():
        pytest.skip("the Spec-Bench prompts are not beside this checkout")
    prompts = jsonl_prompts(path)
    assert len(prompts) == 480 and len({p.category for p in prompts}) > 3
