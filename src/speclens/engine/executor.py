"""Executors: what a forward costs and returns.

- ``TorchExecutor`` runs real forward passes of the target (CPU here; CUDA where present).
- ``SimExecutor`` runs none: it emits seeded token ids and prices the step with ``StepCost``.
  Everything else (scheduler, drafter calls, acceptance machinery) is shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from speclens.engine.batch import build_batch
from speclens.engine.config import Pricing
from speclens.engine.kv_cache import BlockManager
from speclens.engine.model import KVPool, LlamaModel
from speclens.engine.request import Request


@dataclass
class Forward:
    """A forward's result: logits (torch) or argmax ids (sim), and its priced cost (sim)."""

    logits: torch.Tensor | None = None
    argmax: torch.Tensor | None = None
    seconds: float = 0.0


class TorchExecutor:
    """The target model against its paged KV pool."""

    def __init__(self, model: LlamaModel, kv: KVPool, blocks: BlockManager) -> None:
        self.model = model
        model.pack()
        self.kv = kv
        self.blocks = blocks
        self.device = next(model.parameters()).device
        self.vocab_size = model.config.vocab_size
        #: Query tokens per request of the latest verify forward (the widest request's).
        self.last_query_width = 0

    @torch.inference_mode()
    def _run(
        self, requests: Sequence[Request], starts: Sequence[int], tokens: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        batch = build_batch(
            [r.block_table for r in requests],
            starts,
            tokens,
            self.blocks.block_size,
            self.kv.scratch_slot,
            self.device,
        )
        return self.model(batch, self.kv)

    def prefill(self, requests: Sequence[Request]) -> Forward:
        """Compute every uncached token; logits [B, V] at each request's last token.

        Prompts of unequal length share one forward without padding cost: weights see only the
        real rows (``ForwardBatch.real``) and each request attends on its own when padding would
        dominate (``ForwardBatch.segments``). 8 Spec-Bench prompts of 40 to 779 tokens: 2.3 s in
        one forward, 2.8 s in one forward each, 11.5 s padded to the longest.
        """
        starts = [r.num_computed for r in requests]
        tokens = [[r.token(p) for p in range(r.num_computed, r.num_tokens)] for r in requests]
        return Forward(logits=self._prefill_logits(requests, starts, tokens))

    def _prefill_logits(
        self, requests: Sequence[Request], starts: Sequence[int], tokens: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        hidden = self._run(requests, starts, tokens)
        last = torch.tensor([len(t) - 1 for t in tokens], device=self.device)
        return self.model.logits(hidden[torch.arange(len(requests)), last])

    def verify(
        self,
        requests: Sequence[Request],
        draft_ids: torch.Tensor,
        num_drafts: Sequence[int] | None = None,
    ) -> Forward:
        """Target logits [B, K + 1, V] for [last token, d_1..d_K] of every request.

        With ``num_drafts`` given, request b feeds only its 1 + ``num_drafts[b]`` real tokens:
        the forward is as wide as the longest of them (a step where nothing drafted costs a
        plain decode step) and the LM head runs only at real positions. Logits past a request's
        real positions are 0 (never read: the sampler looks at positions 0..num_drafts[b]).
        """
        batch, k = draft_ids.shape
        drafts = draft_ids.tolist()
        counts = [k] * batch if num_drafts is None else list(num_drafts)
        starts = [r.num_tokens - 1 for r in requests]
        tokens = [[r.last_token, *d[:n]] for r, d, n in zip(requests, drafts, counts, strict=True)]
        hidden = self._run(requests, starts, tokens)
        self.last_query_width = hidden.shape[1]
        if all(n == k for n in counts):
            return Forward(logits=self.model.logits(hidden))
        rows = torch.tensor([b for b, n in enumerate(counts) for _ in range(n + 1)])
        cols = torch.tensor([i for n in counts for i in range(n + 1)])
        rows, cols = rows.to(self.device), cols.to(self.device)
        logits = torch.zeros((batch, k + 1, self.vocab_size), device=self.device)
        logits[rows, cols] = self.model.logits(hidden[rows, cols])
        return Forward(logits=logits)


class SimExecutor:
    """No model: seeded token ids, a priced step."""

    def __init__(self, vocab_size: int, cost: Pricing, seed: int) -> None:
        self.vocab_size = vocab_size
        self.cost = cost
        self.generator = torch.Generator().manual_seed(seed)
        self.device = torch.device("cpu")

    def prefill(self, requests: Sequence[Request]) -> Forward:
        tokens = sum(r.num_tokens - r.num_computed for r in requests)
        context = sum(r.num_tokens for r in requests)
        ids = torch.randint(0, self.vocab_size, (len(requests),), generator=self.generator)
        return Forward(argmax=ids, seconds=self.cost.prefill(tokens, len(requests), context))

    def verify(self, requests: Sequence[Request], draft_ids: torch.Tensor) -> Forward:
        batch, k = draft_ids.shape
        ids = torch.randint(0, self.vocab_size, (batch, k + 1), generator=self.generator)
        context = sum(r.num_tokens + k for r in requests)
        return Forward(argmax=ids, seconds=self.cost.verify(batch * (k + 1), batch, context))
