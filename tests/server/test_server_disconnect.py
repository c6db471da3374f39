"""A client that goes away aborts its request: the batch empties, the KV cache is freed and the
acceptance counters stop growing."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import httpx
import pytest

from serverkit import FORCED, ServerProcess, idle, metric, mtp_stats, scrape

pytestmark = pytest.mark.integration

#: A request that would run for tens of seconds on the sim executor if nobody stopped it.
LONG = {"max_tokens": 16000, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(serve: Any) -> ServerProcess:
    args = [*FORCED, "--executor", "sim", "--max-model-len", "16384"]
    (started,) = serve([*args, "--per-request-spec-decode-stats", "summary"])
    return started


def _busy(base: str) -> bool:
    s = scrape(base)
    return metric(s, "vllm:num_requests_running") == 1 and metric(s, "vllm:kv_cache_usage_perc") > 0


def _check_aborted(base: str) -> None:
    """Within a few seconds nothing runs, nothing waits, the KV is free, the counters stand."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not idle(base):
        time.sleep(0.05)
    s = scrape(base)
    assert metric(s, "vllm:num_requests_running") == 0
    assert metric(s, "vllm:num_requests_waiting") == 0
    assert metric(s, "vllm:kv_cache_usage_perc") == 0
    first = mtp_stats(base)
    time.sleep(1.0)
    assert mtp_stats(base) == first
    assert (
        scrape(base)[("vllm:generation_tokens_total", ())]
        == s[("vllm:generation_tokens_total", ())]
    )


async def _stream_then_leave(
    base: str, path: str, body: dict[str, Any], events: int, check_busy: bool = True
) -> int:
    """Read ``events`` SSE events, check the request is running, then drop the connection."""
    seen = 0
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
    try:
        resp = await session.post(base + path, json=body)
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"data: "):
                assert line.strip() != b"data: [DONE]"
                seen += 1
                if seen >= events:
                    break
        if check_busy:
            assert await asyncio.to_thread(_busy, base)
        resp.close()  # the client goes away mid-stream
    finally:
        await session.close()
    return seen


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_stream_disconnect_aborts(server: ServerProcess, path: str) -> None:
    body = {**LONG, "stream": True, "stream_options": {"include_usage": True}}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "go on forever"}]
    else:
        body["prompt"] = "go on forever"
    before = mtp_stats(server.url)["total_draft_tokens"]
    assert await _stream_then_leave(server.url, path, body, events=5) == 5
    await asyncio.to_thread(_check_aborted, server.url)
    # It ran a little before it was stopped, and far from its 16000 tokens.
    grown = mtp_stats(server.url)["total_draft_tokens"] - before
    assert 0 < grown < 7 * 16000 / 3


@pytest.mark.asyncio
async def test_many_disconnects_leave_nothing_behind(server: ServerProcess) -> None:
    body = {**LONG, "prompt": "many", "stream": True}
    results = await asyncio.gather(
        *(
            _stream_then_leave(server.url, "/v1/completions", body, events=2, check_busy=False)
            for _ in range(6)
        )
    )
    assert results == [2] * 6
    await asyncio.to_thread(_check_aborted, server.url)
    r = httpx.post(
        server.url + "/v1/completions",
        json={"prompt": "after", "max_tokens": 20, "ignore_eos": True},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 20


def test_non_streaming_disconnect_aborts(server: ServerProcess) -> None:
    """A non-streaming client that times out and closes its connection aborts its request too.

    Last in this module: if the abort does not happen, the request runs on for ~8 s."""
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            server.url + "/v1/completions",
            # ~8.5 s of sim steps: long past the check below, short enough not to hold up
            # the teardown for long when the abort does not happen.
            json={"max_tokens": 5000, "ignore_eos": True, "prompt": "wait for me"},
            timeout=httpx.Timeout(60, read=1.0),
        )
    _check_aborted(server.url)
