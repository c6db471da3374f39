"""The sim executor's step cost: priced steps, and a fit that recovers known coefficients."""

from __future__ import annotations

import pytest

from speclens.engine import StepCost, StepRecord


def _records(cost: StepCost, k: int) -> list[StepRecord]:
    out = []
    for batch in (1, 2, 4, 8, 16, 32):
        for context in (64, 512, 2048):
            query = batch * (k + 1)
            draft = k * cost.draft(batch)
            verify = cost.verify(query, batch, context * batch)
            out.append(StepRecord("decode", batch, query, context * batch, verify + draft, draft))
    out.append(StepRecord("prefill", 1, 300, 300, cost.verify(300, 1, 300), 0.0))
    return out


def test_fit_recovers_the_coefficients_that_made_the_steps() -> None:
    truth = StepCost(
        base=3e-3, per_token=4e-5, per_seq=2e-5, per_context_token=3e-8,
        draft_base=6e-4, draft_per_token=7e-6,
    )  # fmt: skip
    fitted = StepCost.fit(_records(truth, k=5), num_spec_tokens=5)
    for name in (
        "base",
        "per_token",
        "per_seq",
        "per_context_token",
        "draft_base",
        "draft_per_token",
    ):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6), name


def test_fit_never_returns_a_negative_price() -> None:
    # Steps whose cost falls with batch size would need a negative per-token price.
    steps = [StepRecord("decode", b, b * 4, b * 100, 0.01 - 1e-4 * b, 0.0) for b in range(1, 20)]
    fitted = StepCost.fit(steps, num_spec_tokens=3)
    assert min(fitted.base, fitted.per_token, fitted.per_seq, fitted.per_context_token) >= 0.0


def test_fit_needs_enough_steps() -> None:
    with pytest.raises(ValueError, match="at least 4 steps"):
        StepCost.fit([StepRecord("decode", 1, 4, 10, 0.01, 0.0)], num_spec_tokens=3)


def test_prefill_is_priced_apart_when_the_run_has_enough_of_both() -> None:
    truth = StepCost(base=3e-3, per_token=4e-5, per_seq=2e-5, per_context_token=3e-8,
                     draft_base=6e-4, draft_per_token=7e-6, prefill_base=1e-3, prefill_per_token=2e-5)  # fmt: skip
    steps = _records(truth, k=5)[:-1] + [
        StepRecord("prefill", 1, n, n, truth.prefill(n, 1, n), 0.0) for n in (50, 200, 800)
    ]
    fitted = StepCost.fit(steps, num_spec_tokens=5)
    assert fitted.prefill_base == pytest.approx(1e-3, rel=1e-6)
    assert fitted.prefill_per_token == pytest.approx(2e-5, rel=1e-6)
    # Decode alone cannot split per-token from per-request (query = (K + 1) x requests): the
    # price of one more request is what it must get right.
    assert 6 * fitted.per_token + fitted.per_seq == pytest.approx(6 * 4e-5 + 2e-5, rel=1e-6)
    assert StepCost().prefill(100, 1, 100) == StepCost().verify(100, 1, 100)  # unset: as verify
