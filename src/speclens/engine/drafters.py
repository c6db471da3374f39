"""Drafters: who proposes up to K tokens per request each step.

- ``NgramDrafter`` (prompt lookup, no model): vLLM's rule. The longest suffix of the context
  (prompt and output so far, n from ``ngram_max`` down to ``ngram_min``) that occurs earlier; of
  its occurrences the earliest wins; propose up to K tokens that followed it.
- ``DraftModelDrafter``: a second, smaller model (or a layer subset of the target) run
  autoregressively K times against its own KV pool, optionally stopping a request early when its
  confidence falls below a threshold (the confidence schedule).
- ``SimDrafter``: seeded random proposals for the ``sim`` executor, priced by the step-cost model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from speclens.cost import Pricing
from speclens.engine import logits as logits_ops
from speclens.engine.batch import build_batch
from speclens.engine.kv_cache import BlockManager
from speclens.engine.model import KVPool, LlamaModel
from speclens.engine.request import Request


@dataclass
class Proposal:
    """``token_ids`` [B, K] (padded with 0), ``num_tokens`` [B], ``probs`` [B, K, V] or None."""

    token_ids: torch.Tensor
    num_tokens: torch.Tensor
    probs: torch.Tensor | None = None
    seconds: float = 0.0  # priced cost (sim only)


def _one_hot(token_ids: torch.Tensor, vocab: int) -> torch.Tensor:
    probs = torch.zeros((*token_ids.shape, vocab), dtype=torch.float32, device=token_ids.device)
    return probs.scatter_(-1, token_ids.unsqueeze(-1), 1.0)


class NgramDrafter:
    """Prompt-lookup drafting: no model, no KV. Follows vLLM 0.32.0's n-gram proposer exactly
    (``vllm/v1/spec_decode/ngram_proposer.py``), so a profile measured here is what vLLM measures.
    """

    def __init__(
        self,
        k: int,
        vocab_size: int,
        ngram_max: int = 5,
        ngram_min: int = 5,
        fill: bool = False,
        max_model_len: int | None = None,
    ) -> None:
        self.k = k
        self.vocab_size = vocab_size
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min
        #: Always propose K tokens, repeating the last one after a short (or no) match. Forced
        #: acceptance needs this: a schedule cannot accept drafts that were never proposed.
        self.fill = fill
        #: Drafts never run past the context limit (None: no limit).
        self.max_model_len = max_model_len

    def prefill(self, requests: Sequence[Request]) -> None:
        """Nothing to compute."""

    def lookup(self, tokens: Sequence[int]) -> list[int]:
        """vLLM's ``_find_longest_matched_ngram_and_propose_tokens``, without the KMP.

        The longest n in [min, max] whose suffix occurs earlier with a token after it; the
        earliest such occurrence; up to K tokens after it (fewer when the context ends first,
        and no more than ``max_model_len - len(tokens)``). Nothing when the context is shorter
        than ``ngram_min``.
        """
        total = len(tokens)
        k = self.k if self.max_model_len is None else min(self.k, self.max_model_len - total)
        if total < self.ngram_min or k <= 0:
            return []
        context = np.asarray(tokens, dtype=np.int64)
        for n in range(min(self.ngram_max, total - 1), self.ngram_min - 1, -1):
            # Windows start at 0..total-1-n: each occurrence has a token after it.
            windows = sliding_window_view(context[: total - 1], n)
            hits = np.flatnonzero((windows == context[total - n :]).all(axis=1))
            if hits.size:
                start = int(hits[0]) + n
                return [int(t) for t in context[start : start + k]]
        return []

    def room(self, num_tokens: int) -> int:
        """Drafts a step can verify: vLLM's scheduler keeps the step's last position inside
        ``max_model_len`` (``vllm/v1/core/sched/scheduler.py``, ``schedule``), one fewer than the
        proposer's own cap."""
        if self.max_model_len is None:
            return self.k
        return max(0, min(self.k, self.max_model_len - 1 - num_tokens))

    def propose(
        self, requests: Sequence[Request], want_probs: bool, device: torch.device
    ) -> Proposal:
        ids = torch.zeros((len(requests), self.k), dtype=torch.int64)
        counts = torch.zeros(len(requests), dtype=torch.int64)
        for b, request in enumerate(requests):
            tokens = request.prompt_token_ids + request.output_token_ids
            room = self.room(len(tokens))
            found = self.lookup(tokens)[:room]
            if self.fill:
                found += [(found or [request.last_token])[-1]] * (room - len(found))
            if found:
                ids[b, : len(found)] = torch.tensor(found)
                counts[b] = len(found)
        ids, counts = ids.to(device), counts.to(device)
        return Proposal(ids, counts, _one_hot(ids, self.vocab_size) if want_probs else None)


