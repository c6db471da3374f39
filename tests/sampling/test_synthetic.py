"""Forced acceptance: SyntheticAcceptance and rejection_sample's synthetic method.

Statistical tolerances. Every check below compares a mean over N independent request-steps with
its expectation under the schedule, using the standard error SE = sqrt(Var / N):

- the realized AL is 1 + mean(accepted), and Var(accepted) = sum_j j^2 P(j) - (sum_j j P(j))^2
  with P(j) from ``accepted_count_distribution`` (P(j) = r_j - r_(j+1));
- a fraction of steps (accepting exactly j, or at least i) is a mean of Bernoulli(pi) indicators,
  Var = pi (1 - pi).

Requests are independent (one uniform per request and position) and steps use distinct seeds, so
the N request-steps are i.i.d. A 4 SE band is exceeded by a correct sampler with probability about
6e-5 per check (normal tail; N >= 100,000 makes the normal approximation exact to that order).
The seeds are fixed, so the tests are deterministic.
"""

from __future__ import annotations

import math

import pytest
import torch

from speclens.acceptance import ValidationError, accepted_count_distribution
from speclens.sampling import SyntheticAcceptance, rejection_sample

BATCH = 20_000
STEPS = 10  # 200,000 request-steps


def _inputs(batch: int, k: int, vocab: int = 50, seed: int = 0):
    """Target argmax, drafts that never equal it (so a correction is recognisable), bonus ids."""
    gen = torch.Generator().manual_seed(seed)
    argmax = torch.randint(0, vocab, (batch, k + 1), generator=gen)
    drafts = (argmax[:, :k] + torch.randint(1, vocab, (batch, k), generator=gen)) % vocab
    bonus = torch.full((batch,), vocab + 1)
    return drafts, argmax, bonus


def _run_steps(synthetic: SyntheticAcceptance, k: int, steps: int = STEPS, batch: int = BATCH):
    """Run ``steps`` synthetic steps on full drafts; check the layout; return all num_accepted."""
    drafts, argmax, bonus = _inputs(batch, k)
    num_draft = torch.full((batch,), k)
    accepted = []
    for _ in range(steps):
        out = rejection_sample(
            "synthetic", drafts, num_draft, bonus, target_argmax=argmax, synthetic=synthetic
        )
        accepted.append(out.num_accepted)
    return torch.cat(accepted)


def _mean_and_variance(rates: list[float]) -> tuple[float, float]:
    dist = accepted_count_distribution(rates)
    mean = sum(j * p for j, p in dist.items())
    return mean, sum(j * j * p for j, p in dist.items()) - mean**2


def _assert_per_position_rates(accepted: torch.Tensor, rates: list[float]) -> None:
    """The fraction of steps accepting >= i drafts is Bernoulli(r_i): within 4 SE of r_i."""
    n = accepted.numel()
    for i, r in enumerate(rates, start=1):
        realized = (accepted >= i).double().mean().item()
        if r in (0.0, 1.0):
            assert realized == r, (i, realized, r)  # rate 0 / 1 are exact: SE = 0
        else:
            se = math.sqrt(r * (1 - r) / n)
            assert abs(realized - r) < 4 * se, (i, realized, r, se)


# --- the minimum-variance schedule at AL 3.78, K 7 ---------------------------------------------


@pytest.fixture(scope="module")
def al_378():
    synthetic = SyntheticAcceptance.from_length(3.78, 7, seed=1234)
    return synthetic, _run_steps(synthetic, 7)


def test_al_378_schedule() -> None:
    synthetic = SyntheticAcceptance.from_length(3.78, 7)
    assert synthetic.rates == [1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0]
    assert synthetic.conditional == [1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0]
    assert synthetic.num_spec_tokens == 7
    assert synthetic.acceptance_length == pytest.approx(3.78)


def test_al_378_realized_length(al_378) -> None:
    synthetic, accepted = al_378
    assert accepted.numel() == 200_000
    # P(2) = 0.22, P(3) = 0.78: mean 2.78, Var = 0.22 * 0.78 = 0.1716,
    # SE = sqrt(0.1716 / 200,000) = 0.000926, so 4 SE = 0.0037.
    mean, var = _mean_and_variance(synthetic.rates)
    assert mean == pytest.approx(2.78)
    assert var == pytest.approx(0.22 * 0.78)
    se = math.sqrt(var / accepted.numel())
    realized = 1.0 + accepted.double().mean().item()
    assert abs(realized - 3.78) < 4 * se, (realized, se)
    assert synthetic.step == STEPS


