"""Shared helpers for the sampling tests: the output-layout check and the chi-square p-value."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from speclens.sampling import PLACEHOLDER, SamplerOutput


def check_layout(
    out: SamplerOutput,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    target_argmax: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Assert the layout every method shares; return (num_accepted, the last emitted token).

    [B, K + 1] int64: the accepted drafts (equal to the draft ids), then exactly one correction
    or bonus token, then -1. ``num_accepted`` [B] int64 counts the leading drafts, never more than
    the request's real drafts. The bonus token sits at index ``num_draft_tokens`` when every real
    draft was accepted; otherwise the correction is there (the target argmax, when given).
    Real draft ids and bonus ids must be >= 0 for the "emitted" test to be meaningful.
    """
    tokens, accepted = out.output_token_ids, out.num_accepted
    batch, k = draft_token_ids.shape
    assert tokens.shape == (batch, k + 1)
    assert tokens.dtype == torch.int64
    assert accepted.shape == (batch,)
    assert accepted.dtype == torch.int64
    assert bool((accepted >= 0).all())
    assert bool((accepted <= num_draft_tokens).all()), "a padded draft was accepted"

    positions = torch.arange(k + 1)
    # Exactly num_accepted + 1 tokens are emitted, as a prefix; everything after is -1.
    emitted = tokens != PLACEHOLDER
    assert torch.equal(emitted, positions < (accepted + 1).unsqueeze(1))
    # The leading num_accepted tokens are the draft ids themselves.
    leading = positions[:k] < accepted.unsqueeze(1)
    assert torch.equal(tokens[:, :k][leading], draft_token_ids[leading])
    # Then one correction-or-bonus token.
    last = tokens.gather(1, accepted.unsqueeze(1)).squeeze(1)
    full = accepted == num_draft_tokens
    assert torch.equal(last[full], bonus_token_ids[full])
    if target_argmax is not None:
        correction = target_argmax.gather(1, accepted.unsqueeze(1)).squeeze(1)
        assert torch.equal(last[~full], correction[~full])
    return accepted, last


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness-of-fit p-value of ``counts`` against ``probs``.

    Cells with probability 0 must be empty (asserted) and are dropped; with m remaining cells the
    statistic is chi-square with df = m - 1 under H0, whose survival function is the regularized
    upper incomplete gamma function: P(X > x) = Q(df / 2, x / 2) = gammaincc(df / 2, x / 2).
    """
    counts = counts.to(torch.float64)
    probs = probs.to(torch.float64)
    support = probs > 0
    assert float(counts[~support].sum()) == 0.0, "a zero-probability token was emitted"
    counts, probs = counts[support], probs[support] / probs[support].sum()
    expected = counts.sum() * probs
    chi2 = ((counts - expected) ** 2 / expected).sum()
    df = torch.tensor((counts.numel() - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, chi2 / 2))


@pytest.fixture(scope="session")
def layout() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    return check_layout


@pytest.fixture(scope="session")
def pvalue() -> Callable[[torch.Tensor, torch.Tensor], float]:
    return chi2_pvalue
