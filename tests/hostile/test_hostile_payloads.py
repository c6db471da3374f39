"""`speclens bench` against a server that answers with garbage: every request ends as a record
(failed with a message, or degraded with a note), the run's files are written, no traceback."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from garbage_server import GarbageServer, Reply, sse

from speclens.bench.client import LoadConfig, LoadGenerator
from speclens.bench.datasets import Prompt

pytestmark = pytest.mark.timeout(60)


def chunk(text: str = "a", usage: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A plain completions stream chunk."""
    out: dict[str, Any] = {
        "id": "x",
        "object": "text_completion",
        "choices": [{"index": 0, "text": text, "finish_reason": None}],
        **extra,
    }
    if usage is not None:
        out["usage"] = usage
    return out


def usage(completion: object, prompt: object = 4) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion}


def bench(run_cli, server: GarbageServer, out: Path, *args: str) -> tuple[int, str, list[dict]]:
    """Run `speclens bench` on one request; returns (exit code, all output, records)."""
    code, stdout, stderr = run_cli(
        "bench", "--url", server.url, "--model", "m", "--num-requests", "1",
        "--max-tokens", "16", "--output-dir", out, *args,
    )  # fmt: skip
    text = stdout + stderr
    assert "Traceback" not in text
    assert (out / "summary.json").exists(), text
    rows = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    return code, text, rows


def summary(out: Path) -> dict[str, Any]:
    return json.loads((out / "summary.json").read_text())["figures"]


def test_string_completion_tokens_degrade_the_request(run_cli, tmp_path: Path) -> None:
    reply = Reply(
        chunks=sse(chunk("a", usage("1")), chunk("b", usage("2")), chunk("", usage("12")))
    )
    with GarbageServer(reply) as server:
        _, _, rows = bench(run_cli, server, tmp_path)
    (row,) = rows
    assert row["success"] is True
    assert row["completion_tokens"] is None
    assert "usage.completion_tokens: not an integer: '12'" in row["anomalies"]
    figures = summary(tmp_path)
    assert figures["requests"]["anomalies"] == {"usage.completion_tokens": 1}
    assert figures["throughput"]["total_output_tokens"] == 0


def test_string_completion_tokens_without_streaming(run_cli, tmp_path: Path) -> None:
    body = json.dumps(chunk("abc", usage("12", prompt=[1]))).encode()
    with GarbageServer(Reply(body=body)) as server:
        _, _, rows = bench(run_cli, server, tmp_path, "--no-stream")
    (row,) = rows
    assert row["success"] is True
    assert (row["prompt_tokens"], row["completion_tokens"]) == (None, None)
    assert "usage.prompt_tokens: not an integer: [1]" in row["anomalies"]


@pytest.mark.parametrize("claim", [10**6, 10**9])
def test_a_token_jump_is_not_believed(run_cli, tmp_path: Path, claim: int) -> None:
    reply = Reply(
        chunks=sse(chunk("a", usage(1)), chunk("b", usage(2)), chunk("c", usage(claim))),
        chunk_delay=0.01,
    )
    with GarbageServer(reply) as server:
        _, _, rows = bench(run_cli, server, tmp_path)
    assert (tmp_path / "records.jsonl").stat().st_size < 100_000
    (row,) = rows
    assert row["completion_tokens"] is None
    assert f"usage.completion_tokens: {claim} is beyond the bound 48" in row["anomalies"]
    assert sum(n for _, n in row["itl_runs_s"]) <= 3


@pytest.mark.parametrize("claim", [10**6, 10**9])
def test_a_token_jump_costs_constant_memory_without_max_tokens(claim: int) -> None:
    """With no max_tokens to bound it, a huge claim is believed but stored as one run."""
    reply = Reply(
        chunks=sse(chunk("a", usage(1)), chunk("b", usage(2)), chunk("c", usage(claim))),
        chunk_delay=0.01,
    )
    config = LoadConfig(url="", model="m", num_requests=1, concurrency=1, max_tokens=None)
    with GarbageServer(reply) as server:
        config.url = server.url
        result = asyncio.run(LoadGenerator(config, [Prompt("hi", "x")]).run())
    (record,) = result.records
    assert record.success and record.completion_tokens == claim
    assert len(record.itl_runs) == 2 and record.itl_runs[-1][1] == claim - 2


def test_a_stream_of_non_json_events_fails(run_cli, tmp_path: Path) -> None:
    with GarbageServer(Reply(chunks=sse("not json", "{broken", "still not"))) as server:
        _, _, rows = bench(run_cli, server, tmp_path)
    (row,) = rows
    assert row["success"] is False
    assert row["error"] == "no parseable content chunk: 3 unparsable of 3 SSE events"
    assert row["unparsable_events"] == 3
    assert summary(tmp_path)["requests"]["failed"] == 1


def test_non_json_events_among_good_chunks_are_counted(run_cli, tmp_path: Path) -> None:
    reply = Reply(chunks=sse(chunk("a", usage(1)), "junk", chunk("b", usage(2)), "more junk"))
    with GarbageServer(reply) as server:
        _, _, rows = bench(run_cli, server, tmp_path)
    (row,) = rows
    assert row["success"] is True and row["completion_tokens"] == 2
    assert row["unparsable_events"] == 2
    assert summary(tmp_path)["requests"]["unparsable_events"] == 2


