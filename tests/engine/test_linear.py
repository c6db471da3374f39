"""``model.linear``: the narrow-batch matmul (weight @ x.T) and oneDNN on packed weights give
F.linear's values.

Float32 rounding differs between the kernels (each output is a 576-term dot product in a
different order), so values are compared at float32 tolerance; the argmax over a vocabulary-sized
output, which greedy decoding reads, must be identical.
"""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F

from speclens.engine import model as model_module
from speclens.engine.model import NARROW_ROWS, PACKED_ROWS, linear, packed

SHAPES = [(1, 1), (1, 2), (1, 3), (1, 5), (8, 1), (2, 4), (1, 9), (4, 10), (2, 129), (1, 300)]


@pytest.mark.parametrize("shape", SHAPES)
def test_linear_matches_f_linear(shape: tuple[int, int]) -> None:
    gen = torch.Generator().manual_seed(sum(shape))
    weight = torch.randn(4096, 576, generator=gen)
    x = torch.randn(*shape, 576, generator=gen)
    got, want = linear(x, weight), F.linear(x, weight)
    assert got.shape == want.shape == (*shape, 4096)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    if shape[0] * shape[1] > PACKED_ROWS:  # wide batches (prefill) take F.linear itself
        assert torch.equal(got, want)


def test_every_regime_is_covered() -> None:
    rows = {a * b for a, b in SHAPES}
    assert min(rows) <= NARROW_ROWS < max(r for r in rows if r <= PACKED_ROWS)
    assert max(rows) > PACKED_ROWS


def test_one_row_equals_that_row_of_two() -> None:
    """One row is computed as two (a zero row beside it): its values are those of the same row
    multiplied beside any other row, so a request's logits do not depend on a padding row."""
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(1000, 576, generator=gen)
    x = torch.randn(2, 576, generator=gen)
    assert torch.equal(linear(x[:1], weight)[0], linear(x, weight)[0])


@pytest.mark.skipif(packed(torch.zeros(2, 2)) is None, reason="this torch build has no oneDNN")
def test_packed_rows_do_not_depend_on_the_other_rows() -> None:
    """Between NARROW_ROWS and PACKED_ROWS a row's values are the same whatever rows share the
    forward (a verify step of 5 rows and one of 40 give a request the same numbers)."""
    gen = torch.Generator().manual_seed(11)
    weight = torch.randn(1536, 576, generator=gen)
    x = torch.randn(64, 576, generator=gen)
    full = linear(x, weight)
    for n in (NARROW_ROWS + 1, 5, 8, 40):
        assert torch.equal(linear(x[:n], weight), full[:n])


@pytest.mark.skipif(packed(torch.zeros(2, 2)) is None, reason="this torch build has no oneDNN")
def test_a_weight_changed_in_place_is_packed_again_and_a_dropped_one_forgotten() -> None:
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(64, 32, generator=gen)
    x = torch.randn(5, 32, generator=gen)
    before = linear(x, weight)
    assert packed(weight) is packed(weight)  # cached
    with torch.no_grad():
        weight.mul_(2)
    torch.testing.assert_close(linear(x, weight), 2 * before)
    key = id(weight)
    assert key in model_module._PACKED
    del weight
    gc.collect()
    assert key not in model_module._PACKED


@pytest.mark.skipif(packed(torch.zeros(2, 2)) is None, reason="this torch build has no oneDNN")
def test_an_engine_packs_its_weights_when_built() -> None:
    """The first multi-row forward of a served request must not pay for packing."""
    from enginekit import config
    from speclens.engine import Engine

    engine = Engine(config())
    model = engine.executor.model  # type: ignore[union-attr]
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert weights and all(id(w) in model_module._PACKED for w in weights)
