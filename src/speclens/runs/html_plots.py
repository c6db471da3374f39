"""The report's plots: matplotlib figures rendered to SVG text for inlining in report.html.

No pyplot (no global figure state, no backend switch), text drawn as paths (no font to fetch),
dollars in given labels escaped (a category named ``$x$`` is a label, not a formula),
deterministic element ids per plot. Every plot takes aggregates or already downsampled arrays, so its cost does not grow
with the number of requests.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import RendererAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, NullLocator
from matplotlib.typing import RcKeyType

from speclens.runs.html import NO_DATA

#: Points per latency CDF and per scatter: what a reader can see, whatever the run's size.
CDF_POINTS = 400
SCATTER_POINTS = 1500
#: Bars in the per-category plot (the categories with the most verify steps).
MAX_CATEGORY_BARS = 40
#: A curve plot's title ends so only where it draws an interval.
CI_TITLE = " (95% CI)"

_RC: dict[RcKeyType, Any] = {
    "svg.fonttype": "path",
    "axes.grid": True,
    "grid.alpha": 0.3,
}
_METADATA = re.compile(rb"<metadata>.*?</metadata>", re.DOTALL)


@dataclass
class Series:
    """One line of a curve plot: x, y and optional symmetric-or-not error bars (low, high)."""

    label: str
    x: list[float]
    y: list[float]
    x_err: list[tuple[float, float]] | None = None
    y_err: list[tuple[float, float]] | None = None
    line: bool = True
    extra: dict[str, str] = field(default_factory=dict)


def to_svg(fig: Figure, name: str) -> str:
    """The figure as an ``<svg>`` element (no XML prolog, DOCTYPE or metadata block)."""
    buf = io.BytesIO()
    with matplotlib.rc_context({**_RC, "svg.hashsalt": f"speclens-{name}"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    data = _METADATA.sub(b"", buf.getvalue())
    start = data.find(b"<svg")
    return data[start:].decode("utf-8").strip()


def new_figure(width: float = 6.4, height: float = 4.0, left: float = 0.12) -> tuple[Figure, Axes]:
    """A figure with fixed margins (tight_layout costs more than drawing the plot)."""
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(width, height))
        fig.subplots_adjust(left=left, right=0.97, bottom=0.8 / height, top=1 - 0.45 / height)
        ax: Axes = fig.subplots()
    return fig, ax


def legend_outside(fig: Figure, ax: Axes) -> None:
    """The axes' legend to the right of the axes, the figure widened to hold it: no point sits
    under it and the axes keep their size. Entries that would run below the axes go in columns."""
    if not ax.get_legend_handles_labels()[0]:
        return
    # measures the legend's text, draws nothing (backend_agg has no type stubs)
    renderer = RendererAgg(1, 1, fig.dpi)  # type: ignore[no-untyped-call]
    tall = ax.get_position().height * fig.get_figheight() * fig.dpi
    columns = 1
    while True:
        legend = ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                           ncols=columns)  # fmt: skip
        box = legend.get_window_extent(renderer)
        if box.height <= tall or columns >= len(legend.get_texts()):
            break
        columns = max(columns + 1, math.ceil(columns * box.height / tall))
    width, _ = fig.get_size_inches()
    where = ax.get_position()
    wider = width + 0.02 * where.width * width + box.width / fig.dpi + 0.1
    fig.set_size_inches(wider, fig.get_figheight())
    fig.subplots_adjust(left=where.x0 * width / wider, right=where.x1 * width / wider)


def integer_ticks(ax: Axes) -> None:
    """Whole-number ticks on x (draft positions, accepted counts): never 1.5."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def label(text: str, limit: int = 40) -> str:
    """A server- or user-given string made safe and short for a plot label."""
    clean = "".join(ch if ch.isprintable() else "?" for ch in str(text))
    clean = clean if len(clean) <= limit else clean[: limit - 1] + "…"
    return clean.replace("$", r"\$")  # a literal dollar, never mathtext


def downsample_sorted(
    values: np.ndarray, points: int = CDF_POINTS
) -> tuple[np.ndarray, np.ndarray]:
    """An empirical CDF of ``values`` at no more than ``points`` quantiles: (x, F(x))."""
    data = np.sort(values[np.isfinite(values)])
    n = data.size
    if n == 0:
        return data, data
    if n <= points:
        return data, np.arange(1, n + 1) / n
    idx = np.unique(np.linspace(0, n - 1, points).round().astype(np.int64))
    return data[idx], (idx + 1) / n


