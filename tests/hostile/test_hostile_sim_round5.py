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
