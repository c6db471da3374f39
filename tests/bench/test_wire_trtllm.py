"""``speclens bench`` against a ``trtllm-serve`` stand-in answering n = 2 (``standin_trtllm``,
written from TensorRT-LLM's ``tensorrt_llm/serve/openai_protocol.py``, ``postprocess_handlers.py``
and ``openai_server.py``): one record per choice keyed by its index, the request's record their
sum, totals equal to the stand-in's, and the server check read from its drained JSON
``/metrics``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from standin_llamacpp import run_app
from standin_trtllm import StandIn

from speclens.bench.server import cross_check, parse_metrics

N = 4


@pytest.mark.parametrize(
    "flags",
    [
        ("--endpoint", "chat", "--no-stream"),
        ("--endpoint", "chat", "--stream"),
        ("--endpoint", "completions", "--stream"),
    ],
)
def test_n_two_gives_per_choice_records_and_the_drained_counters_agree(
    run_cli: Any, tmp_path: Path, flags: tuple[str, ...]
) -> None:
    standin = StandIn(n=2)
    out = tmp_path / "out"
    with run_app(standin.app) as url:
        code, stdout, stderr = run_cli(
            "bench", "--url", url, "--model", "standin", "--dataset", "random",
            "--num-requests", str(N), "--concurrency", "2", "--max-tokens", "20",
            "--warmup", "1", "--output-dir", out, *flags,
        )  # fmt: skip
    assert code == 0, stdout + stderr
    rows = [orjson.loads(line) for line in (out / "records.jsonl").read_bytes().splitlines()]
    measured = [r for r in rows if not r["warmup"]]
    served = standin.sequences[2:]  # the warm-up request's two sequences come first
    assert len(served) == 2 * N
    for row in measured:
        assert row["spec_decode_status"] == "ok", row["spec_decode_message"]
        choices = row["spec_decode_choices"]
        assert sorted(choices) == ["0", "1"]
        total = row["spec_decode_acceptance"]
        assert total["num_spec_steps"] == sum(c["num_spec_steps"] for c in choices.values())
        assert total["draft_unit"] == "paths"
    # each choice's record is its own sequence's (the stand-in serves requests one at a time
    # per connection, but order across requests is the client's: match by content)
    got = sorted(
        (c["num_spec_steps"], c["num_accepted_draft_tokens"], c["num_draft_tokens"])
        for r in measured for c in r["spec_decode_choices"].values()
    )  # fmt: skip
    want = sorted((s.steps, s.accepted, s.drafted) for s in served)
    assert got == want
    assert any(r["spec_decode_choices"]["0"] != r["spec_decode_choices"]["1"] for r in measured)
    summary = orjson.loads((out / "summary.json").read_bytes())
    acc = summary["figures"]["acceptance"]
    steps = sum(s.steps for s in served)
    accepted = sum(s.accepted for s in served)
    assert acc["verify_steps"] == steps
    assert acc["token_weighted_al"] == pytest.approx(1 + accepted / steps)
    assert acc["inconsistent_requests"] == []
    check = summary["server_check"]
    assert check["available"] and check["consistent"], check
    assert check["source"] == "metrics:trtllm-iteration-stats" and check["drained"]
    assert check["server_delta"]["drafts"] == steps
    assert check["server_al"] == pytest.approx(1 + accepted / steps)


def test_iteration_stats_are_increments_since_the_last_read() -> None:
    """The scrape before the run drains the queue; the one after it is the run's whole delta."""
    stats = [
        {"iter": 1, "specDecodingStats": {"numDraftTokens": 6, "numAcceptedTokens": 4,
                                          "numRequestsWithDraftTokens": 2}},
        {"iter": 2},  # an iteration without speculation
        {"iter": 3, "specDecodingStats": {"numDraftTokens": 3, "numAcceptedTokens": 1,
                                          "numRequestsWithDraftTokens": 1}},
    ]  # fmt: skip
    after = parse_metrics(orjson.dumps(stats).decode())
    assert after is not None and after["drained"]
    assert (after["drafts"], after["draft_tokens"], after["accepted_tokens"]) == (3, 9, 5)
    before = parse_metrics("[]")
    assert before is not None and before["drafts"] == 0
    client = {"verify_steps": 3, "draft_tokens": 9, "accepted_tokens": 5}
    check = cross_check({**after, "drafts": 100.0}, after, client)  # "before" is not subtracted
    assert check["consistent"] and check["server_al"] == pytest.approx(1 + 5 / 3)
    assert parse_metrics(orjson.dumps([{"iter": 1}]).decode()) is None  # no speculation at all
