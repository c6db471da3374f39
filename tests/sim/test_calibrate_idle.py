"""The idle TTFTs a calibration prices a prefill from (``benchmarks/replay.py`` on speclens
serve, 2026-12-05: two identical runs priced a prefill 0 + 2.0 ms a token and 285 ms + 1.6 ms,
and the second's replay at concurrency 8 read 27% off in E2E instead of 9%)."""

from __future__ import annotations

from pathlib import Path

import pytest

from speclens.sim.calibrate import Observed, _idle_slope, _idle_ttfts, _Request

#: The second run's idle requests, alone from arrival to first token, as the client saw them.
LINE = [(11, 0.054), (14, 0.05), (22, 0.059), (33, 0.075), (43, 0.102), (76, 0.13), (97, 0.159),
        (140, 0.22), (140, 0.224), (350, 0.619), (749, 1.493), (1084, 2.219)]  # fmt: skip


def _request(start: float, first: float, end: float, prompt: int) -> _Request:
    return _Request(start=start, first=first, end=end, prompt=prompt, computed=prompt,
                    chunks=[], steps=1, drafts=0, spec_steps=0)  # fmt: skip


def _run(requests: list[_Request]) -> Observed:
    return Observed(path=Path("c4"), load=("concurrency", 4.0), requests=requests, engine=None,
                    version=None, model=None, k=None)  # fmt: skip


def test_a_request_joined_before_its_first_token_is_not_idle() -> None:
    """A closed loop's four start within a millisecond: the first found the server idle, but
    its 2.7 s TTFT held the 1,084-token prompt that came 1 ms after it. Alone at arrival is not
    alone: an idle request is one no other overlapped from arrival to first token."""
    first = _request(0.000, 2.746, 5.0, 11)
    joined = _request(0.001, 2.219, 4.0, 1084)
    later = _request(6.0, 6.05, 8.0, 14)  # after both ended: alone throughout
    before = _request(8.5, 8.6, 9.0, 22)
    overlapping_its_end = _request(8.9, 9.5, 10.0, 33)  # came while ``before`` decoded
    run = _run([first, joined, later, before, overlapping_its_end])
    assert _idle_ttfts(run) == [(14, pytest.approx(0.05)), (22, pytest.approx(0.1))]


def test_the_idle_slope_leaves_out_a_ttft_far_off_the_line() -> None:
    slope = _idle_slope([*LINE, (11, 2.746)])
    assert slope is not None
    assert slope[0] == pytest.approx(0.0, abs=0.01)
    assert slope[1] == pytest.approx(0.00200, rel=0.03)
    assert _idle_slope(LINE) == pytest.approx(slope, rel=1e-9, abs=1e-12)


def test_the_idle_slope_keeps_every_ttft_near_the_line() -> None:
    """Noise is not an outlier: TTFTs off the line by up to a third of their spread stay."""
    noisy = [(p, t * (1.08 if i % 2 else 0.93)) for i, (p, t) in enumerate(LINE)]
    import numpy as np

    from speclens.cost import _nonnegative_lstsq

    prompts = np.array([p for p, _ in noisy], dtype=float)
    design = np.column_stack([np.ones_like(prompts), prompts])
    every = _nonnegative_lstsq(design, np.array([t for _, t in noisy]))
    assert _idle_slope(noisy) == pytest.approx(tuple(every), rel=1e-9, abs=1e-12)
