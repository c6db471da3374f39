"""rejection_sample: the shared output layout, the greedy method and the probabilistic method."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from speclens.sampling import METHODS, PLACEHOLDER, SyntheticAcceptance, rejection_sample

# A correct sampler gives a p-value uniform on [0, 1] (the expected cell counts below are all
# >= ~1,000, so Pearson's chi-square approximation is excellent), so for any seed chosen in advance
# a correct implementation fails with probability 1e-3. The seeds are fixed, so the tests are
# deterministic; 1e-3 is what they would cost in false alarms had the seed been drawn at random.
# Power: a sampler that emitted the wrong distribution would shift at least one cell probability
# by ~0.05; at N = 40,000 that is a chi-square of ~N * 0.05^2 / 0.2 = 500, a p-value of ~1e-100.
P_VALUE_FLOOR = 1e-3


def _inputs(batch: int, k: int, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    """Random drafts, logits (tie-free), draft probabilities, per-request draft counts 0..K."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn((batch, k + 1, vocab), generator=gen)
    draft_probs = torch.softmax(torch.randn((batch, k, vocab), generator=gen), dim=-1)
    argmax = logits.argmax(dim=-1)
    # Half the drafts copy the argmax, so long accepted runs occur for greedy too.
    random_ids = torch.randint(0, vocab, (batch, k), generator=gen)
    copy = torch.rand((batch, k), generator=gen) < 0.8
    drafts = torch.where(copy, argmax[:, :k], random_ids)
    num_draft = torch.randint(0, k + 1, (batch,), generator=gen)
    bonus = torch.randint(vocab, 2 * vocab, (batch,), generator=gen)  # distinct from any id
    return {
        "drafts": drafts,
        "num_draft": num_draft,
        "bonus": bonus,
        "logits": logits,
        "argmax": argmax,
        "draft_probs": draft_probs,
    }


def _run(method: str, x: dict[str, torch.Tensor], seed: int = 0, **kwargs):
    extra: dict[str, object] = {}
    if method == "probabilistic":
        extra = {
            "target_logits": x["logits"],
            "draft_probs": x["draft_probs"],
            "generator": torch.Generator().manual_seed(seed),
        }
    elif method == "greedy":
        extra = {"target_logits": x["logits"]}
    else:
        k = x["drafts"].shape[1]
        extra = {
            "target_logits": x["logits"],
            "synthetic": SyntheticAcceptance.from_length(1 + 0.6 * k, k, seed=seed),
        }
    extra.update(kwargs)
    return rejection_sample(method, x["drafts"], x["num_draft"], x["bonus"], **extra)


def _reference_greedy(drafts, num_draft, argmax, bonus) -> tuple[list[list[int]], list[int]]:
    """A plain-Python greedy verifier."""
    out, accepted = [], []
    k = len(drafts[0]) if drafts else 0
    for d, n, a, b in zip(drafts, num_draft, argmax, bonus, strict=True):
        j = 0
        while j < n and d[j] == a[j]:
            j += 1
        row = [*d[:j], a[j] if j < n else b]
        out.append(row + [PLACEHOLDER] * (k + 1 - len(row)))
        accepted.append(j)
    return out, accepted


# --- the layout, every method -----------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("k", [1, 3, 7, 64])  # 64: MAX_NUM_SPEC_TOKENS
def test_layout_every_method(method: str, k: int, layout) -> None:
    x = _inputs(batch=64, k=k, vocab=16, seed=k)
    out = _run(method, x)
    argmax = None if method == "probabilistic" else x["argmax"]
    accepted, _ = layout(out, x["drafts"], x["num_draft"], x["bonus"], argmax)
    # Requests with no drafts emit only the bonus token.
    none = x["num_draft"] == 0
    assert bool((accepted[none] == 0).all())


