"""Layout checks for matplotlib figures, in display coordinates after an Agg draw: every data
point inside its axes (a marker with its whole radius), none under the legend, the legend inside
the figure, and whole-number ticks on an integer axis."""

from __future__ import annotations

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle


def points(ax: Axes) -> list[tuple[np.ndarray, float]]:
    """Every plotted point in display coordinates, with its marker's radius in pixels (0 for a
    bar's end or a line vertex without a marker)."""
    px = ax.figure.dpi / 72
    found: list[tuple[np.ndarray, float]] = []
    for line in ax.lines:
        if line.get_transform() != ax.transData:  # axhline/axvline: a reference, not data
            continue
        marker = line.get_marker() not in (None, "None", "", " ")
        radius = line.get_markersize() / 2 * px if marker else 0.0
        xy = np.asarray(line.get_xydata(), dtype=float)
        found += [(p, radius) for p in ax.transData.transform(xy[np.isfinite(xy).all(axis=1)])]
    for coll in ax.collections:
        if isinstance(coll, PathCollection) and len(coll.get_offsets()):
            radius = float(np.sqrt(coll.get_sizes().max())) / 2 * px
            found += [(p, radius) for p in ax.transData.transform(coll.get_offsets())]
    for patch in ax.patches:
        if isinstance(patch, Rectangle) and patch.get_width() and patch.get_height():
            x0, y0 = patch.get_xy()
            if ax.yaxis_inverted():  # the category plot's horizontal bars: the bar's end
                end = (x0 + patch.get_width(), y0 + patch.get_height() / 2)
            else:  # a bar's top
                end = (x0 + patch.get_width() / 2, y0 + patch.get_height())
            found.append((ax.transData.transform(end), 0.0))
    return found


def assert_in_view(fig: Figure) -> None:
    ax = fig.axes[0]
    box = ax.get_window_extent()
    found = points(ax)
    assert found, "the plot drew no points"
    for p, r in found:
        assert box.x0 <= p[0] - r and p[0] + r <= box.x1 + 0.5, (p, r, box)
        assert box.y0 <= p[1] - r and p[1] + r <= box.y1 + 0.5, (p, r, box)
    legend = ax.get_legend()
    if legend is not None:
        covered = legend.get_window_extent()
        hidden = [p for p, r in found if covered.x0 - r <= p[0] <= covered.x1 + r
                  and covered.y0 - r <= p[1] <= covered.y1 + r]  # fmt: skip
        assert not hidden, f"{len(hidden)} points under the legend {covered}"
        figure = fig.bbox
        assert figure.x0 <= covered.x0 and covered.x1 <= figure.x1 + 0.5, "legend cut off"
        assert figure.y0 <= covered.y0 and covered.y1 <= figure.y1 + 0.5, "legend cut off"


def integer_ticks(ax: Axes) -> list[float]:
    lo, hi = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    return ticks
