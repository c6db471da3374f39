"""``speclens bench`` end to end against a real ``speclens serve`` on loopback (sim executor)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import launch
from serverkit import FORCED, ServerProcess, mtp_stats, running_server
from speclens.bench.client import LoadConfig
from speclens.bench.datasets import random_prompts
from speclens.bench.run import Expectation, run_bench

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sim_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(
        tmp_path_factory.mktemp("bench-sim"), *FORCED, "--executor", "sim",
        "--per-request-spec-decode-stats", "detailed", "--max-num-seqs", "64",
    ) as server:  # fmt: skip
        yield server


def _run(server: ServerProcess, expected: float | None, **kw: object) -> dict:
    config = LoadConfig(
        url=server.url, model="dummy", num_requests=48, concurrency=16, max_tokens=48,
        ignore_eos=True, **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    expectation = Expectation(expected) if expected is not None else None
    prompts = random_prompts(48, 16, 48, seed=0)
    return asyncio.run(run_bench(config, prompts, expectation)).summary


def test_realized_al_matches_the_servers_mtp_stats_exactly(sim_server: ServerProcess) -> None:
    before = mtp_stats(sim_server.url)
    summary = _run(sim_server, 3.78)
    after = mtp_stats(sim_server.url)
    acc = summary["figures"]["acceptance"]
    steps = sum(after["distribution"].values()) - sum(before["distribution"].values())
    accepted = after["total_accepted_tokens"] - before["total_accepted_tokens"]
    assert acc["requests_with_stats"] == 48
    assert acc["verify_steps"] == steps
    assert acc["accepted_tokens"] == accepted
    assert acc["token_weighted_al"] == pytest.approx(1 + accepted / steps, abs=1e-12)
    assert set(acc["histogram"]) <= {"2", "3"}
    check = summary["server_check"]
    assert check["available"] and check["consistent"], check
    assert summary["verdict"]["passed"], summary["verdict"]
    assert not summary["warnings"]


def test_verification_fails_when_the_expectation_is_off_by_0_3(sim_server: ServerProcess) -> None:
    for expected in (3.48, 4.08):
        verdict = _run(sim_server, expected)["verdict"]
        assert not verdict["passed"], verdict
        assert "realized AL" in verdict["reason"]


def test_non_streaming_and_chat_read_the_same_stats(sim_server: ServerProcess) -> None:
    for kw in ({"stream": False}, {"endpoint": "chat"}):
        acc = _run(sim_server, None, **kw)["figures"]["acceptance"]
        assert acc["requests_with_stats"] == 48
        assert set(acc["histogram"]) <= {"2", "3"}


def test_cli_writes_every_file_and_exits_1_on_a_failed_verdict(
    sim_server: ServerProcess, tmp_path: Path
) -> None:
    base = [
        sys.executable, "-m", "speclens", "bench", "--url", sim_server.url, "--model", "dummy",
        "--num-requests", "24", "--concurrency", "8", "--max-tokens", "32", "--ignore-eos",
    ]  # fmt: skip
    out = tmp_path / "run"
    ok = launch.run(
        [*base, "--expect-acceptance-length", "3.78", "--output-dir", str(out)], timeout=120,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "verification PASS" in ok.stdout
    for name in ("summary.json", "records.jsonl", "summary.csv", "acceptance_histogram.png",
                 "al_vs_tpot.png", "latency_cdf.png"):  # fmt: skip
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["server"]["acceptance"]["acceptance_length"] == 3.78
    host = summary["settings"]["host"]  # the client machine's load, for compare to show
    assert len(host["load_average"]) == 3 and host["cpus"] >= 1
    rows = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(rows) == 24 and all(r["raw"] for r in rows)  # every raw payload is kept
    bad = launch.run([*base, "--expect-acceptance-length", "3.48"], timeout=120,
    )  # fmt: skip
    assert bad.returncode == 1
    assert "verification FAIL" in bad.stdout


def test_missing_stats_are_reported_loudly(tmp_path: Path) -> None:
    with running_server(tmp_path, *FORCED, "--executor", "sim") as server:  # stats off
        summary = _run(server, 3.78)
    assert summary["figures"]["acceptance"]["requests_with_stats"] == 0
    assert any("no request carried per-request stats" in w for w in summary["warnings"])
    assert not summary["verdict"]["passed"]


PROFILE_SET = """\
kind: AcceptanceProfileSet
name: tiny-forced
profiles:
  - model: dummy
    speculative_method: draft_model
    num_spec_tokens: 7
    thinking: "off"
    category: coding
    acceptance_length: 3.78
    method: assumed
    rationale: The AL the test servers are forced to, or not.
"""


def test_expect_profile_passes_at_the_profiles_al_and_fails_at_another(
    run_cli, sim_server: ServerProcess, tmp_path: Path
) -> None:
    """``--expect-profile`` resolves the AL from the registry with the server's method and K (from
    /version): 3.78 here. A server forced to 3.78 passes; one forced to 3.48 (0.3 off, as above)
    fails with exit 1 and the realized AL in the reason."""
    registry = tmp_path / "registry"
    (registry / "acceptance").mkdir(parents=True)
    (registry / "acceptance" / "tiny-forced.yaml").write_text(PROFILE_SET)
    off = [a if a != "3.78" else "3.48" for a in FORCED]
    with running_server(tmp_path / "logs", *off, "--executor", "sim",
                        "--per-request-spec-decode-stats", "summary") as other:  # fmt: skip
        for server, code in ((sim_server, 0), (other, 1)):
            out = tmp_path / f"run-{code}"
            got, stdout, stderr = run_cli(
                "bench", "--url", server.url, "--model", "dummy", "--num-requests", "24",
                "--concurrency", "8", "--max-tokens", "32", "--ignore-eos", "--expect-profile",
                "--registry", registry, "--thinking", "off", "--category", "coding",
                "--output-dir", out,
            )  # fmt: skip
            assert got == code, stdout + stderr
            verdict = json.loads((out / "summary.json").read_text())["verdict"]
            assert verdict["expected_acceptance_length"] == 3.78
            source = verdict["expectation_source"]
            assert (source["profile_set"], source["num_spec_tokens"]) == ("tiny-forced", 7)
            assert source["profile"] == "dummy/draft_model/k7/thinking-off/coding"
            if code == 0:
                assert verdict["passed"] and "verification PASS" in stdout
            else:
                assert not verdict["passed"] and "verification FAIL" in stdout
                assert "realized AL" in verdict["reason"]
