"""Equal rooflines share their price tables within a process (a sweep's points each build their
own roofline): a roofline built from anything else keeps its own, so its prices are its own."""

from __future__ import annotations

import numpy as np
import pytest

from speclens.sim import catalog, roofline
from speclens.sim.roofline import Efficiency, Roofline


def _roof(overhead: float = 1e-3, parallel: int = 8) -> Roofline:
    return Roofline(catalog.model("deepseek-r1"), catalog.chip("h200"), parallel, method="mtp",
                    efficiency=Efficiency(overhead=overhead))  # fmt: skip


def _prices(roof: Roofline) -> list[float]:
    q, r = np.array([4, 40, 400]), np.array([1, 10, 100])
    return [float(roof.prefill(900, 1, 900)), *roof.decode(q, r, r * 1000, r, 3).tolist(),
            float(roof.decode(40, 10, 10_000, 10, 3))]  # fmt: skip


def test_equal_rooflines_share_tables_and_others_price_as_their_own() -> None:
    roofline._shared.clear()
    first, same = _roof(), _roof()
    priced = _prices(first)
    assert same._cache is first._cache and _prices(same) == priced
    for other in (_roof(overhead=2e-3), _roof(parallel=16)):
        alone = _prices(other)
        assert other._cache is not first._cache
        roofline._shared.clear()  # built with nothing to share
        assert _prices(Roofline(other.model, other.chip, other.parallel, method=other.method,
                                efficiency=other.efficiency)) == alone  # fmt: skip
        assert alone != priced


def test_a_process_keeps_the_tables_of_a_few_rooflines() -> None:
    roofline._shared.clear()
    for i in range(roofline.SHARED_TABLES + 3):
        _prices(_roof(overhead=1e-3 * (i + 1)))
    assert len(roofline._shared) == roofline.SHARED_TABLES


def test_a_step_in_whole_numbers_is_priced_as_in_any_other_form() -> None:
    """The fast path prices a short stretch a step at a time in Python ints (``_scalar``): the
    same price as floats, numpy scalars or a one-step array, with or without a drafter."""
    roof = _roof()
    for q, r, c, d, k in ((1, 1, 900, 0, 0), (40, 10, 10_000, 10, 3), (33, 9, 9_000, 8, 3),
                          (9, 9, 90_000, 0, 3), (700, 100, 10**6, 100, 6)):  # fmt: skip
        want = roof.decode(q, r, c, d, k)
        assert want == roof.decode(float(q), float(r), float(c), float(d), k)
        assert want == roof.decode(*map(np.int64, (q, r, c, d)), k)
        one = roof.decode(np.array([q]), np.array([r]), np.array([c]), np.array([d]), k)
        assert want == pytest.approx(float(one[0]), rel=1e-12)
        assert roof.verify(q, r, c) == roof.verify(float(q), float(r), float(c))
