"""``GET /debug/mtp_stats`` and ``GET /metrics`` after a batch of forced-acceptance requests:
the realized AL sits where the schedule puts it, and every view of the counters agrees exactly
with the per-request stats of the requests that produced them."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import aiohttp
import httpx
import pytest

from serverkit import (
    AL,
    FORCED,
    K,
    ServerProcess,
    check_choice_stats,
    check_root_metrics,
    check_token_count,
    families,
    labelled,
    metric,
    mtp_stats,
    scrape,
    sse_json,
)

pytestmark = pytest.mark.integration

MTP_KEYS = {
    "enabled",
    "total_draft_tokens",
    "total_accepted_tokens",
    "acceptance_rate",
    "average_tokens_per_forward",
    "distribution",
    "distribution_percent",
    "draft_coverage",
    "request_spread",
}
NUM_REQUESTS = 16
MAX_TOKENS = 128


@pytest.fixture(scope="module")
def servers(serve: Any) -> tuple[ServerProcess, ...]:
    """A forced server with detailed stats, and a plain one (no speculation)."""
    return tuple(serve([*FORCED, "--per-request-spec-decode-stats", "detailed"], []))


async def _one(session: aiohttp.ClientSession, base: str, i: int) -> dict[str, Any]:
    """One request of the batch, in one of four shapes; returns what the client saw."""
    chat, stream = i % 2 == 0, i % 4 < 2
    body: dict[str, Any] = {"max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if chat:
        body["messages"] = [{"role": "user", "content": f"request {i}: count to ten"}]
        url = base + "/v1/chat/completions"
    else:
        body["prompt"] = f"request {i}: once upon a time"
        url = base + "/v1/completions"
    async with session.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        raw = await resp.read()
    if stream:
        chunks = sse_json(raw)
        finishing = chunks[-2]["choices"][0]
        return {
            "finish_reason": finishing["finish_reason"],
            "stats": finishing["speculative_decoding_stats"],
            "root": chunks[-1]["metrics"],
            "usage": chunks[-1]["usage"],
        }
    data = json.loads(raw)
    return {
        "finish_reason": data["choices"][0]["finish_reason"],
        "stats": data["choices"][0]["speculative_decoding_stats"],
        "root": data["metrics"],
        "usage": data["usage"],
    }


async def _batch(base: str) -> list[dict[str, Any]]:
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        return await asyncio.gather(*(_one(session, base, i) for i in range(NUM_REQUESTS)))


@pytest.fixture(scope="module")
def batch(servers: tuple[ServerProcess, ...]) -> dict[str, Any]:
    """Scrape, run 16 concurrent requests (max_tokens 128, ignore_eos), scrape again."""
    base = servers[0].url
    before = {"mtp": mtp_stats(base), "metrics": scrape(base)}
    results = asyncio.run(_batch(base))
    after = {"mtp": mtp_stats(base), "metrics": scrape(base)}
    return {"before": before, "after": after, "results": results}


def test_mtp_stats_keys_exactly(servers: tuple[ServerProcess, ...]) -> None:
    for server in servers:
        assert set(mtp_stats(server.url)) == MTP_KEYS


def test_mtp_stats_without_speculation(servers: tuple[ServerProcess, ...]) -> None:
    plain = servers[1]
    r = httpx.post(plain.url + "/v1/completions", json={"prompt": "x", "max_tokens": 5}, timeout=60)
    assert r.status_code == 200
    assert "speculative_decoding_stats" not in r.json()["choices"][0]
    stats = mtp_stats(plain.url)
    assert stats["enabled"] is False
    assert stats["total_draft_tokens"] == 0 and stats["distribution"] == {}
    # ATOM's empty state (atom/model_engine/llm_engine.py): 0.0 over no verify step.
    assert stats["average_tokens_per_forward"] == 0.0
    assert stats["draft_coverage"] == 0.0  # 4 decode steps, none drafted
    assert metric(scrape(plain.url), "speclens:decode_steps_total") >= 4
    names = families(plain.url)
    assert not any(name.startswith("vllm:spec_decode") for name in names)
    assert not any(name.startswith("atom:") for name in names)
    assert "vllm:num_requests_running" in names


def test_every_request_finished_with_its_stats(batch: dict[str, Any]) -> None:
    for result in batch["results"]:
        assert result["finish_reason"] == "length"
        stats = check_choice_stats(result["stats"], "detailed")
        check_root_metrics(result["root"], stats, "detailed")
        check_token_count(stats, result["usage"]["completion_tokens"], MAX_TOKENS)


def test_mtp_stats_shape_and_internal_consistency(batch: dict[str, Any]) -> None:
    after = batch["after"]["mtp"]
    assert after["enabled"] is True
    dist = after["distribution"]
    assert set(dist) == {"2", "3"}  # the 22 % / 78 % split, and never anything else
    steps = sum(dist.values())
    accepted = sum(int(j) * n for j, n in dist.items())
    assert after["total_accepted_tokens"] == accepted
    assert after["total_draft_tokens"] == K * steps
    # Unrounded, as ATOM reports them (ROCm/ATOM atom/model_engine/llm_engine.py).
    assert after["acceptance_rate"] == accepted / (K * steps)
    assert after["average_tokens_per_forward"] == 1 + accepted / steps
    assert set(after["distribution_percent"]) == set(dist)
    for j, n in dist.items():
        assert after["distribution_percent"][j] == n / steps
    assert after["draft_coverage"] == 1.0  # a draft model drafts K at every decode step


def test_realized_acceptance_length_within_four_standard_errors(batch: dict[str, Any]) -> None:
    """Each verify step of the schedule [1, 1, 0.78, 0, ...] emits 1 + 2 + B tokens, B a
    Bernoulli(0.78): the mean is 3.78 and the variance per step is p(1 - p) = 0.78 * 0.22 =
    0.1716. Over N independent steps the realized mean has standard error sqrt(0.1716 / N)
    (about 0.018 for the ~540 steps of this batch), so 4 SE is a 1-in-15 000 false alarm."""
    after = batch["after"]["mtp"]
    n = sum(after["distribution"].values())
    assert n >= 300
    se = math.sqrt(0.78 * 0.22 / n)
    realized = after["average_tokens_per_forward"]
    assert abs(realized - AL) <= 4 * se, (realized, se, n)
    share = after["distribution"]["3"] / n
    assert abs(share - 0.78) <= 4 * math.sqrt(0.78 * 0.22 / n)


def test_per_request_stats_add_up_to_the_mtp_stats_delta(batch: dict[str, Any]) -> None:
    before, after = batch["before"]["mtp"], batch["after"]["mtp"]
    stats = [r["stats"] for r in batch["results"]]
    assert sum(s["num_draft_tokens"] for s in stats) == (
        after["total_draft_tokens"] - before["total_draft_tokens"]
    )
    assert sum(s["num_accepted_draft_tokens"] for s in stats) == (
        after["total_accepted_tokens"] - before["total_accepted_tokens"]
    )
    for j in ("2", "3"):
        assert sum(s["acceptance_histogram"].get(j, 0) for s in stats) == (
            after["distribution"].get(j, 0) - before["distribution"].get(j, 0)
        )


def test_metrics_agree_with_mtp_stats(batch: dict[str, Any]) -> None:
    mtp, m = batch["after"]["mtp"], batch["after"]["metrics"]
    steps = sum(mtp["distribution"].values())
    assert metric(m, "vllm:spec_decode_num_drafts_total") == steps
    assert metric(m, "vllm:spec_decode_num_draft_tokens_total") == mtp["total_draft_tokens"]
    assert metric(m, "vllm:spec_decode_num_accepted_tokens_total") == mtp["total_accepted_tokens"]
    per_pos = labelled(m, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "position")
    assert set(per_pos) == {str(p) for p in range(K)}
    assert sum(per_pos.values()) == mtp["total_accepted_tokens"]
    # Positions 1 and 2 (0-based 0, 1) are always accepted, position 3 on the 3-steps only.
    assert per_pos["0"] == per_pos["1"] == steps
    assert per_pos["2"] == mtp["distribution"]["3"]
    assert all(per_pos[str(p)] == 0 for p in range(3, K))
    assert metric(m, "atom:mtp_average_tokens_per_forward") == mtp["average_tokens_per_forward"]
    assert metric(m, "atom:mtp_accepted_tokens_total") == mtp["total_accepted_tokens"]
    # Dense over 0..K, zeros included, as ATOM's exporter reads its dense distribution.
    steps_by_accepted = labelled(m, "atom:mtp_decode_steps_total", "accepted_tokens")
    assert steps_by_accepted == {
        str(j): float(mtp["distribution"].get(str(j), 0)) for j in range(K + 1)
    }
    assert metric(m, "speclens:decode_steps_total") == steps  # every decode step drafted
    # The forced target, which no engine's own names carry (the dashboard's target line).
    assert metric(m, "speclens:spec_decode_forced_acceptance_length") == pytest.approx(AL)


def test_inferencex_al_from_two_scrapes(batch: dict[str, Any]) -> None:
    """AL = 1 + d(accepted) / d(drafts) between two scrapes, as InferenceX measures a golden AL,
    equals the AL of the requests that ran between them."""
    before, after = batch["before"]["metrics"], batch["after"]["metrics"]
    d_acc = metric(after, "vllm:spec_decode_num_accepted_tokens_total") - metric(
        before, "vllm:spec_decode_num_accepted_tokens_total"
    )
    d_drafts = metric(after, "vllm:spec_decode_num_drafts_total") - metric(
        before, "vllm:spec_decode_num_drafts_total"
    )
    stats = [r["stats"] for r in batch["results"]]
    assert d_drafts == sum(s["num_spec_steps"] for s in stats)
    assert 1 + d_acc / d_drafts == pytest.approx(
        1 + sum(s["num_accepted_draft_tokens"] for s in stats) / d_drafts
    )
    assert abs(1 + d_acc / d_drafts - AL) <= 4 * math.sqrt(0.1716 / d_drafts)


def test_serving_metrics(batch: dict[str, Any], servers: tuple[ServerProcess, ...]) -> None:
    before, after, results = batch["before"]["metrics"], batch["after"]["metrics"], batch["results"]
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert metric(after, name) == 0
    assert metric(after, "vllm:kv_cache_usage_perc") == 0
    d_gen = metric(after, "vllm:generation_tokens_total") - metric(
        before, "vllm:generation_tokens_total", 0
    )
    d_prompt = metric(after, "vllm:prompt_tokens_total") - metric(
        before, "vllm:prompt_tokens_total", 0
    )
    assert d_gen == sum(r["usage"]["completion_tokens"] for r in results) == NUM_REQUESTS * 128
    assert d_prompt == sum(r["usage"]["prompt_tokens"] for r in results)
    types = families(servers[0].url)
    assert types["vllm:num_requests_running"] == "gauge"
    assert types["vllm:num_requests_waiting"] == "gauge"
    assert types["vllm:kv_cache_usage_perc"] == "gauge"
    assert types["vllm:prompt_tokens"] == "counter"
    assert types["vllm:generation_tokens"] == "counter"
    assert types["vllm:time_to_first_token_seconds"] == "histogram"
    assert types["vllm:inter_token_latency_seconds"] == "histogram"
    assert types["atom:mtp_average_tokens_per_forward"] == "gauge"
    assert types["atom:mtp_accepted_tokens"] == "counter"
    assert types["atom:mtp_decode_steps"] == "counter"
    assert types["vllm:spec_decode_num_accepted_tokens_per_pos"] == "counter"
    ttft = "vllm:time_to_first_token_seconds_count"
    assert metric(after, ttft) - metric(before, ttft, 0) == NUM_REQUESTS
    itl = "vllm:inter_token_latency_seconds_count"
    # Every token after the first is observed once.
    assert metric(after, itl) - metric(before, itl, 0) == NUM_REQUESTS * (128 - 1)
    success = labelled(after, "vllm:request_success_total", "finished_reason")
    assert success.get("length", 0) >= NUM_REQUESTS
