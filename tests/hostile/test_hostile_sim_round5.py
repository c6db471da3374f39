"""What ``speclens sim`` prints, against hostile scenarios: an emitted engine line is safe to
paste into a shell (every value quoted), a method an engine cannot take is refused with
``profiles resolve --emit``'s rule before any simulation, a concurrency above the requests is
refused, the start-up burst is left out of the latencies, and the step-exact loop's engine logs
stay out of sim's output."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

HOSTILE_METHOD = "mtp $(touch pwned) #"
SCENARIO: dict[str, Any] = {
    "model": "kimi-k3",
    "hardware": "b300",
    "deployment": {"pools": [{"parallel": 8, "engine": {
        "speculative": {"method": "dspark", "num_spec_tokens": 7}, "max_num_seqs": 64}}]},
    "workload": {"category": "coding", "thinking": "on", "input_tokens": 256,
                 "output_tokens": 64, "concurrency": 8, "requests": 32},
}  # fmt: skip
GRID = ["--sweep", "num_spec_tokens=1..2", "--sweep", "concurrency=4,16", "--jobs", "1"]


def _with_method(tmp_path: Path, method: str) -> Path:
    pools = [{"parallel": 8, "engine": {
        "speculative": {"method": method, "num_spec_tokens": 7}, "max_num_seqs": 64}}]  # fmt: skip
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**SCENARIO, "deployment": {"pools": pools}}))
    return path


def _flags(line: str, engine: str) -> str:
    """The engine's flags on an emitted line: after ``ENGINE: ``, before the ``  # where``."""
    assert line.startswith(f"{engine}: "), line
    return line.removeprefix(f"{engine}: ").rpartition("  # ")[0]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_an_emitted_vllm_line_runs_no_command_in_a_shell(run_cli, tmp_path: Path) -> None:
    path = _with_method(tmp_path, HOSTILE_METHOD)
    code, out, err = run_cli("sim", path, *GRID, "--context", "1k", "--emit", "vllm",
                             "--acceptance-rate", "0.6")  # fmt: skip
    assert code == 0, err
    lines = [line for line in out.splitlines() if line.startswith("vllm: --")]
    assert lines, out
    shell = tmp_path / "shell"
    shell.mkdir()
    for line in lines:
        flags = _flags(line, "vllm")
        done = subprocess.run(["bash", "-c", f"printf '%s\\n' {flags}"], cwd=shell,
                              capture_output=True, text=True, check=True)  # fmt: skip
        assert list(shell.iterdir()) == []  # no command substitution ran
        flag, value = done.stdout.rstrip("\n").split("\n")
        assert flag == "--speculative-config"
        assert json.loads(value)["method"] == HOSTILE_METHOD
        assert shlex.split(flags) == [flag, value]


@pytest.mark.parametrize("method", ["ngram", HOSTILE_METHOD])
def test_emit_atom_refuses_a_method_atom_does_not_take(run_cli, tmp_path, method) -> None:
    """``sim --emit atom`` refuses what ``profiles resolve --emit atom`` refuses, with its
    words, naming the scenario's field; nothing is simulated or written (exit 2)."""
    path = _with_method(tmp_path, method)
    out_dir = tmp_path / "run"
    code, out, err = run_cli("sim", path, *GRID, "--context", "1k", "--emit", "atom",
                             "--acceptance-rate", "0.6", "--output-dir", out_dir)  # fmt: skip
    assert (code, out) == (2, ""), err
    (line,) = err.strip().splitlines()
    assert line == (
        f"{path}: deployment.pools[0].engine.speculative.method: --emit atom cannot serve it: "
        f"atom: --method takes mtp, eagle3, dspark; got {method!r}"
    )
    assert not out_dir.exists()
    assert not (tmp_path / "pwned").exists()
    # The same rule as profiles resolve: one refusal text for one method.
    code, _, resolved = run_cli("profiles", "resolve", "--model", "x", "--method", method,
                                "-k", "2", "--thinking", "off", "--category", "coding",
                                "--acceptance-length", "2.5", "--emit", "atom")  # fmt: skip
    assert code == 1
    assert resolved.strip().removeprefix("refused: ") == line.partition("cannot serve it: ")[2]


def test_the_step_exact_loop_prints_no_engine_log_lines(run_cli, tmp_path: Path) -> None:
    """The engine's start-up line (forced acceptance ON, "throughput numbers from this run are
    synthetic") is the server's: sim's output is its table and its own lines only."""
    path = tmp_path / "s.yaml"
    workload = {**SCENARIO["workload"], "requests": 16, "output_tokens": 16}
    path.write_text(yaml.safe_dump({**SCENARIO, "workload": workload}))
    code, out, err = run_cli("sim", path, "--exact", "--jobs", "1")
    assert code == 0, err
    assert "step-exact loop" in out or "exact path" in out
    for text in (out, err):
        assert "Forced speculative acceptance ON" not in text
        assert "synthetic" not in text and "INFO " not in text


def _closed(tmp_path: Path, name: str, concurrency: int, requests: int) -> Path:
    workload = {**SCENARIO["workload"], "concurrency": concurrency, "requests": requests}
    path = tmp_path / name
    path.write_text(yaml.safe_dump({**SCENARIO, "workload": workload}))
    return path


