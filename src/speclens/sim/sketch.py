"""Latency distributions in constant memory: a log-binned histogram of weighted samples.

Both simulator loops report TTFT, TPOT, ITL and E2E through ``Sketch``, so a run of any length
keeps about a megabyte per distribution instead of 8 bytes per token. The mean, min and max are
exact; a percentile interpolates between order statistics as ``numpy.percentile`` (linear) does
on the expanded samples, each order statistic read as its bin's geometric centre, so it is within
``RESOLUTION / 2`` (relative) of the exact figure for values above ``LOW`` seconds.
"""

from __future__ import annotations

import math

import numpy as np

#: Relative width of a bin.
RESOLUTION = 2.0**-12
#: Seconds: values below fall in bin 0 (read as 0, clipped to the exact min), values above
#: ``HIGH`` in the last bin (clipped to the exact max).
LOW, HIGH = 1e-9, 1e7
_LOG_GROWTH = math.log1p(RESOLUTION)
BINS = math.ceil(math.log(HIGH / LOW) / _LOG_GROWTH) + 2
#: Samples held before they are binned (bins are counted a buffer at a time).
_BUFFER = 1 << 16


class Sketch:
    """Weighted samples (seconds) binned on a log scale; see the module docstring."""

    def __init__(self) -> None:
        self.counts = np.zeros(BINS, dtype=np.float64)
        self.count = 0.0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf
        self._values: list[np.ndarray] = []
        self._weights: list[np.ndarray] = []
        self._held = 0
        self._one: list[tuple[float, float]] = []  # single samples, added an array at a time

    def add_one(self, value: float, weight: float = 1.0) -> None:
        """``add`` for one sample, cheaply (held until a buffer's worth)."""
        self._one.append((value, weight))
        if len(self._one) >= _BUFFER:
            self._take_ones()

    def _take_ones(self) -> None:
        if self._one:
            pairs = np.array(self._one, dtype=np.float64)
            self._one = []
            self.add(pairs[:, 0], pairs[:, 1])

    def add(self, values: np.ndarray | float, weights: np.ndarray | float = 1.0) -> None:
        """Count each value ``weight`` times (integer weights: a value per token, say)."""
        v = np.atleast_1d(np.asarray(values, dtype=np.float64))
        w = np.broadcast_to(np.asarray(weights, dtype=np.float64), v.shape)
        keep = np.isfinite(v) & (w > 0)
        if not keep.all():
            v, w = v[keep], w[keep]
        if not v.size:
            return
        self.count += float(w.sum())
        # numpy's own pairwise sum: a BLAS dot's order depends on its threads, and the total
        # would change in the last digit with the cores (a process against a Ray worker)
        self.total += float(np.sum(v * w))
        self.min = min(self.min, float(v.min()))
        self.max = max(self.max, float(v.max()))
        self._values.append(v)
        self._weights.append(np.array(w))
        self._held += v.size
        if self._held >= _BUFFER:
            self._flush()

    def _flush(self) -> None:
        self._take_ones()
        if not self._values:
            return
        v = np.concatenate(self._values)
        w = np.concatenate(self._weights)
        self._values, self._weights, self._held = [], [], 0
        with np.errstate(divide="ignore"):
            index = np.floor(np.log(np.maximum(v, 0.0) / LOW) / _LOG_GROWTH) + 1
        index = np.clip(np.nan_to_num(index, neginf=0.0), 0, BINS - 1).astype(np.int64)
        self.counts += np.bincount(index, weights=w, minlength=BINS)

    def summary(self, scale: float = 1000.0) -> dict[str, float] | None:
        """Mean, p50, p90, p99, min and max times ``scale`` (ms by default); None when empty."""
        self._flush()
        if self.count <= 0:
            return None
        cumulative = np.cumsum(self.counts)
        centres = LOW * np.exp((np.arange(BINS) - 0.5) * _LOG_GROWTH)
        centres[0] = 0.0

        def order_statistic(j: float) -> float:
            b = int(np.searchsorted(cumulative, j, side="right"))
            return min(max(float(centres[min(b, BINS - 1)]), self.min), self.max)

        def percentile(q: float) -> float:
            h = q / 100.0 * (self.count - 1)
            lo = math.floor(h)
            low = order_statistic(lo)
            return low + (h - lo) * (order_statistic(lo + 1) - low) if h > lo else low

        return {
            "mean": self.total / self.count * scale,
            "p50": percentile(50) * scale,
            "p90": percentile(90) * scale,
            "p99": percentile(99) * scale,
            "min": self.min * scale,
            "max": self.max * scale,
        }


class Totals:
    """Finished requests and output tokens, and the span from first arrival to last finish."""

    def __init__(self) -> None:
        self.requests = 0
        self.output_tokens = 0
        self.start = math.inf
        self.end = 0.0

    def record(self, arrival: float, finish: float, output_tokens: int) -> None:
        self.requests += 1
        self.output_tokens += output_tokens
        self.start = min(self.start, arrival)
        self.end = max(self.end, finish)


class Tally(Totals):
    """``Totals`` plus latency distributions, in constant memory (each request's figures are
    binned a buffer at a time)."""

    def __init__(self) -> None:
        super().__init__()
        self.ttft, self.tpot, self.itl, self.e2e = Sketch(), Sketch(), Sketch(), Sketch()
        self._rows: list[tuple[float, float, float, int]] = []

    def add(self, arrival: float, first: float, finish: float, output_tokens: int) -> None:
        """A finished request: when it arrived, emitted its first token and finished."""
        self.record(arrival, finish if math.isfinite(finish) else 0.0, output_tokens)
        self._rows.append((arrival, first, finish, output_tokens))
        if len(self._rows) >= _BUFFER:
            self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        arrival, first, finish, outputs = np.array(self._rows, dtype=np.float64).T
        self._rows = []
        self.ttft.add(first - arrival)
        self.e2e.add(finish - arrival)
        several = outputs > 1
        self.tpot.add((finish - first)[several] / (outputs[several] - 1))

    def latency_ms(self) -> dict[str, dict[str, float] | None]:
        self._flush()
        return {
            "ttft": self.ttft.summary(),
            "tpot": self.tpot.summary(),
            "itl": self.itl.summary(),
            "e2e": self.e2e.summary(),
        }
