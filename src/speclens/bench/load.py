"""The load generator: one aiohttp session, a connection limit, closed-loop concurrency or open-
loop (Poisson / gamma) arrivals, per-chunk timestamps, and every response kept raw."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
import orjson

from speclens.bench import transport
from speclens.bench.datasets import Prompt
from speclens.bench.finish import Tally, finish_record
from speclens.bench.sse import SSEError, SSEParser
from speclens.bench.transport import KEEPALIVE_S, MAX_ERROR_BYTES, read_at_most
from speclens.bench.wire import LLAMACPP_NATIVE, Backend, Endpoint, Routing, Seen, route, wire_for
from speclens.runs.request import RequestRecord, RunResult

logger = logging.getLogger(__name__)


@dataclass
class LoadConfig:
    url: str
    model: str
    endpoint: Endpoint = "completions"
    #: The engine behind the URL (``--backend``; auto-detection resolves to one of these): it
    #: decides the native route and the extra request fields that switch the stats on.
    backend: Backend = "openai"
    api_key: str | None = None
    num_requests: int | None = 100
    duration: float | None = None
    concurrency: int | None = 8
    request_rate: float | None = None
    burstiness: float = 1.0
    warmup: int = 0
    max_tokens: int | None = 128
    ignore_eos: bool = False
    temperature: float = 0.0
    seed: int = 0
    stream: bool = True
    continuous_usage: bool = True
    timeout: float = 600.0
    grace: float = 5.0  # seconds in-flight requests get after Ctrl-C
    #: Every replica's base URL (empty: ``url`` alone), and how requests are spread over them.
    urls: tuple[str, ...] = ()
    routing: Routing = "round-robin"
    #: Open loop at each prompt's own ``due`` time (a trace), every prompt once, in order.
    trace: bool = False
    #: This generator's part of the run, (p, P): it sends the requests whose index is p modulo
    #: P, at the times a single generator would, with its share of the concurrency. Shards (``--shard``) and worker processes (``--workers``) are parts.
    part: tuple[int, int] = (0, 1)

    @property
    def replicas(self) -> tuple[str, ...]:
        return self.urls or (self.url,)

    def share(self, total: int) -> int:
        """This part's share of ``total`` (concurrency): the first ``total % P`` parts get one
        more."""
        p, parts = self.part
        return total // parts + (p < total % parts)


def _native_payload(config: LoadConfig, prompt: Prompt) -> dict[str, Any]:
    """SGLang ``/generate`` (``GenerateReqInput``: ``text`` and ``sampling_params``) or llama.cpp
    ``/completion`` (``prompt``, ``n_predict``; tools/server/server-schema.cpp)."""
    max_tokens = prompt.max_tokens or config.max_tokens
    if config.backend == "sglang":
        sampling: dict[str, Any] = {"temperature": config.temperature}
        if max_tokens:
            sampling["max_new_tokens"] = max_tokens
        if config.ignore_eos:
            sampling["ignore_eos"] = True
        return {"text": prompt.text, "sampling_params": sampling, "stream": config.stream}
    body: dict[str, Any] = {
        "prompt": prompt.text,
        "temperature": config.temperature,
        "stream": config.stream,
    }
    if max_tokens:
        body["n_predict"] = max_tokens
    if config.ignore_eos:
        body["ignore_eos"] = True
    return body


def _payload(config: LoadConfig, prompt: Prompt) -> dict[str, Any]:
    if config.endpoint == "native":
        return _native_payload(config, prompt)
    body: dict[str, Any] = {"model": config.model, "temperature": config.temperature}
    max_tokens = prompt.max_tokens or config.max_tokens
    if max_tokens:
        body["max_tokens"] = max_tokens
    if config.ignore_eos:
        body["ignore_eos"] = True
    if config.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.text
    if config.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        if config.continuous_usage:
            body["stream_options"]["continuous_usage_stats"] = True
    if config.backend == "sglang":
        # Current SGLang returns the request's spec stats in ``sglext.spec_tokens_details``, also
        # when streaming; older releases only in ``choices[].meta_info``, which needs
        # ``return_meta_info`` and is refused (400) when streaming
        # (python/sglang/srt/entrypoints/openai/serving_chat.py, serving_completions.py).
        body["return_spec_tokens_details"] = True
        if not config.stream:
            body["return_meta_info"] = True
    return body


#: Allocations between the collector's young-generation passes during a run (Python's default
#: is 700). A run allocates a few objects a token and keeps every record; at the default the
#: collector took a fifth of the client's CPU (medians 33 against 25 µs a streamed token, issue
#: 43). Only cyclic garbage waits longer: everything else is freed as before.
GC_YOUNG_THRESHOLD = 7000

_runs = 0  # runs in progress in this process; the first raises the threshold, the last restores
_threshold_before = gc.get_threshold()


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """The collector's young-generation threshold raised while any run is in progress."""
    global _runs, _threshold_before
    if _runs == 0:
        _threshold_before = gc.get_threshold()
        first, *rest = _threshold_before
        gc.set_threshold(max(first, GC_YOUNG_THRESHOLD), *rest)
    _runs += 1
    try:
        yield
    finally:
        _runs -= 1
        if _runs == 0:
            gc.set_threshold(*_threshold_before)