def test_choices_as_a_string_fails(run_cli, tmp_path: Path) -> None:
    with GarbageServer(Reply(chunks=sse({"choices": "oops"}))) as server:
        _, _, rows = bench(run_cli, server, tmp_path)
    (row,) = rows
    assert row["success"] is False
    assert row["error"] == "no parseable content chunk: 1 unparsable of 1 SSE events"


def test_choices_as_a_number_fails_streaming(run_cli, tmp_path: Path) -> None:
    with GarbageServer(Reply(chunks=sse({"choices": 5, "usage": usage(3)}))) as server:
        _, _, rows = bench(run_cli, server, tmp_path)
    (row,) = rows
    assert row["success"] is False
    assert row["error"] == "no parseable content chunk: 1 unparsable of 1 SSE events"


def test_choices_as_a_number_fails_without_streaming(run_cli, tmp_path: Path) -> None:
    with GarbageServer(Reply(body=b'{"choices": 5}')) as server:
        _, _, rows = bench(run_cli, server, tmp_path, "--no-stream")
    (row,) = rows
    assert row["success"] is False
    assert row["error"] == (
        "no parseable content chunk in the response body (choices is not a list of objects)"
    )


def test_a_non_utf8_error_body_fails_with_its_text(run_cli, tmp_path: Path) -> None:
    with GarbageServer(Reply(500, body=b"\xff\xfe boom \x80")) as server:
        _, _, rows = bench(run_cli, server, tmp_path)
    (row,) = rows
    assert row["success"] is False
    assert row["error"] == "HTTP 500: \ufffd\ufffd boom \ufffd"


def test_a_non_utf8_dataset_is_one_line_naming_file_and_line(run_cli, tmp_path: Path) -> None:
    data = tmp_path / "bad.jsonl"
    good = b'{"question_id": 1, "category": "x", "turns": ["hi"]}\n'
    data.write_bytes(good + b'{"category": "x", "turns": ["\xff"]}\n' + good)
    code, stdout, stderr = run_cli(
        "bench", "--url", "http://127.0.0.1:9", "--model", "m",
        "--dataset", "jsonl", "--dataset-path", data,
    )  # fmt: skip
    assert code == 1
    assert "Traceback" not in stdout + stderr
    assert stderr.strip() == f"{data}: line 2: not UTF-8 text (byte 0xff at offset 29)"


def test_an_overlong_dataset_line_is_refused(run_cli, tmp_path: Path) -> None:
    data = tmp_path / "long.jsonl"
    data.write_bytes(b'{"category": "x", "turns": ["' + b"a" * (5 * 2**20) + b'"]}\n')
    code, _, stderr = run_cli(
        "bench", "--url", "http://127.0.0.1:9", "--model", "m",
        "--dataset", "jsonl", "--dataset-path", data,
    )  # fmt: skip
    assert code == 1
    assert stderr.strip() == f"{data}: line 1: longer than 4194304 bytes"


def test_an_endless_sse_line_fails_the_request_within_a_bound(run_cli, tmp_path: Path) -> None:
    reply = Reply(chunks=[b"data: " + b"x" * 2**20] * 17)  # 17 MiB, no line end
    with GarbageServer(reply) as server:
        _, _, rows = bench(run_cli, server, tmp_path)
    (row,) = rows
    assert row["success"] is False
    assert row["error"] == "SSEError: an SSE event exceeds 16777216 characters"


def test_an_oversized_body_fails_the_request(
    run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("speclens.bench.transport.MAX_BODY_BYTES", 1000)
    body = json.dumps(chunk("a" * 5000, usage(1))).encode()
    with GarbageServer(Reply(body=body)) as server:
        _, _, rows = bench(run_cli, server, tmp_path, "--no-stream")
    (row,) = rows
    assert row["success"] is False
    assert row["error"] == "the response body exceeds 1000 bytes"
    assert row["raw"] == []


def test_a_falling_completion_count_is_not_believed(run_cli, tmp_path: Path) -> None:
    reply = Reply(chunks=sse(chunk("a", usage(1)), chunk("b", usage(5)), chunk("c", usage(3))))
    with GarbageServer(reply) as server:
        _, _, rows = bench(run_cli, server, tmp_path)
    (row,) = rows
    assert row["success"] is True and row["completion_tokens"] is None
    assert row["anomalies"] == ["usage.completion_tokens: fell from 5 to 3"]


def test_a_count_beyond_2_31_is_not_believed_even_without_max_tokens() -> None:
    reply = Reply(chunks=sse(chunk("a", usage(1)), chunk("b", usage(2**31 + 1))))
    config = LoadConfig(url="", model="m", num_requests=1, concurrency=1, max_tokens=None)
    with GarbageServer(reply) as server:
        config.url = server.url
        result = asyncio.run(LoadGenerator(config, [Prompt("hi", "x")]).run())
    (record,) = result.records
    assert record.success and record.completion_tokens is None
    assert record.anomalies == [
        "usage.completion_tokens: 2147483649 is beyond the bound 2147483648"
    ]
    assert [n for _, n in record.itl_runs] == [1]  # its content counts one token


def test_an_error_object_in_the_stream_fails_the_request(run_cli, tmp_path: Path) -> None:
    reply = Reply(chunks=sse(chunk("a", usage(1)), {"error": {"message": "engine died"}}))
    with GarbageServer(reply) as server:
        _, _, rows = bench(run_cli, server, tmp_path)
    (row,) = rows
    assert row["success"] is False
    assert row["error"] == "the server sent an error: {'message': 'engine died'}"
