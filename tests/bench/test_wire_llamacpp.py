"""``speclens bench`` against a llama-server stand-in (``standin_llamacpp``, written from llama.cpp
b11434's ``tools/server/server-task.cpp``, ``server-common.cpp`` and ``server-context.cpp``): on
completions and chat, streamed and not, every request gets a counts-only record whose totals are
the stand-in's own, no AL or histogram is made up, and the report takes AL from the server's
counters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from standin_llamacpp import StandIn, run_app

from speclens.bench.server import parse_metrics

N = 6


def _bench(run_cli: Any, url: str, out: Path, *extra: str) -> dict[str, Any]:
    code, stdout, stderr = run_cli(
        "bench", "--url", url, "--model", "smollm2-135m", "--dataset", "random",
        "--num-requests", str(N), "--concurrency", "2", "--max-tokens", "24",
        "--output-dir", out, *extra,
    )  # fmt: skip
    assert code == 0, stdout + stderr
    summary = orjson.loads((out / "summary.json").read_bytes())
    summary["_stdout"] = stdout
    summary["_records"] = [
        orjson.loads(line) for line in (out / "records.jsonl").read_bytes().splitlines()
    ]
    return summary


@pytest.mark.parametrize(
    "flags",
    [
        ("--endpoint", "completions", "--stream"),
        ("--endpoint", "completions", "--no-stream"),
        ("--endpoint", "chat", "--stream"),
        ("--endpoint", "chat", "--no-stream"),
    ],
)
def test_counts_only_records_with_totals_and_al_from_the_servers_counters(
    run_cli: Any, tmp_path: Path, flags: tuple[str, ...]
) -> None:
    standin = StandIn()
    with run_app(standin.app) as url:
        summary = _bench(run_cli, url, tmp_path / "out", *flags)
    tally = standin.tally
    assert standin.requests == N and tally.steps > 0
    acc = summary["figures"]["acceptance"]
    records = [r for r in summary["_records"] if not r["warmup"]]
    assert all(r["spec_decode_status"] == "ok" for r in records), records[0]["spec_decode_message"]
    specs = [r["spec_decode_acceptance"] for r in records]
    for spec in specs:  # counts only: nothing estimated
        assert spec["engine"] == "llama.cpp" and spec["draft_unit"] == "tokens"
        assert spec["num_spec_steps"] is None and spec["acceptance_histogram"] is None
        assert spec["mean_acceptance_length"] is None
    assert sum(s["num_draft_tokens"] for s in specs) == tally.drafted
    assert sum(s["num_accepted_draft_tokens"] for s in specs) == tally.accepted
    assert acc["counts_only_requests"] == N and acc["counts_only_engines"] == ["llama.cpp"]
    assert acc["token_weighted_al"] is None and acc["histogram"] == {}
    assert acc["verify_steps"] == 0 and acc["per_request_al"] is None
    assert acc["draft_acceptance_rate"] == pytest.approx(tally.accepted / tally.drafted)
    check = summary["server_check"]
    assert check["available"] and check["consistent"], check
    assert check["source"] == "metrics:llama.cpp"
    assert check["server_delta"]["drafts"] == tally.steps
    assert check["server_al"] == pytest.approx(1 + tally.accepted / tally.steps)
    row = acc["derivable"]["llama.cpp"]
    assert row == {
        "requests": N, "draft_acceptance_rate": "yes", "al_per_request": "no",
        "al_from_server_counters": "yes", "histogram": "no", "per_step": "no",
        "decode_steps": "no",
    }  # fmt: skip
    assert (
        f"{N} requests carried counts only (llama.cpp): AL from the server's counters"
        in (acc["counts_only_al"])
    )
    assert "counts only" in summary["_stdout"] and "AL from counters" in summary["_stdout"]


def test_the_servers_counters_are_read_under_llamacpps_names() -> None:
    """The names and the per-position labels are llama-server's (``server-task.cpp``)."""
    text = (
        "# TYPE llamacpp:spec_decode_num_drafts_total counter\n"
        "llamacpp:spec_decode_num_drafts_total 10\n"
        "# TYPE llamacpp:spec_decode_num_draft_tokens_total counter\n"
        "llamacpp:spec_decode_num_draft_tokens_total 40\n"
        "# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter\n"
        "llamacpp:spec_decode_num_accepted_tokens_total 17\n"
        "# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter\n"
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 8\n'
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 6\n'
    )
    assert parse_metrics(text) == {
        "drafts": 10.0, "draft_tokens": 40.0, "accepted_tokens": 17.0,
        "accepted_per_position": {0: 8.0, 1: 6.0}, "source": "metrics:llama.cpp",
    }  # fmt: skip


def test_measure_refuses_counts_only_records_instead_of_writing_a_profile(
    run_cli: Any, tmp_path: Path
) -> None:
    """A profile's AL is per category, from verify steps per request; llama.cpp reports none, so
    ``measure`` says so (exit 1) and writes nothing, and names the engine from its counters."""
    data = tmp_path / "q.jsonl"
    data.write_bytes(
        b"".join(
            orjson.dumps({"question_id": i, "category": "qa", "turns": [f"question {i}"]}) + b"\n"
            for i in range(3)
        )
    )
    out = tmp_path / "set.yaml"
    standin = StandIn()
    with run_app(standin.app) as url:
        code, stdout, stderr = run_cli(
            "measure", "--url", url, "--model", "smollm2-135m", "--dataset-path", data,
            "--max-tokens", "24", "--method", "draft_model", "--num-spec-tokens", "4",
            "--hardware", "cpu", "-o", out,
        )  # fmt: skip
    assert code == 1, stdout + stderr
    assert "every request carried counts only (llama.cpp)" in stderr
    assert not out.exists()
