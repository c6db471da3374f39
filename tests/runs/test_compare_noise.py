"""Noise across runs: an interval from one run a side covers request-to-request variation only,
and compare says so rather than let a ratio read as a speed-up; with rounds the interval is the
rounds'. And the client machine's load, which bench records, shown beside the runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from comparekit import write_run, write_sweep
from speclens.bench.host import host_load, steal_percent
from speclens.runs import compare as cmp
from speclens.runs.compare_deltas import ONE_RUN_EACH
from speclens.runs.compare_inputs import labels_for, read_inputs


def _compare(*paths: Path) -> dict[str, Any]:
    inputs = read_inputs(list(paths), labels_for(len(paths), []), [None] * len(paths))
    return cmp.compare(inputs)


def test_one_run_each_is_named_and_its_interval_is_the_requests(tmp_path: Path) -> None:
    result = _compare(write_run(tmp_path / "a", seed=1), write_run(tmp_path / "b", seed=2))
    pair = result["pairs"][0]
    rows = pair["deltas"]["matched_concurrency"]
    assert rows and {r["interval_basis"] for r in rows} == {"requests"}
    assert pair["deltas"]["noise_note"] == ONE_RUN_EACH
    assert "not run-to-run" in ONE_RUN_EACH and "no difference is significant" in ONE_RUN_EACH


def test_with_rounds_the_interval_is_the_rounds(tmp_path: Path) -> None:
    points = [(c, r, {"seed": 10 * c + r}) for c in (1, 4) for r in (0, 1)]
    a = write_sweep(tmp_path / "a", points)
    b = write_sweep(tmp_path / "b", [(c, r, {"seed": 100 + 10 * c + r, "speed": 1.1})
                                     for c in (1, 4) for r in (0, 1)])  # fmt: skip
    pair = _compare(a, b)["pairs"][0]
    rows = pair["deltas"]["matched_concurrency"]
    assert rows and {r["interval_basis"] for r in rows} == {"rounds"}
    assert pair["deltas"]["noise_note"] is None


def test_the_cli_prints_the_note_and_each_runs_host(run_cli, tmp_path: Path) -> None:
    a, b = write_run(tmp_path / "a", seed=1), write_run(tmp_path / "b", seed=2)
    summary = json.loads((a / "summary.json").read_text())
    summary["settings"]["host"] = {"load_average": [1.75, 1.2, 0.9], "cpus": 2,
                                   "steal_percent": 0.25}  # fmt: skip
    (a / "summary.json").write_text(json.dumps(summary))
    code, out, err = run_cli("compare", a, b)
    assert code == 0, err
    assert "host: load average 1.75 (1 min) on 2 CPUs, 0.25% of CPU time stolen since boot" in out
    assert "note: one run each: the interval covers request-to-request variation only" in out
    assert out.count("host:") == 1  # B predates the field: nothing said of it


def test_a_malformed_host_is_not_shown_as_numbers(tmp_path: Path) -> None:
    a, b = write_run(tmp_path / "a", seed=1), write_run(tmp_path / "b", seed=2)
    summary = json.loads((a / "summary.json").read_text())
    summary["settings"]["host"] = {
        "load_average": ["high", 1, 2],
        "cpus": True,
        "steal_percent": "x",
    }
    (a / "summary.json").write_text(json.dumps(summary))
    host = _compare(a, b)["inputs"][0]["host"]
    assert host == {"load_average": None, "cpus": None, "steal_percent": None}


def test_host_load_reads_the_machine(tmp_path: Path) -> None:
    host = host_load()
    assert set(host) == {"load_average", "cpus", "steal_percent"}
    assert host["cpus"] is None or host["cpus"] >= 1
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 100 700 50 0 0 50 0 0\ncpu0 1 2 3\n")
    assert steal_percent(stat) == 5.0  # 50 of 1,000
    stat.write_text("intr 1 2 3\n")
    assert steal_percent(stat) is None
    assert steal_percent(tmp_path / "missing") is None
