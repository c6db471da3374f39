"""Drive the (single-threaded) engine from an asyncio server.

One thread owns the engine: it drains an inbox of adds and aborts, runs ``step()``, and hands
each request's outputs to that request's asyncio queue. With the ``sim`` executor each step lasts
its priced cost in real time (its own work included), so a mock server paces tokens like the real
thing.

A tensor-parallel engine (``build_engine`` starts its ranks) dies the same way when one of its
ranks ends, or stops answering (a collective that outlasts its timeout): the runner checks
between steps, idle or not, and an idle runner has rank 0 check that the ranks answer.

If the engine thread fails, the runner is dead for good (an engine's state after a failed step
cannot be trusted): every waiting and running request gets ``EngineDead`` at once, new ones are
refused, and ``on_dead`` tells the server to shut down (as vLLM does when its engine core dies).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from speclens.engine import Engine, EngineConfig, RequestOutput, SamplingParams
from speclens.sampling import SpecDecodeStats
from speclens.server.spread import RealizedSpread

log = logging.getLogger(__name__)

Listener = Callable[[RequestOutput, float], None]


class QueueFull(RuntimeError):
    """The waiting queue is at its limit (the server answers 503)."""


class EngineDead(RuntimeError):
    """The engine thread failed; the message names the error. Ends every request's queue."""


#: What a request's queue carries: outputs, then ``None`` (aborted) or ``EngineDead``.
Item = RequestOutput | EngineDead | None


@dataclass
class _Pending:
    prompt: list[int]
    params: SamplingParams
    request_id: str
    future: asyncio.Future[asyncio.Queue[Item]]


@dataclass
class Snapshot:
    """A consistent read of the engine's counters, taken between steps."""

    stats: SpecDecodeStats
    num_running: int
    num_waiting: int
    kv_usage: float
    #: The realized spread between finished requests (``RealizedSpread.summary``).
    request_spread: dict[str, Any]


def build_engine(config: EngineConfig, collective_timeout_s: float | None = None) -> Engine:
    """``Engine(config)`` built on a thread that ends before this returns.

    ``collective_timeout_s``: with tensor parallelism, the longest rank 0 waits in one
    collective before it calls the group wedged (``parallel.COLLECTIVE_TIMEOUT_S`` if None).

    PyTorch's OpenMP runtime keeps a pool of worker threads for every thread that has run a
    parallel region, and a pool left on the main thread by loading the weights made every
    forward on the engine thread slower (SmolLM2 with n-gram drafting through ``serve``: 19
    tok/s against 32 in one thread; benchmarks/README.md). A thread's pool ends with it, so the
    engine thread is the only one left with one. Whatever ``Engine`` raises is raised here.
    """
    built: list[Engine] = []
    failed: list[BaseException] = []
    rank = None
    if config.tensor_parallel_size > 1:  # started here: a rank dies with the thread starting it
        from speclens.engine.parallel import COLLECTIVE_TIMEOUT_S, join, start

        rank = start(config, collective_timeout_s or COLLECTIVE_TIMEOUT_S)

    def build() -> None:
        try:
            built.append(join(config, rank) if rank is not None else Engine(config))
        except BaseException as exc:  # re-raised on the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=build, name="speclens-engine-build")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return built[0]


