"""What the step loop needs from tensor parallelism, below ``parallel`` (which starts the ranks
and builds each rank's ``Engine``): the view of a rank the engine steps with, the forced draw
every rank makes in lockstep, and the error when the ranks disagree about a step.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from speclens.sampling import SyntheticAcceptance

if TYPE_CHECKING:
    from speclens.engine.drafters import Proposal
    from speclens.engine.model import LlamaModel
    from speclens.engine.request import SamplingParams
    from speclens.sampling.rejection import SamplerOutput

log = logging.getLogger(__name__)

#: Test-only: every rank draws its forced accept decisions with an unseeded ``torch.rand``
#: (the bug the lockstep stream prevents), so the lockstep check can be shown to catch it.
UNSEEDED_ENV = "SPECLENS_TEST_UNSEEDED_RANK_DRAW"


class LockstepError(RuntimeError):
    """The ranks disagreed about a step (its batch or its accepted counts)."""


class Lockstep(Protocol):
    """A tensor-parallel rank as the engine's step loop uses it (``parallel.Rank`` is one)."""

    rank: int
    device: torch.device
    debug_lockstep: bool
    #: What a dead rank left behind (rank 0 only), or None.
    dead: str | None

    @property
    def leader(self) -> bool: ...
    def shard(self, model: LlamaModel) -> None: ...
    def check(self) -> None: ...
    def heartbeat(self) -> None: ...
    def close(self) -> None: ...
    def note_add(self, ids: Sequence[int], params: SamplingParams, request_id: str) -> None: ...
    def note_abort(self, request_id: str) -> None: ...
    def send_plan(self, kind: str, request_ids: list[str]) -> None: ...
    def share_tokens(self, tokens: torch.Tensor) -> torch.Tensor: ...
    def share_proposal(self, proposal: Proposal | None, batch: int, k: int) -> torch.Tensor: ...
    def share_sampled(self, out: SamplerOutput, forced: bool) -> SamplerOutput: ...
    def check_lockstep(self, num_accepted: torch.Tensor) -> None: ...
    def record(self, accepted: list[int]) -> None: ...


class UnseededAcceptance(SyntheticAcceptance):
    """Test-only (``SPECLENS_TEST_UNSEEDED_RANK_DRAW=1``): accept decisions from a generator each
    rank seeds from the OS, the per-rank ``torch.rand`` the seed warns about."""

    def _uniforms(self, generator: torch.Generator, batch: int, width: int) -> torch.Tensor:
        unseeded = getattr(self, "_unseeded", None)
        if unseeded is None:
            unseeded = torch.Generator(device=generator.device)
            unseeded.seed()
            self._unseeded = unseeded
        return torch.rand((batch, width), generator=unseeded, device=generator.device)


def synthetic_for(
    rates: Sequence[float],
    seed: int,
    size: int,
    spread: Sequence[float] | None = None,
    derived: bool = True,
    coverage: float = 1.0,
) -> SyntheticAcceptance:
    """The forced draw of a rank (``size`` ranks in all): ``SyntheticAcceptance``, or under the
    test-only switch its unseeded negative control."""
    if size > 1 and os.environ.get(UNSEEDED_ENV) == "1":
        log.warning("%s=1: every rank draws unseeded (a test-only switch)", UNSEEDED_ENV)
        return UnseededAcceptance(rates, seed, spread, derived, coverage)
    return SyntheticAcceptance(rates, seed, spread, derived, coverage)
