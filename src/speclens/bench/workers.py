"""``--workers N``: N load-generating processes, each with its own event loop, merged into one run.

One Python process tops out at one core. Each worker runs a ``LoadGenerator`` for its part of
the run (``LoadConfig.part``): it sends the arrivals whose index is its number modulo N, at the
times one generator would have drawn them, with its share of the concurrency. The merged stream
is therefore exactly the single-process stream for the same seed, Poisson or gamma, whatever N.
All workers count time from one ``time.perf_counter`` origin (a system-wide monotonic clock), so
their records share one time axis.

The parent does everything that must happen once: it waits for every worker's warm-up, calls
``before_measure`` (the server scrape), hands out the common start time, receives each record as
it finishes (``on_done``: progress, records.jsonl; sent in batches every ``FLUSH_S``) and merges the results. Workers ignore SIGINT;
``stop()`` (the parent's Ctrl-C) sends each one SIGTERM, which stops its sending the way Ctrl-C
stops a single process (in-flight requests get the grace period, every record is kept).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import queue
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import orjson

from speclens.bench.client import LoadConfig, LoadGenerator, RequestRecord, RunResult
from speclens.bench.datasets import Prompt

#: Seconds between the start signal and the measured phase's origin: every worker is waiting
#: on its pipe by then, so none starts late.
START_AHEAD_S = 0.05

#: Seconds between a worker's batches of finished records (progress and records.jsonl lag by
#: at most this much).
FLUSH_S = 0.05

#: Seconds a worker is given to exit after its results, before it is killed.
JOIN_TIMEOUT_S = 10.0


class WorkerFailed(RuntimeError):
    """A worker process died or raised; the message says which and why."""


def worker_parts(config: LoadConfig, workers: int) -> list[LoadConfig]:
    """The configs of ``workers`` parts of ``config`` (itself possibly a shard p/P): worker w
    takes part p + P * w of P * workers, so shards and workers compose."""
    p, parts = config.part
    return [replace(config, part=(p + parts * w, parts * workers)) for w in range(workers)]


def run_duration(records: list[RequestRecord], part_durations: list[float]) -> float:
    """A run's duration from its parts' records: the latest end of a measured record, or the
    longest part's duration when none ended. The one meaning for workers (one time origin) and
    for ``bench merge`` (each shard's records count from its own start, the shards run at once),
    as one generator's duration is its last measured end."""
    ends = [r.end for r in records if r.end is not None and not r.warmup]
    return max(ends) if ends else max(part_durations, default=0.0)


def _worker(config: LoadConfig, prompts: list[Prompt], out: Any, start: Any) -> None:
    """A worker process: run one part, sending ("warm"), ("record", r) and ("done", result)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; SIGTERM stops sending
    try:
        asyncio.run(_work(config, prompts, out, start))
    except BaseException as exc:
        out.put(
            ("error", os.getpid(), f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}")
        )


async def _work(config: LoadConfig, prompts: list[Prompt], out: Any, start: Any) -> None:
    generator = LoadGenerator(config, prompts)
    generator.keep = bytes  # an orjson.Fragment does not pickle; the parent wraps them
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, generator.stop.set)
    out.put(
        ("ready", os.getpid(), None)
    )  # from here SIGTERM stops sending instead of killing the process
    batch: list[RequestRecord] = []
    generator.on_done = batch.append

    def flush() -> None:
        if batch:
            out.put(("records", os.getpid(), batch[:]))
            batch.clear()

    async def flusher() -> None:  # records go up in batches: one pickle and one get per batch
        while True:
            await asyncio.sleep(FLUSH_S)
            flush()

    flushing = asyncio.create_task(flusher())

    async def barrier() -> float | None:
        flush()
        out.put(("warm", os.getpid(), None))
        t0 = await loop.run_in_executor(None, start.recv)
        if t0 is None:
            generator.stop.set()
        return t0  # type: ignore[no-any-return]

    result = await generator.run(before_measure=barrier)
    flushing.cancel()
    flush()
    result.records = []  # already sent in batches
    out.put(("done", os.getpid(), result))


class WorkerPool:
    """Run ``LoadConfig`` split over ``workers`` processes and merge what they send back."""

    def __init__(self, config: LoadConfig, prompts: list[Prompt], workers: int) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.configs = worker_parts(config, workers)
        self.prompts = prompts
        self.on_done: Callable[[RequestRecord], None] | None = None
        self._ctx = mp.get_context("spawn")  # no fork of a parent that runs threads
        self._procs: list[Any] = []
        self._ready: set[int] = set()  # workers whose SIGTERM handler is installed (by pid)
        self._stopped = False

    def stop(self) -> None:
        """Stop sending (Ctrl-C): each worker gets SIGTERM once it can take it (a worker still
        starting gets it when it says it is ready); what it sent so far is kept."""
        self._stopped = True
        for proc in self._procs:
            self._terminate(proc.pid)

    def _terminate(self, pid: int | None) -> None:
        proc = next((p for p in self._procs if p.pid == pid), None)
        if proc is not None and pid in self._ready and proc.is_alive():
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()

    async def run(self, before_measure: Callable[[], Any] | None = None) -> RunResult:
        """Start the workers, wait for every warm-up, call ``before_measure`` once, start the
        measured phase in all of them at one time, and merge their records and results."""
        out = self._ctx.Queue()
        pipes = []
        for config in self.configs:
            receive, send = self._ctx.Pipe(duplex=False)
            proc = self._ctx.Process(
                target=_worker, args=(config, self.prompts, out, receive), daemon=True
            )
            proc.start()
            self._procs.append(proc)
            pipes.append(send)
        records: list[RequestRecord] = []
        results: list[RunResult] = []
        try:
            warm = 0
            while warm < len(self._procs):
                warm += self._take(await self._next(out), records, results) == "warm"
            if before_measure is not None:
                outcome = before_measure()
                if asyncio.iscoroutine(outcome):
                    await outcome
            t0 = None if self._stopped else time.perf_counter() + START_AHEAD_S
            started = time.time() + START_AHEAD_S
            for pipe in pipes:
                pipe.send(t0)
            while len(results) < len(self._procs):
                self._take(await self._next(out), records, results)
        finally:
            self._shutdown()
        records.sort(key=lambda r: r.index)
        return RunResult(
            records,
            started,
            run_duration(records, [r.duration for r in results]),
            any(r.interrupted for r in results) or self._stopped,
            max((r.sending_s for r in results), default=0.0),
            sum(r.in_flight_at_stop for r in results),
        )

    def _take(
        self, message: tuple[str, int, Any], records: list[RequestRecord], results: list[RunResult]
    ) -> str:
        kind, pid, payload = message
        if kind == "ready":
            self._ready.add(pid)
            if self._stopped:
                self._terminate(pid)
        elif kind == "records":
            for record in payload:
                record.responses = [orjson.Fragment(raw) for raw in record.responses]
            records.extend(payload)
            if self.on_done is not None:
                for record in payload:
                    self.on_done(record)
        elif kind == "done":
            results.append(payload)
        elif kind == "error":
            raise WorkerFailed(f"a bench worker failed: {payload}")
        return kind

    async def _next(self, out: Any) -> tuple[str, int, Any]:
        """The next message, checking every 0.2 s that no worker died without a word."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                return await loop.run_in_executor(None, out.get, True, 0.2)
            except queue.Empty:
                dead = [p for p in self._procs if p.exitcode not in (None, 0)]
                if dead:
                    codes = ", ".join(f"{p.pid}: exit {p.exitcode}" for p in dead)
                    raise WorkerFailed(f"a bench worker died ({codes})") from None

    def _shutdown(self) -> None:
        for proc in self._procs:
            proc.join(timeout=JOIN_TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=JOIN_TIMEOUT_S)
