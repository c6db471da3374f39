"""``bench --backend sglang`` against the SGLang stand-in (``standin_sglang.py``, written from
SGLang's ``entrypoints/http_server.py``, ``entrypoints/openai/serving_chat.py`` /
``serving_completions.py`` / ``utils.py`` and ``managers/tokenizer_manager.py``): every route and
mode gives correct records, and the run's totals equal the stand-in's own tally."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from standin_sglang import running

from speclens.bench.client import LoadConfig, RequestRecord
from speclens.bench.datasets import random_prompts
from speclens.bench.run import run_bench

N, MAX_TOKENS = 8, 24


def bench(url: str, endpoint: str, stream: bool, backend: str = "sglang") -> list[RequestRecord]:
    config = LoadConfig(
        url=url, model="m", endpoint=endpoint, backend=backend, num_requests=N,  # type: ignore[arg-type]
        concurrency=4, max_tokens=MAX_TOKENS, stream=stream,
    )  # fmt: skip
    outcome = asyncio.run(run_bench(config, random_prompts(N, 8, MAX_TOKENS, seed=1)))
    return outcome.records


@pytest.mark.parametrize(
    ("endpoint", "stream"),
    [("completions", False), ("chat", False), ("completions", True), ("chat", True),
     ("native", False), ("native", True)],
)  # fmt: skip
def test_every_route_gives_records_whose_totals_match_the_standin(
    endpoint: str, stream: bool
) -> None:
    with running(seed=3) as server:
        records = bench(server.url, endpoint, stream)
        tally = server.tally
    assert [r.error for r in records] == [None] * N
    assert {(r.spec_status, r.spec_adapter) for r in records} == {("ok", "sglang-meta-info")}
    specs = [r.spec for r in records if r.spec is not None]
    assert sum(s["num_spec_steps"] for s in specs) == tally.verify_steps > 0
    assert sum(s["num_accepted_draft_tokens"] for s in specs) == tally.accepted
    assert sum(s["num_draft_tokens"] for s in specs) == tally.proposed
    assert (
        sum(r.completion_tokens or 0 for r in records) == tally.completion_tokens == N * MAX_TOKENS
    )
    for r in records:
        assert r.ttft is not None and r.latency is not None and 0 < r.ttft <= r.latency
        spec = r.spec or {}
        # AL comes from the histogram (1 + accepted / steps), never SGLang's spec_accept_length.
        assert spec["mean_acceptance_length"] == pytest.approx(
            1 + spec["num_accepted_draft_tokens"] / spec["num_spec_steps"]
        )
        assert spec["num_spec_tokens"] is None
        if stream:  # every token after the first arrives in a gap the client measured
            assert r.itl_runs and sum(n for _, n in r.itl_runs) == r.completion_tokens - 1


def test_the_client_asks_for_the_stats_the_way_sglang_allows() -> None:
    """return_meta_info only when not streaming (SGLang refuses it with a stream: 400);
    return_spec_tokens_details always on the OpenAI routes; nothing extra on /generate."""
    with running() as server:
        bench(server.url, "completions", True)
        bench(server.url, "chat", False)
        bench(server.url, "native", True)
        bodies = server.tally.bodies
    streamed, whole, native = bodies[:N], bodies[N : 2 * N], bodies[2 * N :]
    assert all(b["return_spec_tokens_details"] and "return_meta_info" not in b for b in streamed)
    assert all(b["return_spec_tokens_details"] and b["return_meta_info"] for b in whole)
    assert all(set(b) == {"text", "sampling_params", "stream"} for b in native)
    assert all(b["sampling_params"]["max_new_tokens"] == MAX_TOKENS for b in native)


def test_the_standin_refuses_return_meta_info_when_streaming() -> None:
    """The refusal the client avoids, as SGLang words it."""
    import httpx

    with running() as server:
        body = {"model": "m", "prompt": "x", "stream": True, "return_meta_info": True}
        resp = httpx.post(server.url + "/v1/completions", json=body)
    assert resp.status_code == 400
    assert "return_meta_info is not supported with streaming" in resp.json()["message"]


def test_auto_detects_sglang_before_the_run_and_records_it(run_cli, tmp_path: Path) -> None:
    with running() as server:
        code, _, err = run_cli(
            "bench", "--url", server.url, "--model", "m", "--num-requests", N,
            "--max-tokens", MAX_TOKENS, "--output-dir", tmp_path,
        )  # fmt: skip
        tally = server.tally
    assert code == 0, err
    settings = json.loads((tmp_path / "summary.json").read_text())["settings"]
    assert (settings["backend"], settings["backend_requested"]) == ("sglang", "auto")
    assert "/get_model_info" in settings["backend_evidence"]
    rows = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    steps = sum(row["spec_decode_acceptance"]["num_spec_steps"] for row in rows)
    assert steps == tally.verify_steps and tally.requests == N


def test_sglangs_gauges_are_reported_as_gauges_not_as_missing_counters(
    run_cli, tmp_path: Path
) -> None:
    """SGLang's Prometheus has acceptance gauges only: the cross-check says so, not "no
    counters", and does not pretend to a delta."""
    with running() as server:
        code, _, err = run_cli(
            "bench", "--url", server.url, "--model", "m", "--num-requests", N,
            "--max-tokens", MAX_TOKENS, "--output-dir", tmp_path,
        )  # fmt: skip
    assert code == 0, err
    check = json.loads((tmp_path / "summary.json").read_text())["server_check"]
    assert not check["available"]
    assert check["note"] == (
        "the server exposes gauges only (sglang:spec_accept_length, sglang:spec_accept_rate): "
        "no delta possible"
    )


def test_native_with_backend_openai_is_a_usage_error(run_cli) -> None:
    code, _, err = run_cli(
        "bench", "--url", "http://127.0.0.1:9", "--model", "m", "--endpoint", "native",
        "--backend", "openai",
    )  # fmt: skip
    assert code == 2
    assert err.strip() == (
        "command line: --endpoint: native needs --backend sglang, llamacpp or auto, got --backend openai"
    )


def test_native_with_auto_and_no_engine_found_is_a_usage_error(run_cli) -> None:
    code, _, err = run_cli(
        "bench", "--url", "http://127.0.0.1:9", "--model", "m", "--endpoint", "native",
        "--no-preflight",
    )  # fmt: skip
    assert code == 2
    assert err.startswith("command line: --endpoint: native needs an SGLang or llama.cpp server")
    assert len(err.strip().splitlines()) == 1
