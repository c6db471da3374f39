"""The run's PNG figures (report.plots) keep every point in view: none under the legend, none
clipped, the legend inside the image; the accepted-count axis ticks whole numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from matplotlib.figure import Figure

from plotkit import assert_in_view, integer_ticks
from speclens.runs import report
from speclens.runs.request import RequestRecord


def _records() -> list[RequestRecord]:
    """Requests whose latencies reach the CDF's lower right and whose AL reaches the scatter's
    upper right: where a legend placed inside the axes sits."""
    out = []
    for i in range(40):
        end = 0.5 + 0.05 * i if i < 38 else 30.0
        out.append(RequestRecord(index=i, category="c", start=0.0, end=end, ttft=0.01 * (i + 1),
                                 completion_tokens=64,
                                 spec={"mean_acceptance_length": 1.0 + 3.0 * i / 39}))  # fmt: skip
    return out


def _figures(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, summary: dict[str, Any]
) -> dict[str, Figure]:
    kept: dict[str, Figure] = {}

    def keep(fig: Figure, path: Path) -> Path:
        fig.tight_layout()  # as _save does
        fig.canvas.draw()
        kept[path.name] = fig
        return path

    monkeypatch.setattr(report, "_save", keep)
    report.plots(tmp_path, summary, _records())
    return kept


def _summary(histogram: dict[str, int], verdict: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"figures": {"acceptance": {"histogram": histogram}}, "verdict": verdict}


def test_every_png_keeps_its_points_in_view(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    expected = {"0": 0.7, "1": 0.2, "2": 0.1}
    figures = _figures(monkeypatch, tmp_path, _summary({"0": 700, "1": 200, "2": 100},
                                                       {"expected_distribution": expected}))  # fmt: skip
    assert set(figures) == {"acceptance_histogram.png", "al_vs_tpot.png", "latency_cdf.png"}
    for fig in figures.values():
        assert_in_view(fig)


def test_the_histogram_of_many_counts_ticks_whole_numbers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    figures = _figures(monkeypatch, tmp_path, _summary({str(j): 40 - j for j in range(33)}))
    ax = figures["acceptance_histogram.png"].axes[0]
    integer_ticks(ax)
    assert len(ax.get_xticks()) <= 20  # readable, not one label a bar