class EngineRunner:
    """The engine on its own thread, with asyncio queues per request."""

    def __init__(self, engine: Engine, max_queue: int = 4096, realtime: bool = True) -> None:
        self.engine = engine
        self.max_queue = max_queue
        self.realtime = realtime and engine.config.executor == "sim"
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._queues: dict[str, asyncio.Queue[Item]] = {}
        self._futures: set[asyncio.Future[asyncio.Queue[Item]]] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending = 0
        self.listeners: list[Listener] = []
        #: Every finished request's realized AL, step-weighted (read under the lock).
        self.spread = RealizedSpread(engine.k)
        self.ready = False
        #: Set (on the event loop) when the engine thread failed.
        self.error: EngineDead | None = None
        #: Called on the event loop once the engine thread has failed.
        self.on_dead: Callable[[EngineDead], None] | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="speclens-engine", daemon=True)
        self._thread.start()
        self.ready = True

    def stop(self) -> None:
        """Abort whatever is in flight (its streams end with finish_reason 'abort') and join."""
        self.ready = False
        self._inbox.put(("abort_all", None))
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # ------------------------------------------------------------------ from the event loop
    async def submit(
        self, prompt: Sequence[int], params: SamplingParams, request_id: str
    ) -> asyncio.Queue[Item]:
        """Queue a request; returns the queue its outputs arrive on (``None`` or ``EngineDead``
        ends it).

        Raises ``EngineDead`` once the engine has failed, ``QueueFull`` at the queue limit and
        the engine's ``SamplingError`` for a request it refuses.
        """
        if self.error is not None:
            raise self.error
        if self._pending + self.engine.num_waiting >= self.max_queue:
            raise QueueFull(f"the request queue is full ({self.max_queue} waiting)")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[asyncio.Queue[Item]] = loop.create_future()
        self._pending += 1
        self._futures.add(future)
        try:
            self._inbox.put(("add", _Pending(list(prompt), params, request_id, future)))
            self._wake.set()
            return await future
        finally:
            self._pending -= 1
            self._futures.discard(future)

    def abort(self, request_id: str) -> None:
        """Abort a request (e.g. its client went away); safe to call from any thread."""
        self._inbox.put(("abort", request_id))
        self._wake.set()

    def snapshot(self) -> Snapshot:
        engine = self.engine
        with self._lock:
            stats = SpecDecodeStats(engine.stats.num_spec_tokens, engine.stats.enabled)
            stats.update(engine.stats)
            return Snapshot(
                stats=stats,
                num_running=engine.num_running,
                num_waiting=engine.num_waiting + self._pending,
                kv_usage=engine.blocks.usage,
                request_spread=self.spread.summary(),
            )

    # ------------------------------------------------------------------ the engine thread
    def _deliver(self, request_id: str, item: RequestOutput | None) -> None:
        q = self._queues.get(request_id)
        if q is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(q.put_nowait, item)
        if item is None or (item is not None and item.finished):
            self._queues.pop(request_id, None)

    def _drain(self) -> None:
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                self._add(item)
            elif kind == "abort":
                with self._lock:
                    self.engine.abort(item)
                self._deliver(item, None)
            elif kind == "abort_all":
                for request_id in list(self._queues):
                    with self._lock:
                        self.engine.abort(request_id)
                    self._deliver(request_id, None)

    def _add(self, pending: _Pending) -> None:
        loop = self._loop
        assert loop is not None
        try:
            with self._lock:
                self.engine.add_request(pending.prompt, pending.params, pending.request_id)
        except Exception as exc:  # the handler turns it into an HTTP error
            loop.call_soon_threadsafe(_set_exception, pending.future, exc)
            return
        q: asyncio.Queue[Item] = asyncio.Queue()
        self._queues[pending.request_id] = q
        loop.call_soon_threadsafe(_set_result, pending.future, q, self, pending.request_id)

    def _record_finished(self, outputs: list[RequestOutput]) -> None:
        """Each finished sequence's realized AL into the spread, with the step that counted its
        verify steps (so a snapshot sees both or neither)."""
        for out in outputs:
            if out.finished:
                for choice in out.outputs:
                    acceptance = choice.acceptance
                    if acceptance.num_spec_steps:
                        self.spread.record(
                            acceptance.mean_acceptance_length, acceptance.num_spec_steps
                        )

    def _run(self) -> None:
        try:
            self._loop_steps()
        except Exception as exc:
            log.exception("the engine failed; failing every request and shutting down")
            dead = EngineDead(f"the engine failed: {type(exc).__name__}: {exc}")
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._die, dead)

    def _die(self, dead: EngineDead) -> None:
        """On the event loop, after the engine thread has ended: end every request with
        ``dead``; ``submit`` refuses new ones from here on."""
        self.error, self.ready = dead, False
        for future in self._futures:
            if not future.done():
                future.set_exception(dead)
        for q in self._queues.values():
            q.put_nowait(dead)
        self._queues.clear()
        if self.on_dead is not None:
            self.on_dead(dead)

    def _loop_steps(self) -> None:
        while not self._stop.is_set():
            self._drain()
            if not self.engine.has_unfinished():
                self.engine.check_alive()  # a tensor-parallel rank that died stops the server
                self._wake.wait(timeout=0.1)
                self._wake.clear()
                continue
            started = time.perf_counter()
            with self._lock:
                outputs = self.engine.step()
                seconds = self.engine.steps[-1].seconds if self.engine.steps else 0.0
                self._record_finished(outputs)
            now = time.perf_counter()
            for out in outputs:
                for listener in self.listeners:
                    listener(out, now)
                self._deliver(out.request_id, out)
            if self.realtime and seconds > 0:
                # The step lasts its price, its own work included: paced to a deadline, so the
                # host time of scheduling and delivering is not added on top of every step.
                left = seconds - (time.perf_counter() - started)
                if left > 0:
                    self._stop.wait(left)
        self._drain()


def _set_result(
    future: asyncio.Future[Any], value: Any, runner: EngineRunner, request_id: str
) -> None:
    if future.cancelled():  # the client left while the request was being queued
        runner.abort(request_id)
    else:
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.cancelled():
        future.set_exception(exc)
