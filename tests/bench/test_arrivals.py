"""``speclens bench`` load shapes on loopback: open-loop arrivals (Poisson and gamma) against a
trivially fast server in its own process, and ``--duration`` against a real ``speclens serve``
(sim executor): sending stops at the deadline, and what was in flight is awaited and recorded.

The arrival checks are statistical, on fixed seeds. For gaps drawn from a gamma of shape k and
mean 1/R the coefficient of variation is 1/sqrt(k); over n gaps the sample mean has standard error
(1/R)/sqrt(k n), and the sample CV (delta method, with the gamma's third and fourth moments) has
standard error sqrt((k + 1) / (2 k^2 n)). Each statistic must fall within 4 standard errors of
its design value: a two-sided false-alarm rate of 6e-5 each under the normal approximation.

Both statistics are taken from the times each arrival was due (``scheduled``), which the
generator draws; the send times carry the machine's load as well (a CI run whose client stalled
for 0.6 s sent the overdue arrivals in a burst, which moved the mean of the send gaps by 5
standard errors). What the send times must show is that arrivals are sent at their absolute due
times rather than a gap after the previous send: every send is at or after its due time, and a
send's lateness falls below the previous one's for many sends (about half, on a quiet machine or
a loaded one), where a generator that sleeps each gap after the previous send can only add
lateness, never make it up (none falls).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from canned_server import running_canned

from serverkit import FORCED, ServerProcess, free_port, running_server
from speclens.bench.client import LoadConfig
from speclens.bench.datasets import random_prompts
from speclens.bench.run import run_bench

pytestmark = pytest.mark.integration

RATE = 300.0  # requests/s: 600 gaps take about 2 s
ARRIVALS = 601
BAND_SE = 4.0
#: The least share of sends less late than the one before (about 0.5 measured, 0 for a generator
#: that sleeps each gap after the previous send).
MADE_UP = 0.2


@pytest.fixture(scope="module")
def canned() -> Iterator[str]:
    with running_canned(free_port()) as url:
        yield url


@pytest.mark.parametrize(("shape", "seed"), [(1.0, 0), (0.5, 1)], ids=["poisson", "gamma-0.5"])
def test_open_loop_gaps_have_the_asked_mean_and_cv(canned: str, shape: float, seed: int) -> None:
    config = LoadConfig(
        url=canned, model="canned", num_requests=ARRIVALS, concurrency=None, request_rate=RATE,
        burstiness=shape, max_tokens=1, seed=seed,
    )  # fmt: skip
    outcome = asyncio.run(run_bench(config, random_prompts(ARRIVALS, 2, 1, seed=0)))
    records = sorted(outcome.records, key=lambda r: r.index)
    assert len(records) == ARRIVALS and all(r.success for r in records)
    n = ARRIVALS - 1
    due = np.array([r.scheduled for r in records], dtype=float)
    assert due[0] == 0.0 and np.all(np.diff(due) > 0)
    gaps = np.diff(due)
    mean_se = (1 / RATE) / math.sqrt(shape * n)
    assert abs(gaps.mean() - 1 / RATE) <= BAND_SE * mean_se, (gaps.mean(), 1 / RATE, mean_se)
    late = np.array([r.start for r in records], dtype=float) - due
    assert late.min() >= -1e-4, late.min()
    made_up = float(np.mean(np.diff(late) < -1e-6))
    assert made_up >= MADE_UP, f"lateness fell at {made_up:.0%} of sends"
    cv = float(gaps.std(ddof=1) / gaps.mean())
    cv_se = math.sqrt((shape + 1) / (2 * shape**2 * n))
    assert abs(cv - 1 / math.sqrt(shape)) <= BAND_SE * cv_se, (cv, 1 / math.sqrt(shape), cv_se)


def test_poisson_and_gamma_are_told_apart() -> None:
    """The CV bands are narrow enough to matter: gamma-0.5's CV (1.414) is more than 4 of its
    standard errors away from Poisson's (1.0), and the other way round."""
    n = ARRIVALS - 1
    for shape, other in ((1.0, 0.5), (0.5, 1.0)):
        se = math.sqrt((shape + 1) / (2 * shape**2 * n))
        assert abs(1 / math.sqrt(shape) - 1 / math.sqrt(other)) > BAND_SE * se


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(
        tmp_path_factory.mktemp("arrivals"), *FORCED, "--executor", "sim", "--max-num-seqs", "64"
    ) as started:
        yield started


def _bench(run_cli: Any, server: ServerProcess, out: Path, *args: str) -> dict[str, Any]:
    """Run ``speclens bench`` in-process; returns the summary and the records (by send time)."""
    code, stdout, stderr = run_cli(
        "bench", "--url", server.url, "--model", "dummy", "--ignore-eos", "--input-len", "4",
        "--output-dir", out, *args,
    )  # fmt: skip
    assert code == 0, stdout + stderr
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    for row in rows:
        row["end_s"] = None if row["latency_s"] is None else row["start_s"] + row["latency_s"]
    summary["rows"] = sorted(rows, key=lambda r: r["start_s"])
    return summary


def test_closed_loop_duration_stops_sending_and_records_what_was_in_flight(
    run_cli: Any, server: ServerProcess, tmp_path: Path
) -> None:
    """Two slots, requests of about 0.2 s: a slot frees shortly before the deadline's cycle ends,
    so a generator that checks the deadline before waiting for a slot sends once more after it."""
    duration = 0.5
    summary = _bench(
        run_cli, server, tmp_path, "--duration", str(duration), "--concurrency", "2",
        "--max-tokens", "128",
    )  # fmt: skip
    rows, requests = summary["rows"], summary["figures"]["requests"]
    assert rows and max(r["start_s"] for r in rows) < duration + 0.01, [r["start_s"] for r in rows]
    assert requests["sent"] == requests["completed"] == len(rows) and requests["failed"] == 0
    assert all(r["success"] and r["completion_tokens"] == 128 for r in rows)
    # Sending stopped at the deadline; what was still running then was awaited and recorded.
    load = summary["load"]
    assert duration <= load["sending_s"] < duration + 0.5, load
    running_at_stop = [r for r in rows if r["end_s"] > load["sending_s"]]
    assert load["in_flight_at_stop"] == len(running_at_stop) >= 1, (load, rows)
    assert summary["figures"]["duration_s"] == pytest.approx(max(r["end_s"] for r in rows))
    assert summary["settings"]["duration"] == duration


@pytest.mark.timeout(60)
def test_open_loop_duration_does_not_wait_past_the_deadline(
    run_cli: Any, server: ServerProcess, tmp_path: Path
) -> None:
    """At 0.01 requests/s the second arrival is due about 100 s in (before 2 s with probability
    1 - exp(-0.02) = 2%; seed 0 draws a longer gap): the run sends one request and stops at 1 s
    instead of sleeping until an arrival it will never send."""
    began = time.monotonic()
    summary = _bench(
        run_cli, server, tmp_path, "--duration", "1", "--request-rate", "0.01", "--max-tokens", "8",
    )  # fmt: skip
    assert time.monotonic() - began < 30
    assert len(summary["rows"]) == 1 and summary["rows"][0]["success"]
    assert 1.0 <= summary["load"]["sending_s"] < 1.5, summary["load"]
    assert summary["load"]["in_flight_at_stop"] == 0  # an 8-token request is long done at 1 s
