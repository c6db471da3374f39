"""The issue's "Done means", end to end: two ``speclens serve --executor sim`` servers forced at
AL 3.78, K 7, one with every step price doubled; plain bench sees about twice the throughput on
the cheaper; a sweep over concurrency 1,4 with 2 rounds against each; ``compare`` calls them
comparable with the throughput ratio about 2 at each concurrency.

A sim server's step lasts its price with its own work inside it (paced to a deadline), so the
ratio is 2 less only the per-request work no step price scales (HTTP, streaming, the client):
measured on a quiet 2-core machine, plain bench 1.93 to 1.95 and compare 1.975 to 1.983 (when
the server slept each price after its step's work instead, plain bench gave 1.883). Under load
it falls further (as low as 1.4 at a load average of 6 on 2 cores). So the band, 1.9 to 2.1 (2
within the rounds' noise), is held when the machine is quiet at the start (load average under
half a core per core), and a looser one otherwise; compare's ratio must agree with plain
bench's either way.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import orjson
import pytest

import launch
import serverkit

BASE = {"base": 0.01, "per_token": 0, "per_seq": 0, "per_context_token": 0,
        "draft_base": 0.0005, "draft_per_token": 0}  # fmt: skip
DOUBLED = {**BASE, "base": 0.02, "draft_base": 0.001}
LOAD = ["--model", "dummy", "--max-tokens", "128", "--ignore-eos", "--num-requests", "8"]
QUIET = os.getloadavg()[0] / (os.cpu_count() or 1) < 0.5
LOW, HIGH = (1.9, 2.1) if QUIET else (1.3, 2.1)
HAS_SWEEP = importlib.util.find_spec("speclens.cli.sweep") is not None

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


def _server(cost: dict[str, float]) -> list[str]:
    return [*serverkit.FORCED, "--executor", "sim", "--per-request-spec-decode-stats", "summary",
            "--step-cost", json.dumps(cost)]  # fmt: skip


def _speclens(*args: str | Path) -> str:
    done = launch.run([sys.executable, "-m", "speclens", *map(str, args)], timeout=300)
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


@pytest.mark.xfail(not HAS_SWEEP, reason="speclens sweep has not landed yet", strict=False)
def test_done_means(tmp_path: Path) -> None:
    with serverkit.running_servers(tmp_path, _server(BASE), _server(DOUBLED)) as (fast, slow):
        plain = {}
        for name, server in (("fast", fast), ("slow", slow)):
            _speclens("bench", "--url", server.url, *LOAD, "--concurrency", "4",
                      "--output-dir", tmp_path / f"bench-{name}")  # fmt: skip
            summary = orjson.loads((tmp_path / f"bench-{name}" / "summary.json").read_bytes())
            plain[name] = summary["figures"]["throughput"]["output_tokens_per_s"]
        print(f"plain bench ratio {plain['fast'] / plain['slow']:.3f}, band {LOW}-{HIGH} "
              f"({'quiet' if QUIET else 'loaded'} machine at the start)")  # fmt: skip
        assert LOW <= plain["fast"] / plain["slow"] <= HIGH, (plain, QUIET)
        for name, server in (("fast", fast), ("slow", slow)):
            _speclens("sweep", "--url", server.url, *LOAD, "--concurrency", "1,4", "--rounds", "2",
                      "--output-dir", tmp_path / f"sweep-{name}")  # fmt: skip
    out = _speclens("compare", tmp_path / "sweep-slow", tmp_path / "sweep-fast", "--json",
                    "--metric", "output", "--output-dir", tmp_path / "compare")  # fmt: skip
    result = orjson.loads(out)
    (pair,) = result["pairs"]
    assert pair["comparable"] is True, pair["label"]
    rows = {(r["concurrency"], r["figure"]): r for r in pair["deltas"]["matched_concurrency"]}
    for concurrency in (1, 4):
        throughput = rows[(concurrency, "output_tokens_per_s")]
        print(f"compare ratio at concurrency {concurrency}: {throughput['ratio']:.3f}")
        assert LOW <= throughput["ratio"] <= HIGH, (throughput, QUIET)
        assert throughput["ratio_low"] <= throughput["ratio"] <= throughput["ratio_high"]
        per_user = rows[(concurrency, "tokens_per_s_per_user")]
        assert LOW <= per_user["ratio"] <= HIGH, (per_user, QUIET)
    assert (tmp_path / "compare" / "report.html").is_file()