class LoadGenerator:
    def __init__(self, config: LoadConfig, prompts: list[Prompt]) -> None:
        if not prompts:
            raise ValueError("no prompts to send")
        self.config = config
        self.prompts = prompts
        self.stop = asyncio.Event()
        self.on_done: Callable[[RequestRecord], None] | None = None
        #: What each raw payload is kept as (``Tally.keep``): bytes where records are pickled.
        self.keep: Callable[[bytes], Any] = orjson.Fragment
        path = route(config.endpoint, config.backend)
        self.wire = wire_for(config.endpoint, config.backend)
        self.replicas = config.replicas
        self.endpoint_urls = [base.rstrip("/") + path for base in self.replicas]
        self.outstanding = [0] * len(self.replicas)  # requests in flight per replica
        self.headers = {
            "Content-Type": "application/json",
            "Accept-Encoding": transport.ACCEPT_ENCODING,
        }
        if config.api_key:
            self.headers["Authorization"] = f"Bearer {config.api_key}"

    async def _send(
        self, session: aiohttp.ClientSession, record: RequestRecord, prompt: Prompt, t0: float
    ) -> None:
        """One request, start to finish; whatever happens, its record is finished and kept."""
        config = self.config
        replica = self._route(record.index)
        record.replica = self.replicas[replica]
        self.outstanding[replica] += 1
        record.start = time.perf_counter() - t0
        body = orjson.dumps(_payload(config, prompt))
        tally = Tally(
            record,
            prompt.max_tokens or config.max_tokens,
            config.stream,
            seen=Seen(self.wire),
            keep=self.keep,
        )
        try:
            await self._exchange(session, self.endpoint_urls[replica], body, tally, t0)
        except asyncio.CancelledError:
            record.error = "cancelled"
            raise
        except TimeoutError:  # aiohttp's total timeout, which says nothing itself
            where = "waiting for the response" if record.status is None else "reading the body"
            record.error = f"timed out after {config.timeout:g} s {where}"
        except transport.BodyError as exc:
            record.error = str(exc)
        except (aiohttp.ClientError, SSEError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # one bad response must not take the run down
            logger.debug("request %d failed", record.index, exc_info=True)
            record.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.outstanding[replica] -= 1
            self._finish(record, tally)

    async def _exchange(
        self, session: aiohttp.ClientSession, url: str, body: bytes, tally: Tally, t0: float
    ) -> None:
        """POST ``body`` and read the response into ``tally`` within the request's deadline; a
        redirect or a status other than 200 fails the request."""
        record, config = tally.record, self.config
        deadline = t0 + record.start + config.timeout
        async with await transport.post(session, url, body, self.headers) as resp:
            record.status = resp.status
            redirect = transport.redirect_problem(resp)
            if redirect is not None:
                record.error = redirect
                return
            if resp.status != 200:
                raw, _ = await read_at_most(resp, MAX_ERROR_BYTES, deadline, config.timeout)
                record.error = f"HTTP {resp.status}: {raw.decode('utf-8', 'replace')[:500]}"
                return
            if config.stream:
                await self._read_stream(resp, tally, t0, deadline)
                if not tally.ended:
                    record.error = self._cut_short()
                    return
            else:
                limit = transport.MAX_BODY_BYTES
                raw, longer = await read_at_most(resp, limit, deadline, config.timeout)
                if longer:
                    record.error = f"the response body exceeds {limit} bytes"
                    return
                tally.body(raw, time.perf_counter() - t0)
            record.end = time.perf_counter() - t0

    async def _read_stream(
        self, resp: aiohttp.ClientResponse, tally: Tally, t0: float, deadline: float
    ) -> None:
        """Every SSE event of the stream, each timed as its bytes arrive. A body sent as it is
        is read straight (the bounds checked once a read: the per-token path); an encoded one
        is decoded in bounded slices (``transport.body_slices``)."""
        feed, event = SSEParser().feed_data, tally.event
        limit = transport.MAX_STREAM_BYTES
        if transport.is_plain(resp):
            size = 0
            async for chunk in resp.content.iter_any():
                now = time.perf_counter()
                size += len(chunk)
                if now > deadline or size > limit:
                    raise transport.BodyError(
                        transport.broken_bound(now, deadline, limit, self.config.timeout)
                    )
                now -= t0
                for data in feed(chunk):
                    event(data, now)
            return
        slices = transport.body_slices(resp, limit, deadline, self.config.timeout)
        async with contextlib.aclosing(slices):
            async for chunk in slices:
                now = time.perf_counter() - t0
                for data in feed(chunk):
                    event(data, now)

    def _cut_short(self) -> str:
        """Why a stream that did not end as its wire ends fails."""
        if self.wire is LLAMACPP_NATIVE:
            return 'the stream ended without its final chunk ("stop": true)'
        return "the stream ended without [DONE]"

    def _route(self, index: int) -> int:
        """The replica for request ``index``: round robin by index (the same spread whatever
        the parts), or the one with the fewest requests in flight from this generator (ties go
        round robin)."""
        n = len(self.replicas)
        if n == 1:
            return 0
        if self.config.routing == "round-robin":
            return index % n
        return min(range(n), key=lambda j: (self.outstanding[j], (j - index) % n))

    def _finish(self, record: RequestRecord, tally: Tally | None = None) -> None:
        try:
            finish_record(record, tally)
        except Exception as exc:  # a last resort: the record is kept, with why it is incomplete
            logger.debug("request %d: finishing its record failed", record.index, exc_info=True)
            record.error = record.error or f"{type(exc).__name__}: {exc}"
        if self.on_done is not None:
            self.on_done(record)

    def _arrivals(
        self, count: int | None, random_order: bool, warmup: bool, first_index: int
    ) -> Iterator[tuple[int, Prompt, float]]:
        """Every arrival of a phase, as a single generator draws them: (index within the phase,
        prompt, when it is due in seconds from the phase's start; 0 in a closed loop). A part
        takes every P-th, so the parts of a run together send exactly what one would."""
        config = self.config
        rng = np.random.default_rng(config.seed + (1 if warmup else 0))
        order = random.Random(config.seed)
        rate, shape = config.request_rate, config.burstiness
        prompts = self.prompts
        due, i = 0.0, 0
        if config.trace:  # every request once, at its own arrival (warm-up ones at once)
            for i, prompt in enumerate(
                prompts[first_index : first_index + (count or len(prompts))]
            ):
                yield i, prompt, 0.0 if warmup else float(prompt.due or 0.0)
            return
        while count is None or i < count:
            n = len(prompts)
            yield i, prompts[order.randrange(n) if random_order else (first_index + i) % n], due
            if rate:
                due += float(rng.gamma(shape, 1.0 / (rate * shape)))
            i += 1

    async def _phase(
        self,
        session: aiohttp.ClientSession,
        count: int | None,
        duration: float | None,
        warmup: bool,
        first_index: int,
        t0: float | None = None,
    ) -> tuple[list[RequestRecord], float, float, int]:
        """Send this part of one phase (warm-up or measured); returns its records, its
        duration, when it stopped sending and how many requests were in flight then.

        Times count from ``t0`` (a ``time.perf_counter`` value, shared by the parts of a run on
        one machine; default now). Open-loop arrivals are scheduled at absolute times (``t0``
        plus the summed gaps), so the loop's own work between sends does not lengthen every gap;
        a send is never started at or after ``duration``, and no wait runs past it."""
        config = self.config
        part, parts = config.part
        records: list[RequestRecord] = []
        tasks: set[asyncio.Task[None]] = set()
        concurrency = config.share(config.concurrency) if config.concurrency else None
        limit = asyncio.Semaphore(concurrency) if concurrency else None
        t0 = time.perf_counter() if t0 is None else t0
        open_loop = bool(config.request_rate) or config.trace

        async def one(record: RequestRecord, prompt: Prompt) -> None:
            if limit is None:
                await self._send(session, record, prompt, t0)
                return
            async with limit:
                if self.stop.is_set():
                    record.error = "not sent (stopped)"
                    self._finish(record)
                    return
                await self._send(session, record, prompt, t0)

        arrivals = self._arrivals(count, bool(duration), warmup, first_index)
        while not self.stop.is_set():
            arrival = next(arrivals, None)
            while arrival is not None and (first_index + arrival[0]) % parts != part:
                arrival = next(arrivals, None)
            if arrival is None:
                break
            index, prompt, due = arrival
            if limit is not None and not open_loop:
                # Closed loop: wait for a free slot before creating work, never past the end.
                left = None if duration is None else duration - (time.perf_counter() - t0)
                if left is not None and left <= 0:
                    break
                try:
                    await asyncio.wait_for(limit.acquire(), timeout=left)
                except TimeoutError:
                    break
                limit.release()
            wait = (due if duration is None else min(due, duration)) - (time.perf_counter() - t0)
            if wait > 0:  # open loop (or a start time ahead): sleep until due, never past the end
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), timeout=wait)
                if self.stop.is_set():
                    break
            if duration is not None and time.perf_counter() - t0 >= duration:
                break  # checked after the wait for a slot, which may end past the duration
            record = RequestRecord(first_index + index, prompt.category, warmup)
            if open_loop:
                record.scheduled = due
            records.append(record)
            task = asyncio.create_task(one(record, prompt))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(0)  # let the new task start its send
        sending = time.perf_counter() - t0
        in_flight = sum(1 for r in records if r.end is None and r.error is None)
        if tasks:
            if self.stop.is_set():
                _, pending = await asyncio.wait(tasks, timeout=config.grace)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
            else:
                await asyncio.gather(*tasks, return_exceptions=True)
        ends = [r.end for r in records if r.end is not None]
        return records, (max(ends) if ends else time.perf_counter() - t0), sending, in_flight

    async def run(self, before_measure: Callable[[], Any] | None = None) -> RunResult:
        """Warm up, call ``before_measure`` (e.g. scrape server counters), then measure.

        ``before_measure`` may return (or its coroutine resolve to) a ``time.perf_counter``
        value: the measured phase then starts at that time, shared with other parts."""
        config = self.config
        connector = aiohttp.TCPConnector(
            limit=max(config.concurrency or 0, 256),
            force_close=False,
            keepalive_timeout=KEEPALIVE_S,
        )
        with _fewer_collections():
            return await self._run(config, connector, before_measure)

    async def _run(
        self,
        config: LoadConfig,
        connector: aiohttp.TCPConnector,
        before_measure: Callable[[], Any] | None,
    ) -> RunResult:
        async with transport.session(config.timeout, connector=connector) as session:
            warm: list[RequestRecord] = []
            if config.warmup:
                warm, *_ = await self._phase(session, config.warmup, None, True, 0)
            t0 = None
            if before_measure is not None:
                result = before_measure()
                if asyncio.iscoroutine(result):
                    result = await result
                t0 = result if isinstance(result, float) else None
            started = time.time() + (0.0 if t0 is None else t0 - time.perf_counter())
            count = None if config.duration else config.num_requests
            records, duration, sending, in_flight = await self._phase(
                session, count, config.duration, False, config.warmup, t0
            )
        return RunResult(warm + records, started, duration, self.stop.is_set(), sending, in_flight)
