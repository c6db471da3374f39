"""``speclens bench --expect-acceptance-spread`` end to end against real ``speclens serve``
processes (sim executor): a server forced with the spread passes the verdict that checks it, one
forced at the same AL without the spread fails it, and a run too short to tell is INCONCLUSIVE."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from serverkit import ServerProcess, running_servers

pytestmark = pytest.mark.integration

QUANTILES = {"p0": 1.6, "p5": 2.0, "p10": 2.2, "p25": 2.6, "p50": 3.1, "p75": 3.6, "p90": 4.0,
             "p95": 4.3, "p100": 4.9}  # fmt: skip
AL = "3.1125"  # their implied mean


@pytest.fixture(scope="module")
def spread_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spread") / "spread.yaml"
    quantiles = ", ".join(f"{k}: {v}" for k, v in QUANTILES.items())
    path.write_text(f"num_spec_tokens: 4\nrequests: 200\nquantiles: {{{quantiles}}}\n")
    return path


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory, spread_path: Path
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    forced = ["--method", "draft_model", "--num-speculative-tokens", "4",
              "--spec-decode-acceptance-length", AL, "--executor", "sim",
              "--per-request-spec-decode-stats", "summary", "--max-num-seqs", "64"]  # fmt: skip
    spread = [*forced, "--spec-decode-acceptance-spread", str(spread_path)]
    with running_servers(tmp_path_factory.mktemp("bench-spread"), spread, forced) as both:
        yield both[0], both[1]


def bench(run_cli: Any, server: ServerProcess, spread: Path, requests: int) -> tuple[int, str]:
    code, stdout, _ = run_cli(
        "bench", "--url", server.url, "--model", "dummy", "--num-requests", str(requests),
        "--concurrency", "16", "--max-tokens", "64", "--ignore-eos",
        "--expect-acceptance-length", AL, "--expect-acceptance-spread", spread,
    )  # fmt: skip
    return code, stdout


@pytest.mark.timeout(180)
def test_the_spread_verdict_passes_forced_with_it_and_fails_forced_without(
    run_cli: Any, servers: tuple[ServerProcess, ServerProcess], spread_path: Path
) -> None:
    with_spread, without = servers
    code, stdout = bench(run_cli, with_spread, spread_path, 120)
    assert code == 0, stdout
    assert "verification PASS" in stdout and "spread check PASS: " in stdout
    code, stdout = bench(run_cli, without, spread_path, 120)
    assert code == 1, stdout
    assert "verification FAIL: the per-request ALs do not follow the stated spread" in stdout
    assert "spread check FAIL: " in stdout
    code, stdout = bench(run_cli, with_spread, spread_path, 12)
    assert code == 4, stdout
    assert "spread check INCONCLUSIVE: 12 requests with verify steps, at least 20" in stdout
