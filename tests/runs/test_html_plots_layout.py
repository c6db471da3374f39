"""The report's plots keep every point in view: none sits under the legend, none is clipped at
the axes' edge (a marker keeps its whole radius inside), and draft-position axes tick integers.

Each plot function is run as the report runs it; ``to_svg`` is wrapped to keep the figure, which is
then drawn with Agg and measured in display coordinates."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from plotkit import assert_in_view, integer_ticks
from speclens.runs import html_plots as hp


def drawn(monkeypatch: pytest.MonkeyPatch, plot: Callable[..., str], *args: Any) -> Figure:
    kept: list[Figure] = []
    original = hp.to_svg

    def keep(fig: Figure, name: str) -> str:
        kept.append(fig)
        return original(fig, name)

    monkeypatch.setattr(hp, "to_svg", keep)
    svg = plot(*args)
    assert svg.startswith("<svg") and len(kept) == 1
    fig = kept[0]
    FigureCanvasAgg(fig).draw()
    return fig


def test_position_plot_all_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every draft accepted: the points run along the top, where the legend used to sit."""
    fig = drawn(monkeypatch, hp.position_plot, [1.0, 1.0, 1.0], [1.0, 1.0, 0.0])
    assert_in_view(fig)
    assert integer_ticks(fig.axes[0]) == [1, 2, 3]


@pytest.mark.parametrize("k", [1, 2, 5, 8, 16])
def test_position_axis_ticks_integers(monkeypatch: pytest.MonkeyPatch, k: int) -> None:
    fig = drawn(monkeypatch, hp.position_plot, [0.9**p for p in range(1, k + 1)], None)
    integer_ticks(fig.axes[0])
    assert_in_view(fig)


def test_histogram_tall_first_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    """Most steps accept nothing: the first bar is the tallest, at the upper left."""
    observed = {0: 700, 1: 200, 2: 100}
    fig = drawn(monkeypatch, hp.histogram_plot, observed, {0: 0.7, 1: 0.2, 2: 0.1}, 1000)
    assert_in_view(fig)
    integer_ticks(fig.axes[0])


def test_histogram_of_many_counts_ticks_integers(monkeypatch: pytest.MonkeyPatch) -> None:
    observed = {j: 30 - j for j in range(26)}
    fig = drawn(monkeypatch, hp.histogram_plot, observed, None, sum(observed.values()))
    integer_ticks(fig.axes[0])


def test_scatter_high_al_slow_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    pairs = np.array([[10.0, 1.0], [20.0, 2.0], [30.0, 3.0], [40.0, 4.0], [50.0, 4.0]])
    fig = drawn(monkeypatch, hp.scatter_plot, pairs, 5, 2.5)
    assert_in_view(fig)


def test_cdf_reaching_the_lower_right(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.array([1.0, 2.0, 400.0, 500.0])
    curves = {
        "TTFT": (x, np.array([0.01, 0.02, 0.05, 1.0])),
        "TPOT": (x, np.array([0.1, 0.2, 0.3, 0.4])),
    }
    fig = drawn(monkeypatch, hp.cdf_plot, curves)
    assert_in_view(fig)


def test_curve_plot_points_upper_right(monkeypatch: pytest.MonkeyPatch) -> None:
    series = [
        hp.Series(f"K {k} with a long label for the legend", [1.0, 10.0, 40.0, 80.0],
                  [100.0 * k, 200.0 * k, 300.0 * k, 400.0 * k],
                  y_err=[(90.0 * k, 110.0 * k), (190.0 * k, 210.0 * k), (290.0 * k, 310.0 * k), (390.0 * k, 410.0 * k)])
        for k in range(1, 9)
    ]  # fmt: skip
    fig = drawn(monkeypatch, hp.curve_plot, series, "tok/s/user", "tok/s/GPU", "Pareto", "pareto")
    assert_in_view(fig)


def test_curve_plot_many_series_keeps_its_legend_in_the_figure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    series = [hp.Series(f"run {i}", [1.0, 2.0], [float(i), float(i + 1)]) for i in range(40)]
    fig = drawn(monkeypatch, hp.curve_plot, series, "x", "y", "many", "many")
    assert_in_view(fig)


def test_category_plot_forced_beyond_the_bars(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [("coding", 3.9, 500), ("math", 3.5, 400), ("writing", 2.0, 300)]
    fig = drawn(monkeypatch, hp.category_plot, rows, 4.0)
    assert_in_view(fig)


def test_ratio_plot_single_row(monkeypatch: pytest.MonkeyPatch) -> None:
    fig = drawn(monkeypatch, hp.ratio_plot, [("c=8", 1.5, 1.2, 1.9)], "B / A", "ratio")
    assert_in_view(fig)


@pytest.mark.parametrize("forced", [None, 4.0])
def test_category_plot_rows_with_no_data_stay_in_view(
    monkeypatch: pytest.MonkeyPatch, forced: float | None
) -> None:
    """The categories with no verify step sort last and carry no bar: their rows (and their
    "no data" labels) stay inside the axes all the same, the busiest category on top."""
    rows = [("coding", 3.9, 500), ("chat", 1.0, 0), ("math", 3.5, 400), ("none", 1.0, 0)]
    fig = drawn(monkeypatch, hp.category_plot, rows, forced)
    assert_in_view(fig)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["coding", "math", "chat", "none"]
    low, high = sorted(ax.get_ylim())
    assert [t.get_position()[1] for t in ax.texts] == [2, 3]
    assert low < 0 and high > 3 and ax.yaxis_inverted()