def thin(pairs: np.ndarray, points: int = SCATTER_POINTS, seed: int = 0) -> np.ndarray:
    """At most ``points`` rows of ``pairs``, a seeded uniform sample (the same page each time)."""
    if len(pairs) <= points:
        return pairs
    rng = np.random.default_rng(seed)
    return pairs[np.sort(rng.choice(len(pairs), size=points, replace=False))]


def histogram_plot(
    observed: Mapping[int, int], expected: Mapping[int, float] | None, steps: int
) -> str:
    """The pooled accepted-count histogram (fractions), beside the forced schedule's."""
    fig, ax = new_figure()
    xs = sorted(observed)
    width = 0.4 if expected else 0.8
    shift = 0.2 if expected else 0.0
    ax.bar([x - shift for x in xs], [observed[x] / steps for x in xs], width=width,
           label="observed", color="#1f77b4")  # fmt: skip
    ticks = set(xs)
    if expected:
        ex = sorted(expected)
        ax.bar([x + shift for x in ex], [expected[x] for x in ex], width=width,
               label="forced schedule", color="#ff7f0e")  # fmt: skip
        ticks |= set(ex)
    if len(ticks) <= 20:
        ax.set_xticks(sorted(ticks))
    else:
        integer_ticks(ax)
    ax.set_xlabel("accepted drafts per verify step")
    ax.set_ylabel("fraction of verify steps")
    ax.set_title(f"Pooled acceptance histogram ({steps} steps)")
    legend_outside(fig, ax)
    return to_svg(fig, "histogram")


def request_al_plot(
    edges: Sequence[float], step_share: Sequence[float], requests: int,
    quantiles: Mapping[str, float],
) -> str:  # fmt: skip
    """The per-request AL distribution: each bin's share of verify steps (a request weighs its
    verify steps), with the quantiles ``quantiles`` (name: AL) marked."""
    if len(edges) != len(step_share) + 1 or not step_share:
        raise ValueError(f"{len(edges)} bin edges for {len(step_share)} bins")
    fig, ax = new_figure()
    widths = [edges[i + 1] - edges[i] for i in range(len(step_share))]
    ax.bar(list(edges[:-1]), list(step_share), width=widths, align="edge", color="#1f77b4",
           edgecolor="white", label="share of verify steps")  # fmt: skip
    styles = ("--", "-", ":")
    for i, (name, value) in enumerate(quantiles.items()):
        ax.axvline(value, color="#d62728", linestyle=styles[i % len(styles)],
                   label=f"{label(name)} {value:.2f}")  # fmt: skip
    ax.set_xlim(edges[0], edges[-1])
    ax.set_xlabel("request AL (tokens per verify step)")
    ax.set_ylabel("share of verify steps")
    ax.set_title(f"AL per request ({requests} requests)")
    legend_outside(fig, ax)
    return to_svg(fig, "request-al")


def position_plot(observed: Sequence[float], expected: Sequence[float] | None) -> str:
    """Per-position rates: the share of verify steps whose first p + 1 drafts were accepted."""
    fig, ax = new_figure()
    positions = list(range(1, len(observed) + 1))
    ax.plot(positions, list(observed), marker="o", label="observed")
    if expected:
        ax.plot(list(range(1, len(expected) + 1)), list(expected), marker="s",
                linestyle="--", label="forced schedule")  # fmt: skip
    ax.set_ylim(-0.05, 1.05)  # a marker at 0 or 1 keeps its whole radius in view
    ax.set_xlim(0.5, max(len(observed), len(expected or ())) + 0.5)
    integer_ticks(ax)
    ax.set_xlabel("draft position")
    ax.set_ylabel("share of steps accepting it")
    ax.set_title("Per-position acceptance")
    legend_outside(fig, ax)
    return to_svg(fig, "positions")


def category_plot(rows: Sequence[tuple[str, float, int]], forced: float | None) -> str:
    """AL per category, ``rows`` as (category, AL, verify steps), the busiest first. A category
    with no verify step has no AL (its 1.0 is the formula's empty case): no bar, "no data"."""
    shown = sorted(rows, key=lambda r: -r[2])[:MAX_CATEGORY_BARS]
    fig, ax = new_figure(6.4, max(2.5, 0.3 * len(shown) + 1.2), left=0.3)
    names = [label(r[0], 28) for r in shown]
    stepped = [i for i, r in enumerate(shown) if r[2] > 0]
    ax.barh(stepped, [shown[i][1] for i in stepped], color="#2ca02c")
    for i, r in enumerate(shown):
        if r[2] <= 0:
            ax.text(0.01, i, NO_DATA, transform=ax.get_yaxis_transform(), va="center",
                    color="#555555")  # fmt: skip
    ax.set_yticks(range(len(shown)), names)
    ax.set_ylim(len(shown) - 0.5, -0.5)  # the busiest on top, every row in view
    if forced is not None:
        ax.axvline(forced, color="#d62728", linestyle="--", label=f"forced AL {forced:g}")
        legend_outside(fig, ax)
    more = f" (the {len(shown)} busiest of {len(rows)})" if len(rows) > len(shown) else ""
    ax.set_xlabel("acceptance length")
    ax.set_title("AL per category" + more)
    return to_svg(fig, "categories")