def test_a_swept_concurrency_over_the_requests_is_refused(run_cli, tmp_path) -> None:
    """At concurrency 64 a closed loop of 32 requests would run concurrency 32's run again:
    refused before any simulation, nothing written."""
    path = _closed(tmp_path, "s.yaml", 8, 32)
    out_dir = tmp_path / "run"
    code, out, err = run_cli("sim", path, "--sweep", "concurrency=4,64", "--jobs", "1",
                             "--output-dir", out_dir)  # fmt: skip
    assert (code, out) == (2, ""), err
    (line,) = err.strip().splitlines()
    assert line.startswith(f"command line: --sweep: concurrency=64 with {path}: concurrency 64 "
                           "is over workload.requests 32: ")  # fmt: skip
    assert not out_dir.exists()


def test_the_scenarios_own_concurrency_over_its_requests_is_named(run_cli, tmp_path) -> None:
    path = _closed(tmp_path, "s.yaml", 64, 32)
    for extra in ([], ["--sweep", "num_spec_tokens=1..2"]):
        code, out, err = run_cli("sim", path, "--jobs", "1", *extra)
        assert (code, out) == (1, ""), err
        (line,) = err.strip().splitlines()
        assert line.startswith(f"{path}: workload.concurrency: concurrency 64 is over "
                               "workload.requests 32")  # fmt: skip


def test_a_concurrency_equal_to_the_requests_keeps_its_burst_and_says_so(run_cli, tmp_path):
    path = _closed(tmp_path, "s.yaml", 32, 32)
    code, out, err = run_cli("sim", path, "--jobs", "1", "--json")
    assert code == 0, err
    warmup = json.loads(out)["warmup"]
    assert (warmup["requests"], warmup["left_out_of"]) == (0, [])
    code, out, err = run_cli("sim", path, "--sweep", "concurrency=4,32", "--jobs", "1")
    assert code == 0, err
    assert "latencies include the start-up burst at concurrency=32: " in out
    assert "latencies leave out each point's warm-up" in out


def test_a_context_schedule_refuses_a_concurrency_over_the_requests(run_cli, tmp_path) -> None:
    path = _closed(tmp_path, "s.yaml", 8, 12)
    code, out, err = run_cli("sim", path, *GRID, "--context", "1k")
    assert (code, out) == (2, ""), err
    assert err.startswith("command line: --sweep: concurrency=16 with ")


def _ttft(run_cli, tmp_path: Path, requests: int) -> tuple[dict[str, Any], float]:
    """sim's TTFT figures for a closed loop of 32 at ``requests``, and the standard error of
    the measured requests' mean (from the run's records)."""
    import statistics

    workload = {**SCENARIO["workload"], "concurrency": 32, "requests": requests,
                "input_tokens": {"min": 256, "max": 1024}, "output_tokens": {"min": 32, "max": 128}}  # fmt: skip
    path = tmp_path / f"r{requests}.yaml"
    path.write_text(yaml.safe_dump({**SCENARIO, "workload": workload}))
    out_dir = tmp_path / f"run{requests}"
    code, out, err = run_cli("sim", path, "--json", "--output-dir", out_dir)
    assert code == 0, err
    row = json.loads(out)
    assert row["warmup"]["requests"] == 32 and row["warmup"]["left_out_of"] == [
        "ttft", "tpot", "itl", "e2e"]  # fmt: skip
    rows = [json.loads(line) for line in (out_dir / "records.jsonl").read_text().splitlines()]
    measured = [r["ttft_s"] * 1e3 for r in rows if r["index"] >= 32]
    assert len(measured) == requests - 32
    assert row["latency_ms"]["ttft"]["mean"] == pytest.approx(statistics.fmean(measured))
    summary = json.loads((out_dir / "summary.json").read_text())
    written = summary["figures"]["latency_ms"]["ttft"]
    for stat in ("mean", "p50", "p99"):  # the sketch's percentiles: within 2^-12 relative
        assert written[stat] == pytest.approx(row["latency_ms"]["ttft"][stat], rel=2.0**-12)
    return row, statistics.stdev(measured) / len(measured) ** 0.5


def test_ttft_leaves_out_the_start_up_burst(run_cli, tmp_path: Path) -> None:
    """32 requests admitted at once into an idle engine wait for one long prefill: with 64
    requests they were half the figures (TTFT mean about 5x that of 512 requests). Left out as
    a warm-up, both runs measure the same steady state: the means agree within 4 standard
    errors (seed 0)."""
    short, se_short = _ttft(run_cli, tmp_path, 64)
    long, se_long = _ttft(run_cli, tmp_path, 512)
    gap = abs(short["latency_ms"]["ttft"]["mean"] - long["latency_ms"]["ttft"]["mean"])
    assert gap < 4 * (se_short**2 + se_long**2) ** 0.5
    assert short["throughput"]["requests_per_s"] * short["makespan_s"] == pytest.approx(64)


def test_the_printed_output_says_what_the_warm_up_left_out(run_cli, tmp_path: Path) -> None:
    path = _closed(tmp_path, "s.yaml", 8, 32)
    code, out, err = run_cli("sim", path, "--jobs", "1")
    assert code == 0, err
    assert "latencies leave out the warm-up: requests 0..7 (8 of 32), admitted at once into " in out
    code, out, err = run_cli("sim", path, "--sweep", "concurrency=4,8", "--jobs", "1")
    assert code == 0, err
    assert "latencies leave out each point's warm-up: its first requests (as many as its " in out
