"""The server's event loop under huge prompts (issue 19, item 13).

Three 7.8 MB prompts to SmolLM2 each got their 400 only after 19 to 47 s, and ``/health`` stalled
for up to 28 s: tokenizing and chat-template rendering ran on the event loop. Now a prompt longer
in UTF-8 bytes than ``max_model_len`` tokens could spell is refused before any tokenizer sees it,
and the rest is tokenized on a thread (an HF tokenizer releasing the GIL while it encodes).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest

from speclens.engine import Engine, EngineConfig, SpeculativeConfig, StepCost
from speclens.engine.tokenizer import ByteTokenizer
from speclens.server import EngineRunner, ServerSettings, create_app

CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
MAX_MODEL_LEN = 1024
HUGE = "a" * (7_800_000)  # under the 8 MiB body limit, so the handler sees it
#: A refusal by length costs a JSON parse, never a tokenization.
REFUSAL_S = 3.0
#: /health with prompts being tokenized: the loop is free, so it answers at once (a loop that
#: tokenized itself would hold it for a whole ``TOKENIZE_S``).
HEALTH_S = 1.0
TOKENIZE_S = 2.0


class SpyTokenizer:
    """The dummy tokenizer, counting calls; ``delay`` seconds per call stands for a slow
    tokenizer (sleeping releases the GIL, as a Rust tokenizer's batch encode does)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.inner = ByteTokenizer()
        self.delay = delay
        self.calls: list[str] = []
        self.entered = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _slow(self, what: str) -> None:
        self.calls.append(what)
        self.entered.set()
        if self.delay:
            time.sleep(self.delay)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        self._slow("encode")
        return self.inner.encode(text, add_bos)

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        self._slow("render")
        return self.inner.apply_chat_template(messages, add_generation_prompt)

    def decode(self, ids: Sequence[int]) -> str:
        return self.inner.decode(ids)


def sim_engine(tokenizer: SpyTokenizer) -> Engine:
    spec = SpeculativeConfig(method="draft_model", num_speculative_tokens=3, acceptance_length=2.0)
    config = EngineConfig(
        speculative=spec,
        executor="sim",
        kv_cache_tokens=8192,
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=4096,
        step_cost=StepCost(base=1e-4),
    )
    return Engine(config, tokenizer=tokenizer)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def app_client(tokenizer: SpyTokenizer) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(EngineRunner(sim_engine(tokenizer)), ServerSettings(served_model_name="m"))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as c,
    ):
        yield c


def check_too_long(r: httpx.Response, param: str) -> None:
    assert r.status_code == 400, (r.status_code, r.text[:300])
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == "invalid_request_error" and error["code"] == 400
    assert error["param"] == param, error
    message = error["message"]
    assert message.startswith(f"this model's maximum context length is {MAX_MODEL_LEN} tokens")
    assert "the prompt has 78000" in message and "bytes" in message, message


@pytest.mark.timeout(60)
@pytest.mark.asyncio
async def test_multi_megabyte_prompt_is_refused_by_length_before_tokenizing() -> None:
    tokenizer = SpyTokenizer()
    async with app_client(tokenizer) as c:
        started = time.monotonic()
        r = await c.post(CMPL, json={"prompt": HUGE, "max_tokens": 1})
        assert time.monotonic() - started < REFUSAL_S
        check_too_long(r, "prompt")
        assert "encode" not in tokenizer.calls, tokenizer.calls
        started = time.monotonic()
        r = await c.post(CHAT, json={"messages": [{"role": "user", "content": HUGE}]})
        assert time.monotonic() - started < REFUSAL_S
        check_too_long(r, "messages")
        assert "encode" not in tokenizer.calls, tokenizer.calls
        # A prompt within the bound still runs.
        r = await c.post(CMPL, json={"prompt": "hello", "max_tokens": 2})
        assert r.status_code == 200, r.text


@pytest.mark.timeout(60)
@pytest.mark.asyncio
@pytest.mark.parametrize("path", [CMPL, CHAT], ids=["completion", "chat"])
async def test_health_answers_while_prompts_are_tokenized(path: str) -> None:
    tokenizer = SpyTokenizer(delay=TOKENIZE_S)
    body: dict[str, Any] = (
        {"prompt": "hello", "max_tokens": 2}
        if path == CMPL
        else {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
    )
    async with app_client(tokenizer) as c:
        requests = asyncio.gather(*(c.post(path, json=body) for _ in range(2)))
        waits = []
        while not requests.done():  # /health, over and over, the whole time they are tokenized
            started = time.monotonic()
            assert (await c.get("/health")).status_code == 200
            await asyncio.sleep(0.01)  # (a stalled loop may stall here too: it counts)
            waits.append(time.monotonic() - started)
        assert len(tokenizer.calls) >= 2, tokenizer.calls
        assert max(waits) < HEALTH_S, waits
        for r in await asyncio.wait_for(requests, timeout=30):
            assert r.status_code == 200, r.text


def _text_that_takes(tokenizer: Any, seconds: float) -> str:
    """A text this machine's tokenizer needs about ``seconds`` to encode: a fixed size is too
    short to tell on a fast machine and needlessly long on a slow one."""
    unit = "hello world, " * 2_000
    started = time.monotonic()
    tokenizer.encode(unit)
    took = max(time.monotonic() - started, 1e-4)
    return unit * max(1, min(200, math.ceil(seconds / took)))


@pytest.mark.timeout(60)
def test_hf_tokenizer_encodes_without_holding_the_gil() -> None:
    """A thread encoding a long text must leave the other threads (the event loop, the engine)
    running. ``tokenizers``' single ``encode`` holds the GIL; its batch form releases it."""
    tokenizer = ByteTokenizer().to_hf()
    text = _text_that_takes(tokenizer, seconds=0.4)
    ticks = 0
    done = threading.Event()

    def encode() -> None:
        tokenizer.encode(text)
        done.set()

    worker = threading.Thread(target=encode)
    started = time.monotonic()
    worker.start()
    while not done.is_set():
        time.sleep(0.002)
        ticks += 1
    elapsed = time.monotonic() - started
    worker.join()
    # Free to run, this thread ticks every ~2-3 ms; holding the GIL, the encoder lets it tick
    # only a few times (the interpreter's switch interval is 5 ms, but a C call never yields).
    assert elapsed > 0.1, "the text encoded too fast to tell"
    assert ticks >= elapsed / 0.02, (ticks, elapsed)
    assert tokenizer.encode(text) == list(text.encode())