def cdf_plot(curves: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> str:
    """Latency CDFs (already downsampled), log x."""
    fig, ax = new_figure()
    for name, (x, y) in curves.items():
        ax.plot(x, y, label=name, drawstyle="steps-post")
    if all(np.all(x > 0) for x, _ in curves.values()):
        ax.set_xscale("log")
        ax.xaxis.set_minor_locator(NullLocator())  # minor log ticks cost more than the plot
    ax.set_xlabel("ms")
    ax.set_ylabel("fraction of requests")
    ax.set_title("Latency CDFs")
    legend_outside(fig, ax)
    return to_svg(fig, "cdf")


def scatter_plot(pairs: np.ndarray, total: int, forced: float | None) -> str:
    """Request AL against TPOT (ms); ``pairs`` rows are (tpot_ms, al), thinned already."""
    fig, ax = new_figure()
    ax.scatter(pairs[:, 0], pairs[:, 1], s=8, alpha=0.6, color="#9467bd")
    if forced is not None:
        ax.axhline(forced, color="#d62728", linestyle="--", label=f"forced AL {forced:g}")
        legend_outside(fig, ax)
    shown = f" ({len(pairs)} of {total} requests)" if total > len(pairs) else ""
    ax.set_xlabel("TPOT (ms)")
    ax.set_ylabel("request AL")
    ax.set_title("AL against time per output token" + shown)
    return to_svg(fig, "al-tpot")


def _errors(
    values: Sequence[float], bounds: Sequence[tuple[float, float]] | None
) -> np.ndarray | None:
    """Matplotlib's 2xN error array from (low, high) bounds; NaN bounds draw no bar."""
    if bounds is None:
        return None
    below = [
        v - lo if math.isfinite(lo) else 0.0 for v, (lo, _) in zip(values, bounds, strict=True)
    ]
    above = [
        hi - v if math.isfinite(hi) else 0.0 for v, (_, hi) in zip(values, bounds, strict=True)
    ]
    return np.array([below, above])


def _has_bar(errors: np.ndarray | None) -> bool:
    return errors is not None and bool(np.any(errors > 0))


def curve_plot(series: Sequence[Series], xlabel: str, ylabel: str, title: str, name: str) -> str:
    """Points with CI bars on both axes, one colour and one legend entry per series, joined in x
    order when ``line``. A ``title`` ending in " (95% CI)" keeps it only when a bar is drawn."""
    fig, ax = new_figure()
    bars = False
    for s in series:
        order = sorted(range(len(s.x)), key=lambda i: s.x[i])
        x = [s.x[i] for i in order]
        y = [s.y[i] for i in order]
        x_err = _errors(x, [s.x_err[i] for i in order] if s.x_err else None)
        y_err = _errors(y, [s.y_err[i] for i in order] if s.y_err else None)
        bars = bars or _has_bar(x_err) or _has_bar(y_err)
        ax.errorbar(x, y, xerr=x_err, yerr=y_err, marker="o", capsize=3,
                    linestyle="-" if s.line else "none", label=label(s.label))  # fmt: skip
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title if bars else title.removesuffix(CI_TITLE))
    legend_outside(fig, ax)
    return to_svg(fig, name)


def ratio_plot(rows: Sequence[tuple[str, float, float, float]], title: str, name: str) -> str:
    """Ratios B / A with their intervals, ``rows`` as (label, ratio, low, high); 1 is marked."""
    fig, ax = new_figure()
    xs = list(range(len(rows)))
    values = [r[1] for r in rows]
    ax.errorbar(xs, values, yerr=_errors(values, [(r[2], r[3]) for r in rows]), marker="o",
                linestyle="none", capsize=4)  # fmt: skip
    ax.axhline(1.0, color="#7f7f7f", linestyle="--")
    ax.set_xticks(xs, [label(r[0], 16) for r in rows])
    ax.set_ylabel("ratio B / A")
    ax.set_title(title)
    return to_svg(fig, name)
