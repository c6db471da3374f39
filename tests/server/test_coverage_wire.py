"""Draft coverage on the wire: a real ``speclens serve`` with the n-gram drafter reports decode
steps per request, ``/debug/mtp_stats`` and ``/metrics`` report them engine-wide, and ``speclens
bench`` pools them into the same coverage the server counted."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

import launch
from serverkit import ServerProcess, metric, mtp_stats, scrape, sse_json

pytestmark = pytest.mark.integration

K = 3
NGRAM = [
    "--speculative-config",
    json.dumps(
        {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 2,
         "prompt_lookup_max": 3}
    ),
    "--per-request-spec-decode-stats",
    "detailed",
]  # fmt: skip
#: Prompts the lookup matches often, and prompts with no repeated bigram (it finds nothing until
#: the output repeats), so both kinds of decode step occur.
TEXTS = [
    "def add(a, b): return a + b. def add(a, b): return",
    "for i in range(10): print(i) for i in range(10):",
    "Once upon a time there was a cat. Once upon a time",
    "Quick zephyrs blow, vexing daft Jim.",
    "Sphinx of black quartz, judge my vow!",
    "2 + 2 = 4, 3 + 3 = 6, 4 + 4 =",
]
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def servers(serve: Any) -> tuple[ServerProcess, ServerProcess]:
    """Two n-gram servers: one for single requests, one left fresh for the bench run."""
    wire, fresh = serve(NGRAM, NGRAM)
    return wire, fresh


def _counts(base: str) -> tuple[float, float, float]:
    """(decode steps, verify steps, accepted drafts) from /metrics."""
    m = scrape(base)
    return (
        metric(m, "speclens:decode_steps_total"),
        metric(m, "vllm:spec_decode_num_drafts_total"),
        metric(m, "vllm:spec_decode_num_accepted_tokens_total"),
    )


def _check(stats: dict[str, Any], root: dict[str, Any], completion_tokens: int) -> None:
    """Both wire shapes carry the same decode steps; the verify steps are a subset of them; and
    the tokens add up: 1 from prefill plus accepted + 1 per decode step, the last step cut by at
    most K at max_tokens."""
    decode = stats["num_decode_steps"]
    assert root["speculative_decoding"]["num_decode_steps"] == decode
    assert len(stats["per_step_drafted"]) == stats["num_spec_steps"] <= decode
    assert all(d > 0 for d in stats["per_step_drafted"])
    emitted = 1 + decode + stats["num_accepted_draft_tokens"]
    assert emitted - K <= completion_tokens == MAX_TOKENS <= emitted


def test_per_request_decode_steps_match_the_servers_counters(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    url = servers[0].url
    body = {"model": "dummy", "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0}
    spec_steps = decode_steps = 0
    for text in TEXTS[3:5]:
        before = _counts(url)
        r = httpx.post(url + "/v1/completions", json={**body, "prompt": text}, timeout=120)
        assert r.status_code == 200, r.text
        data = r.json()
        stats = data["choices"][0]["speculative_decoding_stats"]
        _check(stats, data["metrics"], data["usage"]["completion_tokens"])
        after = _counts(url)
        assert after[0] - before[0] == stats["num_decode_steps"]
        assert after[1] - before[1] == stats["num_spec_steps"]
        spec_steps += stats["num_spec_steps"]
        decode_steps += stats["num_decode_steps"]
    assert spec_steps < decode_steps  # these prompts leave steps without drafts
    chunks = sse_json(
        httpx.post(
            url + "/v1/completions",
            json={**body, "prompt": TEXTS[0], "stream": True,
                  "stream_options": {"include_usage": True}},
            timeout=120,
        ).content
    )  # fmt: skip
    stats = next(
        c["choices"][0]["speculative_decoding_stats"]
        for c in chunks
        if c["choices"] and c["choices"][0].get("speculative_decoding_stats")
    )
    root = next(c["metrics"] for c in chunks if c.get("metrics"))
    usage = next(c["usage"] for c in chunks if c.get("usage"))
    _check(stats, root, usage["completion_tokens"])


def test_bench_pools_the_coverage_the_server_counted(
    servers: tuple[ServerProcess, ServerProcess], tmp_path: Path
) -> None:
    """On a server that served nothing before, /debug/mtp_stats' draft_coverage after the run is
    the run's own; the bench's pooled figure (sum verify steps / sum decode steps) must equal it,
    and the /metrics deltas, exactly."""
    url = servers[1].url
    start = mtp_stats(url)
    assert start["distribution"] == {} and start["draft_coverage"] == 0.0
    assert _counts(url) == (0.0, 0.0, 0.0)
    data = tmp_path / "questions.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question_id": i, "category": "x", "turns": [t]}) + "\n"
            for i, t in enumerate(TEXTS)
        )
    )
    out = tmp_path / "run"
    done = launch.run(
        [sys.executable, "-m", "speclens", "bench", "--url", url, "--model", "dummy",
         "--dataset", "jsonl", "--dataset-path", str(data), "--max-tokens", str(MAX_TOKENS),
         "--ignore-eos", "--num-requests", str(len(TEXTS)), "--concurrency", "3",
         "--output-dir", str(out)],
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    acc = json.loads((out / "summary.json").read_text())["figures"]["acceptance"]
    after = mtp_stats(url)
    decode, verify, accepted = _counts(url)
    assert acc["draft_coverage_requests"] == acc["requests_with_stats"] == len(TEXTS)
    assert acc["decode_steps"] == decode
    assert acc["verify_steps"] == verify == sum(after["distribution"].values())
    assert acc["draft_coverage"] == after["draft_coverage"] == verify / decode
    assert acc["tokens_per_decode_step"] == 1 + accepted / decode
    assert 0.0 < acc["draft_coverage"] < 1.0, acc
    assert "draft coverage" in done.stdout and "tokens per decode step" in done.stdout
