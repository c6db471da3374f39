"""Draft coverage in the simulator: a request-step drafts with probability ``coverage``.

A profile's AL counts only the steps that drafted (vLLM's ``num_drafts``); an n-gram drafter
often finds no match and drafts nothing. Such a request-step is a plain decode step: one token,
no drafter work, one verify slot. ``cover`` installs a drafter and an executor on a ``sim``
engine that price exactly that; at coverage 1.0 they draw nothing extra and price every step as
the engine's own ``SimDrafter`` and ``SimExecutor`` do, so results are unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from speclens.cost import Pricing
from speclens.engine import Engine
from speclens.engine.drafters import Proposal, SimDrafter
from speclens.engine.executor import Forward, SimExecutor
from speclens.engine.request import Request


@dataclass
class Coverage:
    """What a replica's drafter did: decode request-steps, and those that drafted."""

    request_steps: int = 0
    drafting_steps: int = 0

    def add(self, other: Coverage) -> None:
        self.request_steps += other.request_steps
        self.drafting_steps += other.drafting_steps

    @property
    def realized(self) -> float | None:
        """The share of decode request-steps that drafted (None before any)."""
        return self.drafting_steps / self.request_steps if self.request_steps else None


class CoveredDrafter(SimDrafter):
    """``SimDrafter`` whose requests each draft on a step with probability ``coverage`` (drawn
    from their own seeded stream). The K drafter forwards are priced over the requests that
    draft, and not at all when none does."""

    def __init__(
        self, inner: SimDrafter, cost: Pricing, coverage: float, rng: np.random.Generator
    ) -> None:
        super().__init__(inner.k, inner.vocab_size, 0, cost)
        self.generator = inner.generator  # the same proposals as the engine's own drafter
        self.coverage = coverage
        self.rng = rng
        self.tally = Coverage()
        #: Drafts per request of the latest step, read by ``CoveredExecutor``.
        self.counts: list[int] = []

    def propose(
        self, requests: Sequence[Request], want_probs: bool, device: torch.device
    ) -> Proposal:
        batch = len(requests)
        ids = torch.randint(0, self.vocab_size, (batch, self.k), generator=self.generator)
        if self.coverage < 1.0:
            self.counts = [self.k if c else 0 for c in self.rng.random(batch) < self.coverage]
        else:
            self.counts = [self.k] * batch
        drafting = sum(1 for c in self.counts if c)
        self.tally.request_steps += batch
        self.tally.drafting_steps += drafting
        seconds = self.k * self.cost.draft(drafting) if drafting else 0.0
        counts = torch.tensor(self.counts, dtype=torch.int64)
        return Proposal(ids.to(device), counts.to(device), None, seconds)


class CoveredExecutor(SimExecutor):
    """``SimExecutor`` that prices each request's verify slots as its drafts plus one."""

    def __init__(self, inner: SimExecutor, drafter: CoveredDrafter) -> None:
        super().__init__(inner.vocab_size, inner.cost, 0)
        self.generator = inner.generator  # the same token ids as the engine's own executor
        self.drafter = drafter

    def verify(self, requests: Sequence[Request], draft_ids: torch.Tensor) -> Forward:
        batch, k = draft_ids.shape
        ids = torch.randint(0, self.vocab_size, (batch, k + 1), generator=self.generator)
        counts = self.drafter.counts
        slots = sum(counts) + batch
        context = sum(r.num_tokens + d for r, d in zip(requests, counts, strict=True))
        return Forward(argmax=ids, seconds=self.cost.verify(slots, batch, context))


def cover(engine: Engine, coverage: float, rng: np.random.Generator) -> Coverage | None:
    """Make ``engine`` (a ``sim`` engine) draft on a ``coverage`` share of request-steps;
    returns its running tally, or None when the engine does not speculate."""
    drafter, executor = engine.drafter, engine.executor
    if not isinstance(drafter, SimDrafter) or not isinstance(executor, SimExecutor):
        return None
    covered = CoveredDrafter(drafter, executor.cost, coverage, rng)
    engine.drafter = covered
    engine.executor = CoveredExecutor(executor, covered)
    return covered.tally
