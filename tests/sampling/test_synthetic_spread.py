"""``SyntheticAcceptance`` with a spread between requests: each row of a step is drawn against its
own request's schedule (fixed by the seed and the request's key, whatever its batchmates and its
row), from the same lockstep uniforms as without a spread, with no host sync; without a spread
the request keys change nothing."""

from __future__ import annotations

import pytest
import torch

from sampling.syncguard import no_host_sync
from speclens.acceptance import conditional_rates, minimum_variance_rates
from speclens.acceptance.spread import RequestDraw, request_rates, request_uniform
from speclens.sampling import SyntheticAcceptance, rejection_sample

K = 7
AL = 3.8
QUANTILES = [1.6, 1.9, 2.2, 2.9, 3.8, 4.6, 5.4, 5.9, 6.8]
KEYS = [f"req-{i}" for i in range(6)]


def spread(seed: int = 3) -> SyntheticAcceptance:
    return SyntheticAcceptance(minimum_variance_rates(AL, K), seed, QUANTILES)


def uniforms(synthetic: SyntheticAcceptance, step: int, batch: int, width: int) -> torch.Tensor:
    """The uniforms of ``step``, drawn as the lockstep stream draws them."""
    gen = torch.Generator().manual_seed(synthetic.stream_seed(step))
    return torch.rand((batch, width), generator=gen)


def test_without_a_spread_request_keys_change_nothing() -> None:
    a = SyntheticAcceptance(minimum_variance_rates(AL, K), 9)
    b = SyntheticAcceptance(minimum_variance_rates(AL, K), 9)
    for _ in range(5):
        assert torch.equal(a.accept(6, K, "cpu"), b.accept(6, K, "cpu", KEYS))
    assert b.num_cached == 0 and b.request_al("x") == pytest.approx(AL)


def test_each_row_is_drawn_against_its_own_request_s_schedule() -> None:
    synthetic = spread()
    draw = RequestDraw(QUANTILES, AL, K)
    for key in KEYS:
        al = draw.al(request_uniform(3, key))
        assert synthetic.request_al(key) == al
        assert synthetic.request_rates(key) == minimum_variance_rates(al, K)
    got = synthetic.accept(len(KEYS), K, "cpu", KEYS)
    own = torch.tensor([conditional_rates(synthetic.request_rates(k)) for k in KEYS])
    assert torch.equal(got, uniforms(synthetic, 0, len(KEYS), K) < own)
    assert synthetic.num_cached == len(KEYS)


def test_a_request_s_rates_depend_on_its_key_not_its_row_or_batchmates() -> None:
    synthetic = spread()
    rows = synthetic.rows(KEYS, K, "cpu")
    shuffled = [KEYS[4], "other", KEYS[1]]
    again = synthetic.rows(shuffled, 4, "cpu")
    assert torch.equal(again[0], rows[4, :4]) and torch.equal(again[2], rows[1, :4])
    synthetic.release(KEYS[4])
    synthetic.release("never-seen")
    assert synthetic.num_cached == len(KEYS)  # 6 - 1 released + "other"


def test_every_rank_draws_the_same_and_another_seed_draws_other_als() -> None:
    """Two instances with the seed (two ranks) agree step by step; the request keys are all a
    rank needs."""
    rank0, rank1 = spread(), spread()
    for step in range(4):
        keys = KEYS[step:]
        assert torch.equal(
            rank0.accept(len(keys), K, "cpu", keys), rank1.accept(len(keys), K, "cpu", keys)
        )
    other = spread(seed=4)
    assert [other.request_al(k) for k in KEYS] != [rank0.request_al(k) for k in KEYS]


def test_stated_rates_keep_their_shape_per_request() -> None:
    stated = [0.9, 0.8, 0.6, 0.3, 0.1, 0.0, 0.0]
    synthetic = SyntheticAcceptance(stated, 3, [1.3, 1.6, 1.9, 2.4, 2.9, 3.4, 4.0, 4.4, 5.0],
                                    derived=False)  # fmt: skip
    al = synthetic.request_al("a")
    assert synthetic.request_rates("a") == request_rates(al, stated, derived=False)


@pytest.mark.parametrize("batch", [1, 5, 64])
def test_a_spread_step_never_syncs(batch: int) -> None:
    """First use (each request's rates copied to the device), a repeated batch and a changed
    one, with drafts of every length 0..K."""
    synthetic = spread()
    gen = torch.Generator().manual_seed(batch)
    argmax = torch.randint(0, 50, (batch, K + 1), generator=gen)
    drafts = torch.randint(0, 50, (batch, K), generator=gen)
    num_draft = torch.randint(0, K + 1, (batch,), generator=gen)
    bonus = torch.randint(0, 50, (batch,), generator=gen)
    batches = [[f"r{i}" for i in range(batch)]] * 2 + [[f"r{i + 1}" for i in range(batch)]]
    with no_host_sync():
        outs = [
            rejection_sample(
                "synthetic",
                drafts,
                num_draft,
                bonus,
                target_argmax=argmax,
                synthetic=synthetic,
                request_keys=keys,
            )
            for keys in batches
        ]
    assert synthetic.step == 3
    assert all(out.output_token_ids.shape == (batch, K + 1) for out in outs)


def test_keys_must_cover_the_batch() -> None:
    with pytest.raises(ValueError, match="2 request keys for a batch of 3"):
        spread().accept(3, K, "cpu", KEYS[:2])
