"""The sampler's step never makes the host wait for the device.

``no_host_sync()`` (``syncguard.py``) refuses every data-dependent-shape or host-reading op. The
first tests show it fails on each kind of sync it claims to catch (else a pass below would mean
nothing); the last run the real ``rejection_sample`` under it. The claim is for the sampler's
step only: the engine reads the accepted counts on the host each step to schedule the next.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from sampling.syncguard import HostSyncError, no_host_sync
from speclens.sampling import METHODS, SyntheticAcceptance, rejection_sample

X = torch.arange(12).reshape(3, 4)
MASK = X % 3 == 0

#: One deliberately syncing function per kind the guard claims to catch.
SYNCING: dict[str, Callable[[], object]] = {
    "boolean-mask indexing": lambda: X[MASK],
    "boolean-mask assignment": lambda: X.clone().__setitem__(MASK, 0),
    "index_put with a mask": lambda: X.clone().index_put_((MASK,), torch.tensor(0)),
    "nonzero": lambda: MASK.nonzero(),
    "argwhere": lambda: torch.argwhere(MASK),
    "where with one argument": lambda: torch.where(MASK),
    "masked_select": lambda: X.masked_select(MASK),
    "unique": lambda: torch.unique(X),
    "Tensor.unique": lambda: X.unique(return_counts=True),
    "unique_consecutive": lambda: torch.unique_consecutive(X),
    "repeat_interleave with tensor repeats": lambda: X[0].repeat_interleave(X[0]),
    "bincount": lambda: torch.bincount(X.flatten()),
    "item": lambda: X[0, 0].item(),
    "tolist": lambda: X.tolist(),
    "numpy": lambda: X.numpy(),
    "cpu": lambda: X.cpu(),
    "bool": lambda: bool(MASK[0, 0]),
    "if on a tensor": lambda: 1 if (X > 5).any() else 0,
    "int": lambda: int(X[0, 1]),
    "float": lambda: float(X[0, 1]),
    "index": lambda: [10, 11, 12][X[0, 1]],
    "scalar tensor as an index": lambda: X[X[0, 1]],
    "equal": lambda: torch.equal(X, X),
    "a device tensor to the host": lambda: torch.empty(3, device="meta").to("cpu"),
    "a device tensor copied into a host one": lambda: torch.empty(3).copy_(
        torch.empty(3, device="meta")
    ),
}


@pytest.mark.parametrize("name", list(SYNCING))
def test_guard_fails_on_a_syncing_op(name: str) -> None:
    with pytest.raises(HostSyncError), no_host_sync():
        SYNCING[name]()


def test_guard_allows_shape_static_ops() -> None:
    """The sync-free spellings pass: a fixed-size nonzero, repeats with their output size,
    three-argument where, integer gathers, dtype casts."""
    with no_host_sync():
        torch.nonzero_static(MASK, size=4)
        X[0].repeat_interleave(torch.tensor([1, 0, 2, 1]), output_size=4)
        torch.where(MASK, X, 0)
        X.gather(1, torch.zeros((3, 1), dtype=torch.int64))
        X[:, torch.tensor([0, 2])]
        MASK.to(torch.int64).cumprod(dim=1).sum(dim=1)


@pytest.mark.parametrize("k", [1, 3, 7, 16])
@pytest.mark.parametrize("batch", [1, 5, 64])
def test_synthetic_step_never_syncs(batch: int, k: int) -> None:
    """The forced-acceptance step, first call (builds the per-device cache) and later calls,
    with drafts of every length 0..K."""
    gen = torch.Generator().manual_seed(batch * 100 + k)
    synthetic = SyntheticAcceptance.from_length(1 + 0.6 * k, k, seed=k)
    argmax = torch.randint(0, 50, (batch, k + 1), generator=gen)
    drafts = torch.randint(0, 50, (batch, k), generator=gen)
    num_draft = torch.randint(0, k + 1, (batch,), generator=gen)
    bonus = torch.randint(0, 50, (batch,), generator=gen)
    with no_host_sync():
        outs = [
            rejection_sample(
                "synthetic", drafts, num_draft, bonus, target_argmax=argmax, synthetic=synthetic
            )
            for _ in range(3)
        ]
    assert synthetic.step == 3
    assert all(out.output_token_ids.shape == (batch, k + 1) for out in outs)


@pytest.mark.parametrize("method", METHODS)
def test_every_method_never_syncs(method: str) -> None:
    """Greedy and probabilistic too (per-request generators included), from logits."""
    batch, k, vocab = 6, 4, 40
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn((batch, k + 1, vocab), generator=gen)
    drafts = torch.randint(0, vocab, (batch, k), generator=gen)
    draft_probs = torch.softmax(torch.randn((batch, k, vocab), generator=gen), dim=-1)
    num_draft = torch.tensor([0, 1, 2, 3, 4, 4])
    bonus = torch.randint(0, vocab, (batch,), generator=gen)
    generators = [torch.Generator().manual_seed(i) for i in range(batch)]
    with no_host_sync():
        out = rejection_sample(
            method,  # type: ignore[arg-type]
            drafts,
            num_draft,
            bonus,
            target_logits=logits,
            draft_probs=draft_probs,
            synthetic=SyntheticAcceptance.from_length(2.5, k, seed=0),
            generator=generators,
        )
    assert out.num_accepted.shape == (batch,)
