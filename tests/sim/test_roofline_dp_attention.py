"""Under DP attention each attention rank runs its own scheduler over its share of the requests
(SGLang's ``--enable-dp-attention``, TensorRT-LLM's attention DP): the engine's per-request and
per-token work (``per_sequence``, ``per_token``) runs on every rank at once, so a step of R
requests on P ranks pays R / P of it, not R. Without DP attention one scheduler pays all R.

Each price is the difference between a step priced with the overhead and without it: the rest
of the step is the same, so the difference is the overhead term alone, worked out here."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from speclens.sim import catalog
from speclens.sim.roofline import Efficiency, Roofline

PER_SEQUENCE, PER_TOKEN = 2e-5, 3e-6


def _roof(dp_attention: bool, per_sequence: float, per_token: float) -> Roofline:
    e = Efficiency(per_sequence=per_sequence, per_token=per_token)
    return Roofline(catalog.model("deepseek-r1"), catalog.chip("h200"), 8, efficiency=e,
                    expert_parallel=8, dp_attention=dp_attention)  # fmt: skip


@pytest.mark.parametrize("dp_attention, ranks", [(True, 8), (False, 1)])
@pytest.mark.parametrize("counts", ["scalars", "arrays", "floats"])
def test_the_overheads_are_paid_per_rank(dp_attention: bool, ranks: int, counts: str) -> None:
    """64 requests verifying 4 positions each (256 query tokens), K 3 MTP: 64 x 20 us + 256 x
    3 us = 2.048 ms of overhead on one scheduler, 0.256 ms on each of 8 DP-attention ranks
    (the table path, the formula path and numpy's alike)."""
    with_, without = _roof(dp_attention, PER_SEQUENCE, PER_TOKEN), _roof(dp_attention, 0.0, 0.0)
    args: tuple = (256, 64, 64 * 2000, 64, 3)
    if counts == "arrays":
        args = (np.array([256]), np.array([64]), np.array([128_000]), np.array([64]), 3)
    elif counts == "floats":
        args = (256.5, 64.0, 128_000.0, 64.0, 3)
    q = float(np.asarray(args[0]).ravel()[0])
    expected = (64 * PER_SEQUENCE + q * PER_TOKEN) / ranks
    moved = np.asarray(with_.decode(*args)) - np.asarray(without.decode(*args))
    assert float(np.ravel(moved)[0]) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("dp_attention, ranks", [(True, 8), (False, 1)])
def test_a_mixed_step_and_the_terms_pay_it_per_rank_too(dp_attention: bool, ranks: int) -> None:
    """A mixed step of 32 decodes (32 tokens) and 2 prompt chunks: (34 x 20 us + 32 x 3 us) /
    ranks; ``terms``' verify width moves by the decode step's share."""
    with_, without = _roof(dp_attention, PER_SEQUENCE, PER_TOKEN), _roof(dp_attention, 0.0, 0.0)
    mixed = [r.mixed(32, 32, 32 * 1000, 1024, 2, 0, 0, 0) for r in (with_, without)]
    assert float(mixed[0] - mixed[1]) == pytest.approx(
        (34 * PER_SEQUENCE + 32 * PER_TOKEN) / ranks, rel=1e-9
    )
    width = [r.terms(32, 32, 32_000, 0, 0)["verify_width"] for r in (with_, without)]
    assert width[0] - width[1] == pytest.approx((32 * PER_SEQUENCE + 32 * PER_TOKEN) / ranks)


def test_a_prefill_pays_no_per_token_price_and_its_requests_per_rank() -> None:
    """A prompt's tokens run in wide matmuls: a prefill step pays per_sequence (per rank) and
    no per_token."""
    roof = _roof(True, PER_SEQUENCE, PER_TOKEN)
    bare = replace(roof, efficiency=Efficiency(per_sequence=0.0, per_token=0.0))
    moved = float(roof.prefill(4096, 4, 4 * 2048)) - float(bare.prefill(4096, 4, 4 * 2048))
    assert moved == pytest.approx(4 * PER_SEQUENCE / 8, rel=1e-9)