def test_al_378_accepts_only_two_or_three(al_378) -> None:
    _, accepted = al_378
    assert set(torch.unique(accepted).tolist()) == {2, 3}


def test_al_378_split(al_378) -> None:
    _, accepted = al_378
    # The share of steps accepting exactly 2 is Bernoulli(0.22): SE = sqrt(0.22 * 0.78 / N).
    n = accepted.numel()
    se = math.sqrt(0.22 * 0.78 / n)
    assert abs((accepted == 2).double().mean().item() - 0.22) < 4 * se
    assert abs((accepted == 3).double().mean().item() - 0.78) < 4 * se


def test_rejection_emits_argmax_and_acceptance_emits_drafts(layout) -> None:
    synthetic = SyntheticAcceptance.from_length(3.78, 7, seed=5)
    drafts, argmax, bonus = _inputs(5_000, 7)
    num_draft = torch.full((5_000,), 7)
    out = rejection_sample(
        "synthetic", drafts, num_draft, bonus, target_argmax=argmax, synthetic=synthetic
    )
    accepted, last = layout(out, drafts, num_draft, bonus, argmax)
    rows = torch.arange(5_000)
    assert torch.equal(last, argmax[rows, accepted])  # never all 7 accepted: always a correction
    assert bool((last != drafts[rows, accepted]).all())  # ...which is not the draft


def test_synthetic_matches_its_accept_draws(layout) -> None:
    """rejection_sample stops at the first rejected draw of SyntheticAcceptance.accept and never
    accepts a padded draft (checked against the raw draws replayed from the same step)."""
    k, batch = 6, 3_000
    synthetic = SyntheticAcceptance([0.9, 0.7, 0.6, 0.3, 0.2, 0.1], seed=77)
    drafts, argmax, bonus = _inputs(batch, k, seed=3)
    num_draft = torch.randint(0, k + 1, (batch,), generator=torch.Generator().manual_seed(4))
    for _ in range(3):
        step = synthetic.step
        draws = synthetic.accept(batch, k, "cpu")
        synthetic.step = step
        out = rejection_sample(
            "synthetic", drafts, num_draft, bonus, target_argmax=argmax, synthetic=synthetic
        )
        layout(out, drafts, num_draft, bonus, argmax)
        expected = []
        for row, n in zip(draws.tolist(), num_draft.tolist(), strict=True):
            j = 0
            while j < n and row[j]:
                j += 1
            expected.append(j)
        assert out.num_accepted.tolist() == expected


# --- other schedules ----------------------------------------------------------------------------


def test_vllm_example_rates() -> None:
    rates = [0.9, 0.5, 0.2]
    synthetic = SyntheticAcceptance(rates, seed=99)
    assert synthetic.acceptance_length == pytest.approx(2.6)
    accepted = _run_steps(synthetic, 3)
    _assert_per_position_rates(accepted, rates)
    # P = {0: 0.1, 1: 0.4, 2: 0.3, 3: 0.2}: mean 1.6, Var = 3.4 - 1.6^2 = 0.84,
    # SE = sqrt(0.84 / 200,000) = 0.00205.
    mean, var = _mean_and_variance(rates)
    assert mean == pytest.approx(1.6)
    assert var == pytest.approx(0.84)
    realized = 1.0 + accepted.double().mean().item()
    assert abs(realized - 2.6) < 4 * math.sqrt(var / accepted.numel())


def test_non_minimum_variance_schedule() -> None:
    """Any non-increasing schedule: equal neighbours (c_i = 1) and a 0 followed by 0 (c_i = 0)."""
    rates = [0.95, 0.8, 0.8, 0.4, 0.1, 0.0, 0.0]
    synthetic = SyntheticAcceptance(rates, seed=8)
    accepted = _run_steps(synthetic, 7, steps=5)  # 100,000 request-steps
    _assert_per_position_rates(accepted, rates)
    assert not bool((accepted == 2).any())  # P(2) = r_2 - r_3 = 0
    assert int(accepted.max()) <= 5
    mean, var = _mean_and_variance(rates)
    realized = accepted.double().mean().item()
    assert abs(realized - mean) < 4 * math.sqrt(var / accepted.numel())


@pytest.mark.parametrize("rate", [0.0, 0.1, 0.25, 0.3971428571428571, 0.5, 0.9, 1.0])
def test_from_rate_equals_from_length(rate: float) -> None:
    k = 7
    by_rate = SyntheticAcceptance.from_rate(rate, k, seed=3)
    by_length = SyntheticAcceptance.from_length(1 + k * rate, k, seed=3)
    assert by_rate.rates == pytest.approx(by_length.rates, abs=1e-12)
    drafts, argmax, bonus = _inputs(2_000, k)
    num_draft = torch.full((2_000,), k)
    for _ in range(3):
        a, b = (
            rejection_sample(
                "synthetic", drafts, num_draft, bonus, target_argmax=argmax, synthetic=s
            )
            for s in (by_rate, by_length)
        )
        assert torch.equal(a.output_token_ids, b.output_token_ids)
        assert torch.equal(a.num_accepted, b.num_accepted)


