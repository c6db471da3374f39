"""Continuous batching: who runs this step, within the sequence limit, the token budget and the
KV capacity, with preemption (recompute) when the cache is full.

Like nano-vllm, a step is either a prefill of newly admitted requests or a decode step of the
running ones. A decoding request needs room for its K + 1 verify slots; when the cache cannot
give it that, the most recently admitted request is preempted: its blocks are freed and it goes
back to the front of the queue, to be recomputed from its prompt and output so far
(``num_preemptions`` counts them, like vLLM's ``vllm:num_preemptions``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from speclens.engine.kv_cache import BlockManager
from speclens.engine.request import Request, Status


@dataclass
class ScheduledBatch:
    kind: Literal["prefill", "decode", "idle"]
    requests: list[Request] = field(default_factory=list)


class Scheduler:
    def __init__(
        self,
        blocks: BlockManager,
        num_spec_tokens: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
    ) -> None:
        self.blocks = blocks
        self.k = num_spec_tokens
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        #: Preemptions so far (a request preempted twice counts twice).
        self.num_preemptions = 0

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def schedule(self) -> ScheduledBatch:
        prefill = self._admit()
        if prefill:
            return ScheduledBatch("prefill", prefill)
        if not self.running:
            return ScheduledBatch("idle")
        return self._decode()

    def _admit(self) -> list[Request]:
        batch: list[Request] = []
        budget = self.max_num_batched_tokens
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            tokens = request.num_tokens
            # Room for the prompt (and any output being recomputed) plus the first verify step.
            if tokens > budget or not self.blocks.can_hold(request, tokens + self.k + 1):
                break
            self.waiting.popleft()
            self.blocks.reserve(request, tokens)
            request.status = Status.RUNNING
            self.running.append(request)
            batch.append(request)
            budget -= tokens
        return batch

    def _decode(self) -> ScheduledBatch:
        per_request = self.k + 1
        limit = max(1, min(self.max_num_seqs, self.max_num_batched_tokens // per_request))
        batch: list[Request] = []
        for request in list(self.running):
            if request not in self.running:  # preempted to make room for an earlier one
                continue
            if len(batch) >= limit:
                break
            need = request.num_tokens + self.k  # positions up to num_tokens - 1 + K
            while not self.blocks.can_hold(request, need):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is request:
                    break
            if request.status is Status.RUNNING:
                self.blocks.reserve(request, need)
                batch.append(request)
        return ScheduledBatch("decode", batch)

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.blocks.free(request)
        request.status = Status.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def finish(self, request: Request, reason: str) -> None:
        """End a request (stop, length or abort) and free its cache."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.blocks.free(request)
        request.status = Status.FINISHED
        request.finish_reason = reason
