"""Load on the sim executor (which sleeps each step's priced cost): 256 concurrent streams, some
cancelled mid-stream. Everything else completes exactly, nothing answers 5xx, the batch drains
and the counters stay consistent."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import httpx
import pytest

from serverkit import (
    FORCED,
    K,
    ServerProcess,
    check_choice_stats,
    check_root_metrics,
    check_token_count,
    idle,
    labelled,
    metric,
    mtp_stats,
    scrape,
    sse_json,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONCURRENCY = 256
CANCEL_EVERY = 8  # 32 of the 256 are cancelled mid-stream
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def server(serve: Any) -> ServerProcess:
    stats = ["--per-request-spec-decode-stats", "detailed"]
    (started,) = serve(["--executor", "sim", *FORCED, "--max-num-seqs", "256", *stats])
    return started


async def _request(session: aiohttp.ClientSession, base: str, i: int) -> dict[str, Any]:
    cancel = i % CANCEL_EVERY == 0
    chat = i % 2 == 1
    body: dict[str, Any] = {
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if chat:
        body["messages"] = [{"role": "user", "content": f"load {i}"}]
        url = base + "/v1/chat/completions"
    else:
        body["prompt"] = f"load {i}"
        url = base + "/v1/completions"
    async with session.post(url, json=body) as resp:
        status = resp.status
        if status != 200:
            return {"i": i, "status": status, "text": await resp.text()}
        if cancel:
            seen = 0
            async for line in resp.content:
                if line.startswith(b"data: "):
                    seen += 1
                    if seen >= 3:
                        break
            resp.close()  # cancelled mid-stream
            return {"i": i, "status": status, "cancelled": True}
        raw = await resp.read()
    return {"i": i, "status": status, "cancelled": False, "chunks": sse_json(raw)}


async def _peak_running(session: aiohttp.ClientSession, base: str, stop: asyncio.Event) -> int:
    """The largest running batch /metrics showed while the load ran."""
    peak = 0
    while not stop.is_set():
        async with session.get(base + "/metrics") as resp:
            for line in (await resp.text()).splitlines():
                if line.startswith("vllm:num_requests_running{"):
                    peak = max(peak, int(float(line.rsplit(" ", 1)[1])))
        await asyncio.sleep(0.05)
    return peak


async def _load(base: str) -> tuple[list[dict[str, Any]], int]:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        stop = asyncio.Event()
        watcher = asyncio.create_task(_peak_running(session, base, stop))
        results = await asyncio.gather(*(_request(session, base, i) for i in range(CONCURRENCY)))
        stop.set()
        return list(results), await watcher


@pytest.fixture(scope="module")
def load(server: ServerProcess) -> dict[str, Any]:
    results, peak = asyncio.run(_load(server.url))
    drained = wait_until(lambda: idle(server.url), 15)
    return {
        "results": results,
        "peak_running": peak,
        "drained": drained,
        "mtp": mtp_stats(server.url),
        "mtp_body": httpx.get(server.url + "/debug/mtp_stats", timeout=10.0).content,
        "metrics": scrape(server.url),
    }


def test_no_5xx_and_every_uncancelled_request_completes(load: dict[str, Any]) -> None:
    results = load["results"]
    assert [r["status"] for r in results if r["status"] != 200] == [], [
        r for r in results if r["status"] != 200
    ][:3]
    done = [r for r in results if not r["cancelled"]]
    assert len(done) == CONCURRENCY - CONCURRENCY // CANCEL_EVERY
    for r in done:
        chunks = r["chunks"]
        usage_chunk, finishing = chunks[-1], chunks[-2]
        assert usage_chunk["choices"] == []
        choice = finishing["choices"][0]
        assert choice["finish_reason"] == "length", r["i"]
        stats = check_choice_stats(choice["speculative_decoding_stats"], "detailed")
        check_root_metrics(usage_chunk["metrics"], stats, "detailed")
        check_token_count(stats, usage_chunk["usage"]["completion_tokens"], MAX_TOKENS)
        reasons = [c["finish_reason"] for ch in chunks[:-2] for c in ch["choices"]]
        assert set(reasons) == {None}


def test_requests_ran_concurrently(load: dict[str, Any]) -> None:
    assert load["peak_running"] >= CONCURRENCY // 2, load["peak_running"]


def test_batch_drains(load: dict[str, Any]) -> None:
    assert load["drained"]
    m = load["metrics"]
    assert metric(m, "vllm:num_requests_running") == 0
    assert metric(m, "vllm:num_requests_waiting") == 0
    assert metric(m, "vllm:kv_cache_usage_perc") == 0


def test_totals_consistent(load: dict[str, Any]) -> None:
    mtp, m = load["mtp"], load["metrics"]
    steps = sum(mtp["distribution"].values())
    assert set(mtp["distribution"]) <= {"2", "3"}
    assert mtp["total_draft_tokens"] == K * steps
    assert metric(m, "vllm:spec_decode_num_drafts_total") == steps
    assert metric(m, "vllm:spec_decode_num_draft_tokens_total") == mtp["total_draft_tokens"]
    assert metric(m, "vllm:spec_decode_num_accepted_tokens_total") == mtp["total_accepted_tokens"]
    dense = labelled(m, "atom:mtp_decode_steps_total", "accepted_tokens")
    assert set(dense) == {str(j) for j in range(K + 1)}  # every bucket, zeros included
    assert {j: v for j, v in dense.items() if v} == {
        j: float(n) for j, n in mtp["distribution"].items() if n
    }
    completed = [
        r["chunks"][-2]["choices"][0]["speculative_decoding_stats"]
        for r in load["results"]
        if not r["cancelled"]
    ]
    # The cancelled requests ran some steps too, so the completed ones add up to at most the
    # totals, and to all of them but what 32 short-lived requests could have run.
    d_steps = steps - sum(s["num_spec_steps"] for s in completed)
    d_drafts = mtp["total_draft_tokens"] - sum(s["num_draft_tokens"] for s in completed)
    d_acc = mtp["total_accepted_tokens"] - sum(s["num_accepted_draft_tokens"] for s in completed)
    assert 0 < d_steps <= (CONCURRENCY // CANCEL_EVERY) * MAX_TOKENS
    assert d_drafts == K * d_steps
    assert 2 * d_steps <= d_acc <= 3 * d_steps
    for j in ("2", "3"):
        assert sum(s["acceptance_histogram"].get(j, 0) for s in completed) <= mtp[
            "distribution"
        ].get(j, 0)
    # Every completed request's tokens were counted; the cancelled ones add some more.
    generated = metric(m, "vllm:generation_tokens_total")
    done = len(completed)
    assert generated >= done * MAX_TOKENS
    # A cancelled stream the engine finished before the client's close arrived (a loaded
    # machine) is a success on the server's side: at most the cancelled ones join the completed.
    succeeded = labelled(m, "vllm:request_success_total", "finished_reason")
    assert set(succeeded) == {"length"}, succeeded
    assert done <= succeeded["length"] <= done + CONCURRENCY // CANCEL_EVERY


def test_server_log_clean(server: ServerProcess, load: dict[str, Any]) -> None:
    log = server.log()
    assert "Traceback" not in log, log[-3000:]


def _no_constants(name: str) -> None:
    raise AssertionError(f"/debug/mtp_stats holds {name}, which is not JSON")


def test_mtp_stats_served_as_strict_json_that_agrees_with_itself(load: dict[str, Any]) -> None:
    """What the body is after cancellations: strict JSON (no NaN or Infinity, which Python's json
    writes by default), the same object twice, every derived field following from the counts."""
    served = json.loads(load["mtp_body"], parse_constant=_no_constants)
    assert served == load["mtp"]
    assert served["enabled"] is True
    dist = {int(j): n for j, n in served["distribution"].items()}
    counts = [served["total_draft_tokens"], served["total_accepted_tokens"], *dist.values()]
    assert all(type(n) is int and n >= 0 for n in counts), served
    assert set(dist) <= set(range(K + 1))
    steps = sum(dist.values())
    accepted = served["total_accepted_tokens"]
    assert steps > 0 and accepted == sum(j * n for j, n in dist.items())
    # The floats follow from the counts (rounded to 4 places at most).
    assert served["acceptance_rate"] == pytest.approx(
        accepted / served["total_draft_tokens"], abs=5e-5
    )
    assert served["average_tokens_per_forward"] == pytest.approx(1 + accepted / steps, abs=5e-5)
    percent = {int(j): f for j, f in served["distribution_percent"].items()}
    assert {j for j, f in percent.items() if f} == {j for j, n in dist.items() if n}
    for j, f in percent.items():
        assert f == pytest.approx(dist.get(j, 0) / steps, abs=5e-5), (j, served)


def test_server_still_serves_after_load(server: ServerProcess, load: dict[str, Any]) -> None:
    async def one() -> dict[str, Any]:
        async with aiohttp.ClientSession() as session:
            return await _request(session, server.url, 1)

    r = asyncio.run(one())
    assert r["status"] == 200 and r["chunks"][-1]["usage"]["completion_tokens"] == MAX_TOKENS