def test_length_one_accepts_nothing(layout) -> None:
    k = 7
    synthetic = SyntheticAcceptance.from_length(1.0, k)
    drafts, argmax, bonus = _inputs(5_000, k)
    num_draft = torch.full((5_000,), k)
    for _ in range(3):
        out = rejection_sample(
            "synthetic", drafts, num_draft, bonus, target_argmax=argmax, synthetic=synthetic
        )
        layout(out, drafts, num_draft, bonus, argmax)
        assert bool((out.num_accepted == 0).all())
        assert torch.equal(out.output_token_ids[:, 0], argmax[:, 0])


@pytest.mark.parametrize("k", [1, 7, 64])  # 64: MAX_NUM_SPEC_TOKENS
def test_length_k_plus_one_accepts_everything(k: int, layout) -> None:
    synthetic = SyntheticAcceptance.from_length(k + 1, k)
    assert synthetic.rates == [1.0] * k
    batch = 2_000
    drafts, argmax, bonus = _inputs(batch, k)
    num_draft = torch.full((batch,), k)
    for _ in range(3):
        out = rejection_sample(
            "synthetic", drafts, num_draft, bonus, target_argmax=argmax, synthetic=synthetic
        )
        layout(out, drafts, num_draft, bonus, argmax)
        assert bool((out.num_accepted == k).all())
        assert torch.equal(out.output_token_ids[:, :k], drafts)
        assert torch.equal(out.output_token_ids[:, k], bonus)


def test_k_64_padded(layout) -> None:
    """The largest K (MAX_NUM_SPEC_TOKENS), drafts of every width up to it."""
    k, batch = 64, 1_000
    synthetic = SyntheticAcceptance.from_length(40.5, k, seed=2)
    drafts, argmax, bonus = _inputs(batch, k)
    num_draft = torch.randint(0, k + 1, (batch,), generator=torch.Generator().manual_seed(1))
    out = rejection_sample(
        "synthetic", drafts, num_draft, bonus, target_argmax=argmax, synthetic=synthetic
    )
    accepted, _ = layout(out, drafts, num_draft, bonus, argmax)
    # min-variance: 39 positions always, the 40th with 0.5, none after (capped by the real drafts)
    assert bool((accepted <= 40).all())
    assert bool((accepted >= num_draft.clamp(max=39)).all())
    assert bool((accepted == 40).any()) and bool((accepted == 39).any())


def test_narrower_drafts_use_leading_positions() -> None:
    synthetic = SyntheticAcceptance.from_length(3.78, 7)
    drafts, argmax, bonus = _inputs(1_000, 2)
    out = rejection_sample(
        "synthetic",
        drafts,
        torch.full((1_000,), 2),
        bonus,
        target_argmax=argmax,
        synthetic=synthetic,
    )
    assert bool((out.num_accepted == 2).all())  # r_1 = r_2 = 1


# --- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rates",
    [
        [],  # no positions
        [0.5, 0.6],  # rises
        [1.0, 0.2, 0.3, 0.0],  # rises later
        [1.2, 0.5],  # above 1
        [0.5, -0.1],  # below 0
        [float("nan")],
        [float("inf")],
    ],
)
def test_invalid_schedules_are_refused(rates: list[float]) -> None:
    with pytest.raises(ValidationError):
        SyntheticAcceptance(rates)


@pytest.mark.parametrize(("length", "k"), [(0.9, 7), (8.5, 7), (2.0, 0)])
def test_invalid_lengths_are_refused(length: float, k: int) -> None:
    with pytest.raises(ValidationError):
        SyntheticAcceptance.from_length(length, k)


@pytest.mark.parametrize("rate", [-0.1, 1.1])
def test_invalid_rates_are_refused(rate: float) -> None:
    with pytest.raises(ValidationError):
        SyntheticAcceptance.from_rate(rate, 7)


def test_drafts_wider_than_schedule_raise() -> None:
    synthetic = SyntheticAcceptance.from_length(3.78, 7)
    drafts, argmax, bonus = _inputs(4, 8)
    with pytest.raises(ValueError):
        rejection_sample(
            "synthetic",
            drafts,
            torch.full((4,), 8),
            bonus,
            target_argmax=argmax,
            synthetic=synthetic,
        )
    assert synthetic.step == 0  # a refused call draws nothing
    with pytest.raises(ValueError):
        synthetic.accept(4, 8, "cpu")


