"""The closed loop of a published point: its schedule in stretches, priced afterwards.

Each property is checked against an independent computation: a step-by-step expansion of the
stretches priced one step at a time, the closed form of a single client, and the concurrency
bound counted from the requests' own arrival and finish steps."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from speclens.cost import StepCost
from speclens.sim import catalog
from speclens.sim.closed_loop import Load, Schedule, schedule
from speclens.sim.roofline import Roofline

COST = StepCost(base=2e-3, per_token=3e-5, per_seq=1e-4, per_context_token=2e-7,
                draft_base=4e-4, draft_per_token=2e-6, prefill_base=5e-3,
                prefill_per_token=2e-5)  # fmt: skip


def _roofline() -> Roofline:
    return Roofline(catalog.model("deepseek-v3"), catalog.chip("h200"), 8, "mtp")


def _per_step(s: Schedule, cost: object) -> np.ndarray:
    """Every step priced on its own (the stretches expanded, each step's context grown), summed
    back per stretch."""
    out = []
    for j in range(len(s.n)):
        n = int(s.n[j])

        def rep(a: np.ndarray, j: int = j, n: int = n) -> np.ndarray:
            return np.repeat(a[j : j + 1], n)

        steps = Schedule(s.load, np.ones(n), rep(s.decoding), rep(s.verify_tokens),
                         s.context[j] + s.growth[j] * np.arange(n), np.zeros(n),
                         rep(s.prefill_tokens), rep(s.prefill_requests), rep(s.prefill_pairs),
                         rep(s.prefill_before), s.arrival, s.first, s.last, s.inputs, s.outputs)  # fmt: skip
        out.append(steps.price(cost).sum())  # type: ignore[arg-type]
    return np.array(out)


@pytest.mark.parametrize("scheduler", ["separate", "mixed"])
@pytest.mark.parametrize("k, al", [(0, 1.0), (3, 2.4)])
def test_a_stretch_prices_as_its_steps_one_by_one(scheduler: str, k: int, al: float) -> None:
    """A stretch priced at its first and last step equals its steps priced one by one (the
    price is affine in context within a stretch), on a linear cost and on a roofline."""
    s = schedule(Load(6, 300, 80, k, al, scheduler=scheduler, budget=512))  # type: ignore[arg-type]
    for cost in (COST, _roofline()):
        np.testing.assert_allclose(s.price(cost), _per_step(s, cost), rtol=1e-9)  # type: ignore[arg-type]


def test_one_client_matches_the_closed_form() -> None:
    """At concurrency 1 every request runs alone: TTFT is its prefill step, TPOT its decode
    steps over its tokens less one, and the run lasts the sum of its requests."""
    load = Load(1, 200, 50, requests=5)
    s = schedule(load)
    f = s.figures(COST, front=0.01)
    prefill = 5e-3 + 2e-5 * s.inputs
    np.testing.assert_allclose(f.ttft_s, prefill + 0.01, rtol=1e-12)
    steps = s.outputs - 1
    # Decode step j of a request of prompt P attends over P + 1 + j tokens (its context).
    decode = np.array([sum(2e-3 + 3e-5 + 1e-4 + 2e-7 * (p + 1 + j) for j in range(n))
                       for p, n in zip(s.inputs, steps, strict=True)])  # fmt: skip
    np.testing.assert_allclose(f.tpot_s, decode / steps, rtol=1e-9)
    assert f.duration_s == pytest.approx(float((prefill + decode).sum()) + 5 * 0.01, rel=1e-9)


@pytest.mark.parametrize("scheduler", ["separate", "mixed"])
def test_the_loop_keeps_concurrency_requests_in_flight(scheduler: str) -> None:
    """Never more than c requests between arrival and last token, exactly c until the loop
    drains (each client sends its next request the step its last one ends)."""
    load = Load(7, 400, 60, scheduler=scheduler, budget=1024)  # type: ignore[arg-type]
    s = schedule(load)
    assert len(s.outputs) == 70
    stretches = len(s.n)
    live = np.zeros(stretches + 1, dtype=int)
    for a, e in zip(s.arrival, s.last, strict=True):
        assert a <= e
        live[a : e + 1] += 1
    assert live.max() == 7
    # Until the last request is sent, every stretch runs with all seven in flight.
    assert (live[: s.arrival.max()] == 7).all()
    # Each request arrives when its predecessor on the same client has finished.
    assert sorted(s.arrival[7:]) == sorted((s.last[:63] + 1).tolist())


def test_decode_steps_follow_the_acceptance_length() -> None:
    """A speculating request needs ceil((output - 1) / AL) decode steps: at concurrency 1 its
    steps are its stretches' steps between its first and last token."""
    for al in (1.0, 1.7, 3.0):
        s = schedule(Load(1, 100, 41, 3, al, requests=3))
        for r in range(3):
            steps = s.n[s.first[r] + 1 : s.last[r] + 1].sum()
            assert steps == math.ceil((s.outputs[r] - 1) / al)


def test_one_speculating_client_matches_the_closed_form() -> None:
    """At concurrency 1, K 3 and AL 2.5: a request's decode step j verifies K + 1 tokens over a
    context of its prompt + 1 + 2.5 j (AL tokens emitted a step), and its K drafter forwards
    each draft for it; TPOT is their sum over its tokens less one."""
    s = schedule(Load(1, 200, 50, 3, 2.5, requests=5))
    f = s.figures(COST)
    steps = np.ceil((s.outputs - 1) / 2.5).astype(int)
    draft = 3 * (4e-4 + 2e-6 * 1)
    decode = np.array([sum(2e-3 + 3e-5 * 4 + 1e-4 + 2e-7 * (p + 1 + 2.5 * j) + draft
                           for j in range(n))
                       for p, n in zip(s.inputs, steps, strict=True)])  # fmt: skip
    np.testing.assert_allclose(f.tpot_s, decode / (s.outputs - 1), rtol=1e-9)


def test_tpot_falls_as_the_acceptance_length_rises() -> None:
    roof = _roofline()
    tpots = [schedule(Load(16, 1024, 256, 3, al)).figures(roof, 0.0, 8).median_tpot_s
             for al in (1.0, 2.0, 3.0, 4.0)]  # fmt: skip
    assert all(a > b for a, b in itertools.pairwise(tpots))


def test_separate_prefills_stall_decodes_and_mixed_ones_share_the_step() -> None:
    sep = schedule(Load(8, 2000, 100, scheduler="separate", budget=4096))
    assert not ((sep.prefill_tokens > 0) & (sep.decoding > 0)).any()
    mixed = schedule(Load(8, 2000, 100, scheduler="mixed", budget=4096))
    assert ((mixed.prefill_tokens > 0) & (mixed.decoding > 0)).any()
    # The budget bounds a mixed step's tokens: decodes first, prompt chunks in what is left.
    assert (mixed.verify_tokens + mixed.prefill_tokens <= 4096).all()
    # A prompt longer than the budget is prefilled in chunks over several steps.
    long = schedule(Load(1, 5000, 10, budget=2048, requests=1))
    assert (long.prefill_tokens > 0).sum() == 3


def test_lengths_span_the_benchmarks_range() -> None:
    """Uniform on [0.8 L, L], both ends included (vLLM's ``randint(int(0.8 L), L + 1)``)."""
    s = schedule(Load(50, 1000, 1000))
    for lengths in (s.inputs, s.outputs):
        # 500 draws of 201 values: each end is missed with probability (200/201)^500 ~ 8%, so
        # the fixed seed's draws are checked to reach both.
        assert lengths.min() == 800 and lengths.max() == 1000
    assert abs(s.outputs.mean() - 900) < 15  # uniform on [800, 1000]: mean 900, SE ~ 4


@pytest.mark.parametrize("length, values", [(10, (8, 9, 10)), (9, (7, 8, 9))])
def test_short_lengths_take_each_value_of_the_range_alike(
    length: int, values: tuple[int, ...]
) -> None:
    """Three values (0.8 L rounded down, to L): each drawn a third of the time, within 4 SE."""
    s = schedule(Load(50, length, length))
    n = len(s.inputs)
    se = math.sqrt(n * (1 / 3) * (2 / 3))
    for lengths in (s.inputs, s.outputs):
        assert set(lengths.tolist()) == set(values)
        for v in values:
            assert abs(int((lengths == v).sum()) - n / 3) < 4 * se


@pytest.mark.parametrize(
    "load, field",
    [(Load(0, 10, 10), "concurrency"), (Load(1, 10, 0), "output_tokens"),
     (Load(1, 10, 10, 3, 4.5), "acceptance_length"), (Load(1, 10, 10, requests=10**6), "requests")],
)  # fmt: skip
def test_a_bad_load_is_refused_by_field(load: Load, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        schedule(load)


def test_a_mixed_step_leaves_the_prompts_what_k_plus_one_verify_tokens_a_request_do_not() -> None:
    """Speculating at K 3, each decoding request takes K + 1 = 4 of a mixed step's budget; the
    prompt chunks fill the rest, so a step whose chunk the budget cuts carries exactly it."""
    s = schedule(Load(8, 2000, 100, 3, 2.0, scheduler="mixed", budget=1024))
    assert (s.verify_tokens == 4 * s.decoding).all()
    both = (s.prefill_tokens > 0) & (s.decoding > 0)
    assert both.any()
    assert (s.verify_tokens + s.prefill_tokens <= 1024).all()
    # A 2000-token prompt never fits what 1024 less the decodes' tokens leaves: a step that cut
    # its chunk carries the budget whole (one that ended a prompt may carry less).
    whole = s.verify_tokens[both] + s.prefill_tokens[both] == 1024
    assert whole.sum() > both.sum() / 2
