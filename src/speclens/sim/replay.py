"""Replay a trace in the simulator: the observed requests, at their arrivals (open loop) or at
the run's concurrency (closed loop), each with its own lengths and its own realized acceptance,
priced by a step cost. The fast path's schedule and prices run unchanged; only the requests'
decode steps come from the trace instead of a forced schedule's draws.

A request's decode steps: its verify steps each emit one token plus the drafts it accepted (the
histogram's steps in a seeded random order; counts only, the accepted drafts spread as evenly
as they go, over ``TraceRequest.verify_steps`` where the engine counts tokens, not steps), and
steps that drafted nothing (one token each) fill up to its completion tokens; where the server
counted its decode steps (``num_decode_steps``), exactly those, the step ``max_tokens`` cut
last. ``calibrate`` prices a step over the steps the server counted: a replay that ran fewer
(on speclens serve with n-gram drafting, a request ends on a verify step whose accepted drafts
``max_tokens`` cut, up to K steps short) ran fast by that many.
A request whose trace states no acceptance decodes one token a step. A prefill computes only the
prompt tokens the server did not take from its prefix cache (``cached_tokens``, where it said).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from speclens.cost import Pricing
from speclens.runs.request import RequestRecord
from speclens.runs.rundir import SETTINGS_SCHEMA
from speclens.runs.trace import Trace, TraceRequest
from speclens.sim import fast
from speclens.sim.run_output import SIMULATED, from_trace
from speclens.sim.sketch import Tally, Totals

#: The stream of a replay's draws (the order of a request's verify steps).
REPLAY_STREAM = 0x5E_91A7


class Recorded:
    """Each request's decode steps from its trace entry (``fast.Trajectories``)."""

    def __init__(self, trace: Trace, k: int, rng: np.random.Generator) -> None:
        self.by_index = {r.index: r for r in trace.requests}
        self.k, self.rng = k, rng
        self.histogram = np.zeros(k + 1, dtype=np.int64)
        self.request_steps = 0
        self.drafting_steps = 0

    def _verify_steps(self, r: TraceRequest) -> np.ndarray:
        """The drafts accepted at each of the request's verify steps, in a random order."""
        steps = r.verify_steps(self.k)
        if not self.k or not steps:
            return np.zeros(0, dtype=np.int64)
        if r.histogram:
            keys, counts = np.array(sorted(r.histogram.items()), dtype=np.int64).T
            drawn: np.ndarray = self.rng.permutation(np.repeat(np.minimum(keys, self.k), counts))
            return drawn
        each, extra = divmod(r.accepted or 0, steps)
        spread: np.ndarray = np.minimum(each + (self.rng.permutation(steps) < extra), self.k)
        return spread

    @staticmethod
    def _plain_steps(need: int, accepted: np.ndarray, decode_steps: int | None) -> tuple[int, int]:
        """(steps that drafted nothing, drafts the last step lost to ``max_tokens``). Where the
        server counted its decode steps (``decode_steps``), as many as it ran: its accepted
        drafts then emit past the completion by what ``max_tokens`` cut from its last step
        (one of the verify steps that accepted that many). Else, or where the counts cannot be
        so (another engine's, or a stop string's cut), the plain steps fill up to the completion.
        """
        emitted = int((1 + accepted).sum())
        if decode_steps is not None and decode_steps >= accepted.size:
            plain = decode_steps - accepted.size
            cut = emitted + plain - need
            if cut == 0 or (cut > 0 and bool((accepted >= cut).any())):
                return plain, cut
        return max(0, need - emitted), 0

    def trajectories(
        self, inputs: np.ndarray, outputs: np.ndarray, indices: Sequence[int]
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        for prompt, completion, index in zip(
            inputs.tolist(), outputs.tolist(), indices, strict=True
        ):
            yield self._one(int(prompt), int(completion), self.by_index[index])

    def _one(
        self, prompt: int, completion: int, r: TraceRequest
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        need = max(completion - 1, 0)  # the prefill emits the first token
        accepted = self._verify_steps(r)
        plain, cut = self._plain_steps(need, accepted, r.decode_steps)
        order = self.rng.permutation(accepted.size + plain) if plain and accepted.size else None
        drafting = np.concatenate([np.ones(accepted.size, bool), np.zeros(plain, bool)])
        accepted = np.concatenate([accepted, np.zeros(plain, np.int64)])
        if order is not None:
            drafting, accepted = drafting[order], accepted[order]
        if cut:  # the step max_tokens cut comes last: one that accepted at least what it lost
            last = self.rng.choice(np.flatnonzero(drafting & (accepted >= cut)))
            tail = [int(last), accepted.size - 1]
            drafting[tail], accepted[tail] = drafting[tail[::-1]], accepted[tail[::-1]]
        total = np.cumsum(1 + accepted)
        steps = int(np.searchsorted(total, need)) + 1 if need else 0
        drafting, accepted = drafting[:steps], accepted[:steps]
        emitted = 1 + accepted
        if steps:
            emitted[-1] -= int(total[steps - 1]) - need
        context = prompt + 1 + np.concatenate([[0], np.cumsum(emitted)[:-1]]).astype(np.int64)
        context += drafting * self.k  # a verify step attends over its drafts too
        if self.k:
            self.histogram += np.bincount(accepted[drafting], minlength=self.k + 1)
            self.request_steps += steps
            self.drafting_steps += int(drafting.sum())
        return emitted, context, drafting, accepted


@dataclass
class Replayed:
    records: list[RequestRecord]
    makespan: float
    tally: Tally


def replay(
    trace: Trace,
    cost: Pricing,
    k: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    seed: int = 0,
    front: float = 0.0,
) -> Replayed:
    """Run ``trace`` on one replica, in its own loop; every request's record, in index order,
    as bench keeps it. ``front``: seconds from a request's arrival to the engine seeing it
    (``calibrate``'s ``front_latency_s``)."""
    rng = np.random.default_rng([REPLAY_STREAM, seed])
    draws = Recorded(trace, k, rng)
    tally, pooled = Tally(), Totals()
    records: list[RequestRecord] = []
    category = {r.index: r.category for r in trace.requests}
    cached = {r.index: r.cached for r in trace.requests if r.cached}
    replica = "sim://replay"

    def traced(t: fast.Trace) -> None:
        record = from_trace(t, k, category[t.index], replica)
        record.cached_tokens = cached.get(t.index)  # as observed: the replay of a replay agrees
        records.append(record)

    longest = max(r.output_tokens for r in trace.requests)
    fast.run_replica(
        ((r.index, r.arrival, r.input_tokens, r.output_tokens) for r in trace.requests),
        k, None, 1.0, cost, max_num_seqs, max_num_batched_tokens, longest, trace.concurrency, rng,
        tally, pooled, traced, draws=draws, cached=cached, front=front,
    )  # fmt: skip
    records.sort(key=lambda r: r.index)
    return Replayed(records, tally.end - tally.start, tally)


def settings(trace: Trace, cost_source: str | None, seed: int, k: int) -> dict[str, Any]:
    """summary.json's ``settings`` for a replay: the observed run's own where they mean the same
    (so compare sees the same sampling and lengths), and what says it was a replay."""
    observed = trace.settings
    keep = ("url", "model", "endpoint", "backend", "max_tokens", "ignore_eos", "temperature",
            "stream", "dataset", "dataset_path", "categories", "warmup")  # fmt: skip
    out: dict[str, Any] = {key: observed.get(key) for key in keep}
    out.update({
        "url": None, "model": trace.model or observed.get("model") or "trace",
        "num_requests": len(trace.requests), "duration": None,
        "concurrency": trace.concurrency, "request_rate": observed.get("request_rate"),
        "burstiness": observed.get("burstiness"), "seed": seed, "warmup": 0,
        "ignore_eos": bool(observed.get("ignore_eos", True)),
        "temperature": float(observed.get("temperature") or 0.0),
        "max_tokens": observed.get("max_tokens") or max(r.output_tokens for r in trace.requests),
        "executor": "sim", "loop": "fast", "fallback": None, "shard": None,
        "trace": str(trace.source), "trace_kind": trace.kind, "trace_sha256": trace.identity,
        "step_cost": cost_source, "num_spec_tokens": k or None,
        "prompts_sha256": observed.get("prompts_sha256") or trace_sha256(trace),
        "sampling": SIMULATED, "acceptance_source": "trace", "acceptance_profile": None,
        "gpus": None, "settings_schema": SETTINGS_SCHEMA,
    })  # fmt: skip
    return out


#: What a trace's own workload digest is prefixed with (never equal to a dataset's).
_TRACE_DIGEST = b"speclens.sim.trace/1\n"


def trace_sha256(trace: Trace) -> str:
    """``settings.prompts_sha256`` of a replay of a trace that records none (a trace from
    another tool, or a run written before bench recorded it): its requests (index, category,
    prompt and completion tokens), in index order. The observed run's own digest is kept where it
    records one, so the replay compares with the run it replays."""
    digest = hashlib.sha256(_TRACE_DIGEST)
    for r in sorted(trace.requests, key=lambda r: r.index):
        digest.update(orjson.dumps([r.index, r.category, r.input_tokens, r.output_tokens]) + b"\n")
    return digest.hexdigest()
