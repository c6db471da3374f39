"""``model.linear``: the narrow-batch matmul (weight @ x.T) gives F.linear's values.

Float32 rounding differs between the two kernels (each output is a 576-term dot product in a
different order), so values are compared at float32 tolerance; the argmax over a vocabulary-sized
output, which greedy decoding reads, must be identical.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from speclens.engine.model import NARROW_ROWS, linear


@pytest.mark.parametrize("shape", [(1, 1), (1, 2), (1, 5), (8, 1), (2, 4), (1, 9), (4, 10)])
def test_linear_matches_f_linear(shape: tuple[int, int]) -> None:
    gen = torch.Generator().manual_seed(sum(shape))
    weight = torch.randn(4096, 576, generator=gen)
    x = torch.randn(*shape, 576, generator=gen)
    got, want = linear(x, weight), F.linear(x, weight)
    assert got.shape == want.shape == (*shape, 4096)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    if shape[0] * shape[1] > NARROW_ROWS:  # wide batches (prefill) take F.linear itself
        assert torch.equal(got, want)


def test_one_row_equals_that_row_of_two() -> None:
    """One row is computed as two (a zero row beside it): its values are those of the same row
    multiplied beside any other row, so a request's logits do not depend on a padding row."""
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(1000, 576, generator=gen)
    x = torch.randn(2, 576, generator=gen)
    assert torch.equal(linear(x[:1], weight)[0], linear(x, weight)[0])
