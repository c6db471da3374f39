"""``sim --plot``: every point in view (margins leave room for a marker at the extremes), one
line per K of a K x concurrency grid, its legend beside the axes, and every label inside the
saved image."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from plotkit import assert_in_view
from speclens.cli.sim import _figure

GRID = [(k, c) for k in (1, 2, 3) for c in (8, 64, 256)]
ROWS = [
    {"latency_ms": {"tpot": {"p50": 5.0 + 3 * k + c / 16}},
     "throughput": {"output_tokens_per_s": 100.0 * k * c}, "sweep": {"num_spec_tokens": k,
                                                                       "concurrency": c}}
    for k, c in GRID
]  # fmt: skip


def test_a_grid_plots_one_line_per_k_with_every_point_in_view() -> None:
    fig = _figure(ROWS, ["num_spec_tokens", "concurrency"])
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    assert len(ax.lines) == 3
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["K=1", "K=2", "K=3"]
    fig.canvas.draw()
    assert_in_view(fig)


def test_every_label_is_inside_the_figure(tmp_path: Path) -> None:
    fig = _figure(ROWS, ["num_spec_tokens", "concurrency"])
    fig.canvas.draw()
    texts = [*fig.axes[0].texts, fig.axes[0].title]
    assert len(texts) == len(ROWS) + 1
    for text in texts:
        box = text.get_window_extent()
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1, text.get_text()
        assert fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1, text.get_text()
    from speclens.cli.sim import _plot

    _plot(ROWS, ["num_spec_tokens", "concurrency"], tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0