@pytest.mark.parametrize("method", METHODS)
def test_padded_drafts_are_never_accepted(method: str, layout) -> None:
    """Padded drafts equal to the argmax (greedy), with rate 1 (synthetic), or with q == p
    (probabilistic) are still never accepted; the bonus token lands at index num_draft_tokens."""
    batch, k, vocab = 40, 5, 8
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn((batch, k + 1, vocab), generator=gen)
    argmax = logits.argmax(dim=-1)
    drafts = argmax[:, :k].clone()  # every draft, padded or not, equals the argmax
    num_draft = torch.arange(batch) % (k + 1)  # 0..K, each several times
    bonus = torch.full((batch,), 100 + vocab)
    kwargs: dict[str, object] = {"target_logits": logits}
    if method == "probabilistic":
        kwargs["draft_probs"] = torch.softmax(logits[:, :k], dim=-1)  # q == p: always accept
        kwargs["generator"] = torch.Generator().manual_seed(2)
    if method == "synthetic":
        kwargs["synthetic"] = SyntheticAcceptance.from_length(k + 1, k)  # rate 1.0 everywhere
    out = rejection_sample(method, drafts, num_draft, bonus, **kwargs)
    accepted, last = layout(out, drafts, num_draft, bonus)
    assert torch.equal(accepted, num_draft)
    assert torch.equal(last, bonus)
    assert torch.equal(out.output_token_ids.gather(1, num_draft.unsqueeze(1)).squeeze(1), bonus)


@pytest.mark.parametrize("method", ["greedy", "synthetic"])
def test_target_argmax_equals_target_logits(method: str) -> None:
    x = _inputs(batch=200, k=6, vocab=32, seed=3)
    by_logits = _run(method, x, seed=5)
    by_argmax = _run(method, x, seed=5, target_logits=None, target_argmax=x["argmax"])
    assert torch.equal(by_logits.output_token_ids, by_argmax.output_token_ids)
    assert torch.equal(by_logits.num_accepted, by_argmax.num_accepted)


def test_missing_inputs_raise() -> None:
    x = _inputs(batch=2, k=3, vocab=5, seed=0)
    args = (x["drafts"], x["num_draft"], x["bonus"])
    with pytest.raises(ValueError):
        rejection_sample("greedy", *args)  # neither logits nor argmax
    with pytest.raises(ValueError):
        rejection_sample("synthetic", *args, target_logits=x["logits"])  # no schedule
    with pytest.raises(ValueError):
        rejection_sample("probabilistic", *args, target_logits=x["logits"])  # no draft probs
    with pytest.raises(ValueError):
        rejection_sample("beam", *args, target_logits=x["logits"])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        rejection_sample(
            "greedy", x["drafts"][0], x["num_draft"], x["bonus"], target_logits=x["logits"]
        )


# --- greedy -----------------------------------------------------------------------------------


def _greedy(drafts, num_draft, argmax, bonus):
    return rejection_sample(
        "greedy",
        torch.tensor(drafts),
        torch.tensor(num_draft),
        torch.tensor(bonus),
        target_argmax=torch.tensor(argmax),
    )


@pytest.mark.parametrize(
    ("drafts", "num_draft", "expected_tokens", "expected_accepted"),
    [
        ([5, 6, 7], 3, [5, 6, 7, 99], 3),  # all accepted: bonus at index K
        ([5, 6, 9], 3, [5, 6, 7, -1], 2),  # mismatch at 2: the argmax 7 is emitted
        ([5, 1, 7], 3, [5, 6, -1, -1], 1),  # a later match after a mismatch does not count
        ([1, 6, 7], 3, [5, -1, -1, -1], 0),  # first draft rejected
        ([5, 6, 7], 2, [5, 6, 99, -1], 2),  # padded draft equal to the argmax: not accepted
        ([5, 6, 7], 1, [5, 99, -1, -1], 1),
        ([5, 6, 7], 0, [99, -1, -1, -1], 0),  # no drafts: only the bonus token
        ([5, 3, -1], 2, [5, 6, -1, -1], 1),  # -1 padding
    ],
)
def test_greedy_hand_built(drafts, num_draft, expected_tokens, expected_accepted) -> None:
    out = _greedy([drafts], [num_draft], [[5, 6, 7, 8]], [99])
    assert out.output_token_ids.tolist() == [expected_tokens]
    assert out.num_accepted.tolist() == [expected_accepted]


