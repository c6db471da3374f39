"""The sim executor's step cost: priced steps, and a fit that recovers known coefficients."""

from __future__ import annotations

import numpy as np
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


def _se(design: list[list[float]], sigma: float) -> np.ndarray:
    """Standard errors of least-squares coefficients: sigma x sqrt(diag((X'X)^-1))."""
    x = np.array(design, dtype=float)
    return np.asarray(sigma * np.sqrt(np.diag(np.linalg.inv(x.T @ x))))


def test_fit_recovers_known_coefficients_through_timing_noise() -> None:
    """Steps priced by a known cost plus seeded Gaussian noise (as a timer adds): every
    coefficient the design can identify comes back within 4.5 of its standard errors, which
    follow from the noise and the design (two-sided false alarm ~7e-6 each), and each band is
    narrow enough to catch a wrong fit (under 15% of the true value)."""
    k, sigma_verify, sigma_draft = 5, 1e-4, 1e-4
    truth = StepCost(base=3e-3, per_token=4e-5, per_seq=2e-5, per_context_token=3e-8,
                     draft_base=6e-4, draft_per_token=7e-6, prefill_base=1e-3, prefill_per_token=2e-5)  # fmt: skip
    rng = np.random.default_rng(11)
    steps = []
    for _ in range(4):
        for batch in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32):
            for context in (64, 256, 1024, 2048):
                query, ctx = batch * (k + 1), context * batch
                draft = k * truth.draft(batch) + rng.normal(0.0, sigma_draft)
                verify = truth.verify(query, batch, ctx) + rng.normal(0.0, sigma_verify)
                steps.append(StepRecord("decode", batch, query, ctx, verify + draft, draft))
        for n in (16, 64, 128, 256, 512, 1024):
            seconds = truth.prefill(n, 1, n) + rng.normal(0.0, sigma_verify)
            steps.append(StepRecord("prefill", 1, n, n, seconds, 0.0))
    fitted = StepCost.fit(steps, num_spec_tokens=k)

    decode = [s for s in steps if s.kind == "decode"]
    prefill = [s for s in steps if s.kind == "prefill"]
    # Decode steps have query = (K + 1) x requests, so per-token and per-request prices are
    # identified only as the price of one more request, (K + 1) x per_token + per_seq.
    se_verify = _se([[1.0, s.num_requests, s.context_tokens] for s in decode], sigma_verify)
    se_draft = _se([[1.0, s.num_requests] for s in decode], sigma_draft / k)
    se_prefill = _se([[1.0, s.query_tokens] for s in prefill], sigma_verify)
    checks = {
        "base": (fitted.base, truth.base, se_verify[0]),
        "per request": (
            (k + 1) * fitted.per_token + fitted.per_seq,
            (k + 1) * truth.per_token + truth.per_seq,
            se_verify[1],
        ),
        "per_context_token": (fitted.per_context_token, truth.per_context_token, se_verify[2]),
        "draft_base": (fitted.draft_base, truth.draft_base, se_draft[0]),
        "draft_per_token": (fitted.draft_per_token, truth.draft_per_token, se_draft[1]),
        "prefill_base": (fitted.prefill_base, truth.prefill_base, se_prefill[0]),
        "prefill_per_token": (fitted.prefill_per_token, truth.prefill_per_token, se_prefill[1]),
    }
    for name, (got, want, se) in checks.items():
        assert want is not None and got is not None, name
        assert 4.5 * se < 0.15 * want, (name, se, want)  # the band can tell a wrong fit
        assert abs(got - want) < 4.5 * se, (name, got, want, se)


def test_one_type_one_formula() -> None:
    """The engine's StepCost is the scenario's and the fast path's (one type, one block size),
    and a decode step's price is the verify forward plus K drafter forwards over the requests
    that draft (none when none does), elementwise over numpy arrays of steps as the fast path
    prices a stretch of them."""
    from speclens import cost
    from speclens.engine import EngineConfig
    from speclens.sim import fast, scenario

    assert scenario.StepCostSpec is StepCost is cost.StepCost
    assert EngineConfig().block_size == cost.BLOCK_SIZE == fast.BLOCK_SIZE
    price = StepCost(base=3e-3, per_token=4e-5, per_seq=2e-5, per_context_token=3e-8,
                     draft_base=7e-4, draft_per_token=6e-6)  # fmt: skip
    rng = np.random.default_rng(0)
    k = 5
    for _ in range(20):
        n = int(rng.integers(1, 9))
        drafts = rng.integers(0, 2, n)  # which requests draft this step
        queries = 1 + k * drafts
        contexts = rng.integers(1, 4000, n) + k * drafts
        whole = price.decode(queries.sum(), n, contexts.sum(), drafts.sum(), k)
        drafter = k * price.draft(drafts.sum()) if drafts.any() else 0.0
        assert whole == pytest.approx(
            price.verify(queries.sum(), n, contexts.sum()) + drafter, rel=1e-12
        )
    steps = np.array([0, 3, 1])  # drafting requests in each of three steps
    assert price.decode(steps * 0 + 1, 1, 0, steps, k).tolist() == pytest.approx([
        price.base + price.per_token + price.per_seq,
        price.base + price.per_token + price.per_seq + k * (price.draft_base + 3 * price.draft_per_token),
        price.base + price.per_token + price.per_seq + k * (price.draft_base + price.draft_per_token),
    ])  # fmt: skip


def test_a_step_cost_validates_as_a_scenario_field() -> None:
    """Validated from a mapping, every problem at once, in the wording ``serve --step-cost``
    uses; built in code, it checks nothing until ``problems`` (``EngineConfig.validate``)."""
    from speclens.acceptance import ValidationError
    from speclens.acceptance.files import validate

    assert validate(StepCost, {"base": 1, "prefill_base": None}, "c.yaml") == StepCost(base=1.0)
    with pytest.raises(ValidationError) as info:
        validate(StepCost, {"base": float("inf"), "per_seq": -1, "per_token": True}, "c.yaml")
    assert sorted(str(p) for p in info.value.problems) == [
        "c.yaml: base: expected a finite number >= 0 (seconds), got inf",
        "c.yaml: per_seq: expected a finite number >= 0 (seconds), got -1.0",
        "c.yaml: per_token: expected a number, got a boolean (True)",
    ]
    assert StepCost(base=float("inf")).problems() == [
        "base: expected a finite number >= 0 (seconds), got inf"
    ]
