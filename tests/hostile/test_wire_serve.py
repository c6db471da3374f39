"""``speclens serve`` on the wire as vLLM 0.32 puts it (issue 14, item 7).

Upstream facts, read in vLLM 0.32.0's source:
- ``vllm/entrypoints/openai/completion/serving.py`` and ``.../chat_completion/serving.py``: in a
  stream, the root ``metrics`` (``speculative_decoding``) rides only the final usage chunk, which
  is sent only when ``stream_options.include_usage`` is true or the server runs with
  ``--enable-force-include-usage``; ``vllm/entrypoints/serve/utils/api_utils.py``
  (``should_include_usage``): continuous usage needs include_usage, and the flag forces both.
- ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``) and ``vllm/v1/spec_decode/metrics.py``:
  every ``vllm:`` family is labelled ``model_name`` (the served name) and ``engine`` (the engine
  index, ``"0"`` for one engine).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import launch
from serverkit import (
    FORCED,
    ServerProcess,
    check_choice_stats,
    check_root_metrics,
    running_servers,
    sse_json,
)

pytestmark = pytest.mark.integration

SERVED = "served-x"
BASE = [*FORCED, "--executor", "sim", "--served-model-name", SERVED,
        "--per-request-spec-decode-stats", "detailed"]  # fmt: skip
MESSAGES = [{"role": "user", "content": "Name a prime number."}]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    """vLLM's default, and ``--enable-force-include-usage``."""
    with running_servers(
        tmp_path_factory.mktemp("wire-serve"), BASE, [*BASE, "--enable-force-include-usage"]
    ) as (plain, forced):
        yield {"plain": plain, "forced": forced}


def _stream(server: ServerProcess, endpoint: str, **extra: Any) -> list[dict[str, Any]]:
    body: dict[str, Any] = {"model": SERVED, "max_tokens": 24, "ignore_eos": True,
                            "stream": True, **extra}  # fmt: skip
    if endpoint == "chat":
        body["messages"] = MESSAGES
        path = "/v1/chat/completions"
    else:
        body["prompt"] = "Speculative decoding drafts tokens."
        path = "/v1/completions"
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return sse_json(r.content)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize("options", [None, {"include_usage": False}])
def test_no_root_metrics_in_a_stream_without_include_usage(
    servers: dict[str, ServerProcess], endpoint: str, options: Any
) -> None:
    """The reproduction: without include_usage, speclens put ``metrics`` on the finishing chunk;
    vLLM sends no usage chunk and so no root metrics at all."""
    extra = {} if options is None else {"stream_options": options}
    chunks = _stream(servers["plain"], endpoint, **extra)
    assert all(ch["choices"] for ch in chunks)  # no usage chunk
    assert [ch for ch in chunks if "metrics" in ch] == []
    assert all("usage" not in ch for ch in chunks)
    # The per-choice object (not a vLLM field) still rides the finishing chunk.
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    check_choice_stats(chunks[-1]["choices"][0]["speculative_decoding_stats"], "detailed")


def test_continuous_usage_needs_include_usage(servers: dict[str, ServerProcess]) -> None:
    """vLLM's ``should_include_usage``: continuous_usage_stats alone adds no usage."""
    alone = _stream(servers["plain"], "completions",
                    stream_options={"continuous_usage_stats": True})  # fmt: skip
    assert all("usage" not in ch for ch in alone)
    both = _stream(servers["plain"], "completions",
                   stream_options={"include_usage": True, "continuous_usage_stats": True})  # fmt: skip
    *content, last = both
    assert all("usage" in ch for ch in content) and last["choices"] == []
    check_root_metrics(
        last["metrics"],
        check_choice_stats(content[-1]["choices"][0]["speculative_decoding_stats"], "detailed"),
        "detailed",
    )


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_force_include_usage_ends_every_stream_with_usage_and_metrics(
    servers: dict[str, ServerProcess], endpoint: str
) -> None:
    """``--enable-force-include-usage``: the usage chunk (with the root metrics) and per-chunk
    usage, whatever the request asked."""
    chunks = _stream(servers["forced"], endpoint, stream_options={"include_usage": False})
    *content, last = chunks
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 24
    assert all("usage" in ch for ch in content)
    assert [ch for ch in content if "metrics" in ch] == []
    stats = check_choice_stats(content[-1]["choices"][0]["speculative_decoding_stats"], "detailed")
    check_root_metrics(last["metrics"], stats, "detailed")


def test_non_streamed_responses_keep_root_metrics(servers: dict[str, ServerProcess]) -> None:
    r = httpx.post(servers["plain"].url + "/v1/completions",
                   json={"prompt": "x y", "max_tokens": 12, "ignore_eos": True}, timeout=60)  # fmt: skip
    data = r.json()
    stats = check_choice_stats(data["choices"][0]["speculative_decoding_stats"], "detailed")
    check_root_metrics(data["metrics"], stats, "detailed")


def _samples(server: ServerProcess) -> list[Any]:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def test_vllm_families_carry_engine_and_model_name(servers: dict[str, ServerProcess]) -> None:
    """The reproduction: speclens labelled ``vllm:`` families with ``model_name`` only."""
    _stream(servers["plain"], "completions")  # so every family, histograms included, has samples
    samples = _samples(servers["plain"])
    vllm = [s for s in samples if s.name.startswith("vllm:")]
    names = {s.name for s in vllm}
    for family in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                   "vllm:spec_decode_num_accepted_tokens_total",
                   "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                   "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
                   "vllm:request_success_total", "vllm:num_requests_running",
                   "vllm:time_to_first_token_seconds_count"):  # fmt: skip
        assert family in names, family
    for s in vllm:
        assert s.labels.get("engine") == "0", s
        assert s.labels.get("model_name") == SERVED, s
    # ATOM's and speclens's own families keep model_name and gain no engine label.
    others = [s for s in samples if s.name.startswith(("atom:", "speclens:"))]
    assert others
    assert all(s.labels.get("model_name") == SERVED and "engine" not in s.labels for s in others)


def test_bench_against_serve_matches_the_labelled_counters(
    servers: dict[str, ServerProcess], tmp_path: Path
) -> None:
    """``speclens bench`` reads the engine-labelled counters: its totals equal the server's delta,
    position by position."""
    data = tmp_path / "q.jsonl"
    data.write_text("".join(
        json.dumps({"question_id": i, "category": "x", "turns": [f"Question {i} about primes."]})
        + "\n" for i in range(4)
    ))  # fmt: skip
    out = tmp_path / "run"
    done = launch.run(
        [sys.executable, "-m", "speclens", "bench", "--url", servers["plain"].url,
         "--model", SERVED, "--dataset", "jsonl", "--dataset-path", str(data),
         "--max-tokens", "16", "--ignore-eos", "--num-requests", "4", "--concurrency", "2",
         "--output-dir", str(out)],
        timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    check = json.loads((out / "summary.json").read_text())["server_check"]
    assert check["available"] and check["source"] == "metrics:vllm", check
    assert check["consistent"] and check["flags"] == [], check
    assert check["server_delta"] == check["client_totals"], check
    assert check["server_delta"]["drafts"] > 0
    per = check["per_position"]
    assert per["server_accepted"] == per["client_accepted"], per