def test_greedy_batch_rows_are_independent() -> None:
    out = _greedy(
        [[5, 6, 7], [5, 0, 7], [1, 1, 1]],
        [3, 3, 2],
        [[5, 6, 7, 8], [5, 6, 7, 8], [1, 1, 1, 1]],
        [99, 98, 97],
    )
    assert out.output_token_ids.tolist() == [[5, 6, 7, 99], [5, 6, -1, -1], [1, 1, 97, -1]]
    assert out.num_accepted.tolist() == [3, 1, 2]


@settings(max_examples=100, deadline=None)
@given(
    st.integers(min_value=1, max_value=6).flatmap(
        lambda k: st.lists(
            st.tuples(
                st.lists(st.integers(0, 2), min_size=k, max_size=k),  # drafts (small vocab)
                st.lists(st.integers(0, 2), min_size=k + 1, max_size=k + 1),  # argmax
                st.integers(0, k),  # real drafts
                st.integers(10, 20),  # bonus
            ),
            min_size=1,
            max_size=8,
        )
    )
)
def test_greedy_matches_reference(rows) -> None:
    drafts, argmax, num_draft, bonus = (list(c) for c in zip(*rows, strict=True))
    out = _greedy(drafts, num_draft, argmax, bonus)
    ref_tokens, ref_accepted = _reference_greedy(drafts, num_draft, argmax, bonus)
    assert out.output_token_ids.tolist() == ref_tokens
    assert out.num_accepted.tolist() == ref_accepted


# --- probabilistic ----------------------------------------------------------------------------

P0 = torch.tensor([0.30, 0.25, 0.20, 0.12, 0.08, 0.05], dtype=torch.float64)
Q0 = torch.tensor([0.10, 0.15, 0.25, 0.25, 0.15, 0.10], dtype=torch.float64)
P1 = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.20, 0.30], dtype=torch.float64)
Q1 = torch.tensor([0.30, 0.20, 0.20, 0.10, 0.10, 0.10], dtype=torch.float64)
P2 = torch.full((6,), 1 / 6, dtype=torch.float64)  # the bonus position; unused by the sampler


@pytest.fixture(scope="module")
def probabilistic_run(layout):
    """N = 40,000 requests, K = 2, V = 6; drafts sampled from q; one fixed seed."""
    n = 40_000
    gen = torch.Generator().manual_seed(20_240_601)
    drafts = torch.stack(
        [torch.multinomial(q.float(), n, replacement=True, generator=gen) for q in (Q0, Q1)],
        dim=1,
    )
    target_logits = torch.stack([P0, P1, P2]).log().float().expand(n, 3, 6)
    draft_probs = torch.stack([Q0, Q1]).float().expand(n, 2, 6)
    num_draft = torch.full((n,), 2)
    bonus = torch.full((n,), 1000)
    out = rejection_sample(
        "probabilistic",
        drafts,
        num_draft,
        bonus,
        target_logits=target_logits,
        draft_probs=draft_probs,
        generator=gen,
    )
    layout(out, drafts, num_draft, bonus)
    return drafts, out


def test_probabilistic_first_token_follows_target(probabilistic_run, pvalue) -> None:
    drafts, out = probabilistic_run
    first = out.output_token_ids[:, 0]
    counts = torch.bincount(first, minlength=6)
    assert pvalue(counts, P0) > P_VALUE_FLOOR
    # The test has power: the drafts themselves (distributed as q) are rejected against p.
    assert pvalue(torch.bincount(drafts[:, 0], minlength=6), P0) < 1e-12


def test_probabilistic_acceptance_rate_at_position_0(probabilistic_run) -> None:
    _, out = probabilistic_run
    # P(accept at 0) = sum_v min(p(v), q(v)) = 0.70. The indicator is Bernoulli(0.7):
    # SE = sqrt(0.7 * 0.3 / 40,000) = 0.00229; 4 SE (two-sided p ~ 6e-5) = 0.0092.
    accepted = (out.num_accepted >= 1).double().mean().item()
    expected = float(torch.minimum(P0, Q0).sum())
    se = (expected * (1 - expected) / out.num_accepted.numel()) ** 0.5
    assert abs(accepted - expected) < 4 * se


