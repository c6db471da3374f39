"""A sweep point's figures (``runs.points.point_figures``): which interval each gets, that they
agree with the run's own summary, and that they cover what they claim (fixed seeds).

Coverage over T trials is a binomial proportion with standard error sqrt(0.95 * 0.05 / T); each
check allows four of them, the percentile bootstrap a further 3 points low (it is asymptotic).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pointkit import write_run
from speclens.runs.points import FIGURES, PointError, RunSample, point_figures, run_figures
from speclens.runs.stats import realized_al


def test_one_round_is_a_bootstrap_over_requests_and_matches_the_run(tmp_path: Path) -> None:
    tpot = [0.01, 0.02, 0.03, 0.04]
    run = write_run(tmp_path / "r0", tpot, [5, 5, 4, 6], [10, 8, 8, 12])
    figures = point_figures([run])
    assert list(figures) == list(FIGURES)
    for name in FIGURES[:-1]:
        assert figures[name].method == "bootstrap" and figures[name].n == 4, name
    assert figures["tpot_ms"].mean == pytest.approx(25.0)
    assert figures["tokens_per_s_per_user"].mean == pytest.approx(1000 / 25.0)
    assert figures["itl_ms"].mean == pytest.approx(25.0)  # every gap weighted by its tokens
    duration = sum(0.05 + t * 15 for t in tpot)
    assert figures["requests_per_s"].mean == pytest.approx(4 / duration)
    assert figures["output_tokens_per_s"].mean == pytest.approx(64 / duration)
    al = realized_al([10, 8, 8, 12], [5, 5, 4, 6]).interval()
    assert figures["realized_al"] == al and al.mean == pytest.approx(1 + 38 / 20)


def test_rounds_are_student_t_and_the_al_pools_every_request(tmp_path: Path) -> None:
    """Mutation killed: the realized AL as t across the rounds' ALs (it must pool requests)."""
    runs = [
        write_run(tmp_path / "r0", [0.01, 0.02], [4, 4], [8, 4]),
        write_run(tmp_path / "r1", [0.03, 0.02], [4, 2], [6, 2]),
        write_run(tmp_path / "r2", [0.02, 0.02], [5, 5], [5, 10]),
    ]
    figures = point_figures(runs)
    assert all(figures[name].method == "t" and figures[name].n == 3 for name in FIGURES[:-1])
    assert figures["tpot_ms"].mean == pytest.approx((15 + 25 + 20) / 3)
    pooled = realized_al([8, 4, 6, 2, 5, 10], [4, 4, 4, 2, 5, 5]).interval()
    assert figures["realized_al"] == pooled and pooled.n == 6


def test_a_figure_with_no_data_says_none(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r0", [0.01], [0], [0])
    figures = point_figures([run])
    assert figures["realized_al"].method == "none"
    assert figures["tpot_ms"].method == "none"  # one request: no spread to bootstrap
    assert point_figures([])["e2e_ms"].method == "none"


def test_a_directory_that_is_not_a_run_is_named(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    with pytest.raises(PointError, match=r"x/summary.json: cannot be read"):
        point_figures([tmp_path / "x"])
    run = write_run(tmp_path / "r0", [0.01, 0.02], [1, 1], [1, 1])
    (run / "records.jsonl").write_text("{}\n[1]\n")
    with pytest.raises(PointError, match=r"records.jsonl: line 2: expected a record object"):
        point_figures([run])


def test_one_round_tpot_interval_covers_the_mean() -> None:
    rng = np.random.default_rng(7)
    trials, truth = 250, 0.02
    hits = 0
    for i in range(trials):
        tpot = list(rng.exponential(truth, size=40))
        sample = RunSample(1.0, tokens=[16.0] * 40, latency_s=[t * 15 for t in tpot],
                           ttft_s=[0.05] * 40, tpot_s=tpot)  # fmt: skip
        hits += run_figures(sample, seed=i, names=["tpot_ms"])["tpot_ms"].contains(truth * 1000)
    se = math.sqrt(0.95 * 0.05 / trials)
    assert 0.95 - 0.03 - 4 * se < hits / trials < 0.95 + 4 * se


def test_three_rounds_e2e_interval_covers_the_mean(tmp_path: Path) -> None:
    """Mutation killed: z = 1.96 instead of t with 2 degrees of freedom (covers about 0.85)."""
    rng = np.random.default_rng(11)
    trials, truth = 150, 0.02
    hits = 0
    for i in range(trials):
        runs = [
            write_run(
                tmp_path / str(i) / f"r{r}", list(rng.exponential(truth, size=8)), [1] * 8, [1] * 8
            )
            for r in range(3)
        ]
        hits += point_figures(runs)["e2e_ms"].contains((0.05 + truth * 15) * 1000)
    se = math.sqrt(0.95 * 0.05 / trials)
    assert abs(hits / trials - 0.95) < 4 * se