# --- caching, determinism, the lockstep counter -------------------------------------------------


def test_conditional_rates_cached_per_device() -> None:
    synthetic = SyntheticAcceptance([0.9, 0.5, 0.2])
    first = synthetic.conditional_on("cpu")
    assert first is synthetic.conditional_on("cpu")
    assert first is synthetic.conditional_on(torch.device("cpu"))
    assert first.dtype == torch.float32
    assert first.tolist() == pytest.approx([0.9, 0.5 / 0.9, 0.4])
    drafts, argmax, bonus = _inputs(8, 3)
    rejection_sample(
        "synthetic", drafts, torch.full((8,), 3), bonus, target_argmax=argmax, synthetic=synthetic
    )
    assert synthetic.conditional_on("cpu") is first


def _decisions(synthetic: SyntheticAcceptance, steps: int):
    drafts, argmax, bonus = _inputs(512, 7, seed=21)
    num_draft = torch.full((512,), 7)
    return [
        rejection_sample(
            "synthetic", drafts, num_draft, bonus, target_argmax=argmax, synthetic=synthetic
        )
        for _ in range(steps)
    ]


def test_same_seed_same_decisions_every_step() -> None:
    a = _decisions(SyntheticAcceptance.from_length(3.78, 7, seed=42), 8)
    b = _decisions(SyntheticAcceptance.from_length(3.78, 7, seed=42), 8)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x.output_token_ids, y.output_token_ids)
        assert torch.equal(x.num_accepted, y.num_accepted)
    # Different steps draw differently (512 requests at P(3) = 0.78: equal by chance ~1e-130).
    accepted = [x.num_accepted for x in a]
    for i in range(len(accepted)):
        for j in range(i + 1, len(accepted)):
            assert not torch.equal(accepted[i], accepted[j]), (i, j)


def test_different_seeds_differ() -> None:
    a = _decisions(SyntheticAcceptance.from_length(3.78, 7, seed=1), 1)[0]
    b = _decisions(SyntheticAcceptance.from_length(3.78, 7, seed=1000), 1)[0]
    assert not torch.equal(a.num_accepted, b.num_accepted)


def test_step_counter_advances_once_per_call_and_replays() -> None:
    synthetic = SyntheticAcceptance.from_length(3.78, 7, seed=6)
    assert synthetic.step == 0
    drafts, argmax, bonus = _inputs(256, 7)
    num_draft = torch.full((256,), 7)

    def call():
        return rejection_sample(
            "synthetic", drafts, num_draft, bonus, target_argmax=argmax, synthetic=synthetic
        )

    first = [call() for _ in range(4)]
    assert synthetic.step == 4
    synthetic.step = 1
    replay = call()
    assert synthetic.step == 2
    assert torch.equal(replay.output_token_ids, first[1].output_token_ids)
    assert torch.equal(replay.num_accepted, first[1].num_accepted)
    # The other methods do not touch the counter.
    rejection_sample("greedy", drafts, num_draft, bonus, target_argmax=argmax)
    assert synthetic.step == 2


def test_each_step_draws_from_its_stream_seed() -> None:
    """The per-step seed lives in one place, ``stream_seed``: step n's decisions are uniforms
    from a generator seeded with ``stream_seed(n)`` (the splitmix64-scrambled base plus n, modulo
    2**32), and a schedule that names another stream draws from that one."""
    synthetic = SyntheticAcceptance.from_length(3.78, 7, seed=6)
    conditional = torch.tensor(synthetic.conditional)
    for step in range(3):
        expected = torch.rand(
            (32, 7), generator=torch.Generator().manual_seed(synthetic.stream_seed(step))
        )
        assert torch.equal(synthetic.accept(32, 7, "cpu"), expected < conditional)
    assert synthetic.stream_seed(2**32 + 5) == synthetic.stream_seed(5)
    assert synthetic.stream_seed(1) != SyntheticAcceptance([0.5], seed=7).stream_seed(0)

    class Shifted(SyntheticAcceptance):
        def stream_seed(self, step: int) -> int:
            return super().stream_seed(step + 1)

    plain = SyntheticAcceptance(synthetic.rates, seed=6)
    plain.step = 1
    assert torch.equal(
        Shifted(synthetic.rates, seed=6).accept(32, 7, "cpu"), plain.accept(32, 7, "cpu")
    )
