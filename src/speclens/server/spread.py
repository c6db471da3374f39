"""The realized spread between requests: each finished request's own AL, weighted by its verify
steps, summarised for ``/debug/mtp_stats`` in memory that does not grow with the requests served.

A server may run for weeks, so the requests are not all kept: the first ``EXACT_REQUESTS`` are
(their AL and verify steps), and every request also goes into a fixed-width histogram over
[1, K + 1] (``BIN_WIDTH`` wide bins, each holding the verify steps of the requests that fell in
it), beside exact running sums for the mean and the between-request SD and the exact least and
greatest AL. Up to ``EXACT_REQUESTS`` requests the quantiles are ``spread.weighted_quantiles`` of
the requests themselves; past it, of the bins' centres, where so many requests fill the bins that
an interior quantile moves by about a bin at most. p0 and p100 are always exact.
"""

from __future__ import annotations

import math
from typing import Any

from speclens.acceptance.spread import LEVEL_NAMES, weighted_quantiles

#: Histogram bin width in AL units: finer than any AL a profile states (two decimals).
BIN_WIDTH = 0.01
#: Requests kept as they are (16 bytes each, about 64 KiB): a bench run's whole spread, exact.
EXACT_REQUESTS = 4096


class RealizedSpread:
    """Finished requests' realized ALs at K draft positions, step-weighted (not thread-safe: the
    server records and reads it under the runner's lock)."""

    def __init__(self, num_spec_tokens: int) -> None:
        self.num_spec_tokens = num_spec_tokens
        self.requests = 0
        self.steps = 0
        self._sum = 0.0  # sum of steps * AL (tokens per verify step, summed)
        self._sum_sq = 0.0  # sum of steps * AL^2
        self._low = math.inf
        self._high = -math.inf
        #: bin index -> verify steps of the requests whose AL fell in it (at most K / width bins).
        self._bins: dict[int, int] = {}
        #: The first ``EXACT_REQUESTS`` requests' (AL, verify steps).
        self._exact: list[tuple[float, int]] = []

    def record(self, acceptance_length: float, verify_steps: int) -> None:
        """Count one finished request: its realized AL over its ``verify_steps`` (>= 1)."""
        if verify_steps < 1 or not math.isfinite(acceptance_length):
            return
        top = self.num_spec_tokens + 1.0
        al = min(max(acceptance_length, 1.0), top)
        self.requests += 1
        self.steps += verify_steps
        self._sum += verify_steps * al
        self._sum_sq += verify_steps * al * al
        self._low, self._high = min(self._low, al), max(self._high, al)
        index = min(int((al - 1.0) / BIN_WIDTH + 1e-9), self.num_bins - 1)
        self._bins[index] = self._bins.get(index, 0) + verify_steps
        if len(self._exact) < EXACT_REQUESTS:
            self._exact.append((al, verify_steps))

    @property
    def num_bins(self) -> int:
        return max(1, math.ceil(self.num_spec_tokens / BIN_WIDTH))

    def summary(self) -> dict[str, Any]:
        """``request_spread`` of ``/debug/mtp_stats``: the requests counted, their verify steps,
        the step-weighted quantiles at ``LEVELS`` (``p0``..``p100``; ``exact`` false once they
        are read from the histogram), their mean (the pooled AL of the finished requests) and
        the step-weighted SD between their realized ALs; null figures before any request has
        finished."""
        out: dict[str, Any] = {
            "requests": self.requests,
            "verify_steps": self.steps,
            "quantiles": None,
            "mean": None,
            "sd_between_requests": None,
            "exact": True,
            "bin_width": BIN_WIDTH,
        }
        if not self.requests:
            return out
        mean = self._sum / self.steps
        variance = max(0.0, self._sum_sq / self.steps - mean * mean)
        if self.requests <= EXACT_REQUESTS:
            values = weighted_quantiles([a for a, _ in self._exact], [n for _, n in self._exact])
        else:
            indices = sorted(self._bins)
            centres = [1.0 + (i + 0.5) * BIN_WIDTH for i in indices]
            values = weighted_quantiles(centres, [self._bins[i] for i in indices])
            values = [min(max(v, self._low), self._high) for v in values]
            values[0], values[-1] = self._low, self._high
            out["exact"] = False
        out["quantiles"] = dict(zip(LEVEL_NAMES, values, strict=True))
        out["mean"] = mean
        out["sd_between_requests"] = math.sqrt(variance)
        return out