class DraftModelDrafter:
    """A small model that drafts autoregressively against its own KV pool."""

    def __init__(
        self,
        model: LlamaModel,
        kv: KVPool,
        blocks: BlockManager,
        k: int,
        num_layers: int | None = None,
        confidence_threshold: float | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        self.model = model
        model.pack()
        self.kv = kv
        self.blocks = blocks
        self.k = k
        self.num_layers = num_layers
        self.confidence_threshold = confidence_threshold
        self.generator = generator
        self.device = next(model.parameters()).device

    @torch.inference_mode()
    def _forward(
        self, requests: Sequence[Request], starts: Sequence[int], tokens: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        """Logits [B, V] at each request's last fed token."""
        batch = build_batch(
            [r.block_table for r in requests],
            starts,
            tokens,
            self.blocks.block_size,
            self.kv.scratch_slot,
            self.device,
        )
        hidden = self.model(batch, self.kv, self.num_layers)
        last = torch.tensor([len(t) - 1 for t in tokens], device=self.device)
        return self.model.logits(hidden[torch.arange(len(tokens)), last])

    def prefill(self, requests: Sequence[Request]) -> None:
        """Compute the drafter's KV for every token a request already has but its last."""
        todo = [r for r in requests if r.num_tokens - 1 > r.num_draft_computed]
        if not todo:
            return
        starts = [r.num_draft_computed for r in todo]
        tokens = [[r.token(p) for p in range(r.num_draft_computed, r.num_tokens - 1)] for r in todo]
        self._forward(todo, starts, tokens)
        for r in todo:
            r.num_draft_computed = r.num_tokens - 1

    def propose(
        self, requests: Sequence[Request], want_probs: bool, device: torch.device
    ) -> Proposal:
        batch = len(requests)
        params = [r.params for r in requests]
        generators = [r.generator for r in requests]
        # First forward catches up from what the drafter has cached to the last token.
        starts = [r.num_draft_computed for r in requests]
        tokens = [
            [r.token(p) for p in range(s, r.num_tokens)]
            for r, s in zip(requests, starts, strict=True)
        ]
        ids = torch.zeros((batch, self.k), dtype=torch.int64, device=self.device)
        probs = []
        active = torch.ones(batch, dtype=torch.bool, device=self.device)
        counts = torch.zeros(batch, dtype=torch.int64, device=self.device)
        greedy = all(p.greedy for p in params)
        for i in range(self.k):
            raw = self._forward(requests, starts, tokens)
            if greedy and not want_probs:  # the common fast path: no distribution needed
                token = raw.argmax(dim=-1)
            else:
                processed = logits_ops.process(raw, params)
                token = logits_ops.sample(processed, generators, self.generator)
                q = processed.softmax(dim=-1)
            if self.confidence_threshold is not None:
                confident = raw.softmax(dim=-1).max(dim=-1).values >= self.confidence_threshold
                active &= confident
            counts += active.to(torch.int64)
            ids[:, i] = torch.where(active, token, 0)
            if want_probs:
                probs.append(q)
            if i + 1 < self.k:
                starts = [r.num_tokens + i for r in requests]
                tokens = [[int(t)] for t in ids[:, i].tolist()]
        return Proposal(
            ids.to(device),
            counts.to(device),
            torch.stack(probs, dim=1).to(device) if want_probs else None,
        )

    def accepted(self, request: Request, num_tokens_before: int, num_accepted: int) -> None:
        """After verification: the drafter's cache is valid through the accepted drafts."""
        request.num_draft_computed = num_tokens_before + min(num_accepted, self.k - 1)


class SimDrafter:
    """Seeded random proposals, K per request, priced by the step-cost model."""

    def __init__(self, k: int, vocab_size: int, seed: int, cost: Pricing) -> None:
        self.k = k
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(seed)
        self.cost = cost

    def prefill(self, requests: Sequence[Request]) -> None:
        """Nothing to compute."""

    def propose(
        self, requests: Sequence[Request], want_probs: bool, device: torch.device
    ) -> Proposal:
        batch = len(requests)
        ids = torch.randint(0, self.vocab_size, (batch, self.k), generator=self.generator)
        counts = torch.full((batch,), self.k, dtype=torch.int64)
        seconds = self.k * self.cost.draft(batch)
        return Proposal(ids.to(device), counts.to(device), None, seconds)