def test_probabilistic_correction_follows_residual(probabilistic_run, pvalue) -> None:
    """Given a rejection at 0, the emitted token is norm(max(0, p - q)) = (2/3, 1/3, 0, ...)."""
    _, out = probabilistic_run
    rejected = out.num_accepted == 0
    counts = torch.bincount(out.output_token_ids[rejected, 0], minlength=6)
    residual = (P0 - Q0).clamp(min=0)
    assert pvalue(counts, residual / residual.sum()) > P_VALUE_FLOOR  # also: no 0-p tokens


def test_probabilistic_second_token_given_first_accepted(probabilistic_run, pvalue) -> None:
    drafts, out = probabilistic_run
    kept = out.num_accepted >= 1  # ~28,000 rows; the smallest expected cell is ~1,400
    second = out.output_token_ids[kept, 1]
    assert pvalue(torch.bincount(second, minlength=6), P1) > P_VALUE_FLOOR
    assert pvalue(torch.bincount(drafts[kept, 1], minlength=6), P1) < 1e-12


def test_probabilistic_q_equal_p_accepts_every_draft(layout) -> None:
    batch, k, vocab = 2_000, 4, 10
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn((batch, k + 1, vocab), generator=gen)
    p = torch.softmax(logits[:, :k], dim=-1)
    drafts = torch.multinomial(p.reshape(-1, vocab), 1, generator=gen).reshape(batch, k)
    num_draft = torch.full((batch,), k)
    bonus = torch.full((batch,), 77)
    out = rejection_sample(
        "probabilistic",
        drafts,
        num_draft,
        bonus,
        target_logits=logits,
        draft_probs=p,
        generator=gen,
    )
    layout(out, drafts, num_draft, bonus)
    assert bool((out.num_accepted == k).all())
    assert torch.equal(out.output_token_ids[:, :k], drafts)
    assert bool((out.output_token_ids[:, k] == 77).all())


def test_probabilistic_zero_target_probability_never_accepted() -> None:
    """A draft the drafter liked (q = 0.5) but the target forbids (p = 0) is never accepted, and
    the correction is never that token either."""
    batch, vocab = 10_000, 6
    p0 = torch.tensor([0.0, 0.2, 0.2, 0.2, 0.2, 0.2])
    q0 = torch.tensor([0.5, 0.1, 0.1, 0.1, 0.1, 0.1])
    logits = torch.stack([p0.log(), torch.zeros(vocab)]).expand(batch, 2, vocab)
    drafts = torch.zeros((batch, 1), dtype=torch.int64)
    out = rejection_sample(
        "probabilistic",
        drafts,
        torch.ones(batch, dtype=torch.int64),
        torch.full((batch,), 9),
        target_logits=logits,
        draft_probs=q0.expand(batch, 1, vocab),
        generator=torch.Generator().manual_seed(11),
    )
    assert bool((out.num_accepted == 0).all())
    assert bool((out.output_token_ids[:, 0] != 0).all())
    assert bool((out.output_token_ids[:, 1] == PLACEHOLDER).all())


def test_probabilistic_is_reproducible_with_a_seeded_generator() -> None:
    x = _inputs(batch=300, k=5, vocab=12, seed=9)
    a, b = _run("probabilistic", x, seed=4), _run("probabilistic", x, seed=4)
    assert torch.equal(a.output_token_ids, b.output_token_ids)
    assert torch.equal(a.num_accepted, b.num_accepted)


def test_probabilistic_accepts_any_padding_value(layout) -> None:
    """Drafts are "padded (any value) past each request's count": out-of-vocabulary padding (a
    placeholder larger than V) must be ignored, as it is for greedy and synthetic."""
    batch, k, vocab = 8, 4, 6
    x = _inputs(batch=batch, k=k, vocab=vocab, seed=12)
    num_draft = torch.tensor([0, 1, 2, 3, 4, 2, 1, 0])
    padded = torch.arange(k) >= num_draft.unsqueeze(1)
    drafts = torch.where(padded, torch.full_like(x["drafts"], 10 * vocab), x["drafts"])
    out = rejection_sample(
        "probabilistic",
        drafts,
        num_draft,
        x["bonus"],
        target_logits=x["logits"],
        draft_probs=x["draft_probs"],
        generator=torch.Generator().manual_seed(0),
    )
    layout(out, drafts, num_draft, x["bonus"])
