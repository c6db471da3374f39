"""Hostile ``--context`` values: odd spellings are refused before any simulation (exit 2), a
context longer than the pool's max_model_len is named in the scenario's own words (exit 1), and a
scenario with nothing speculating says so."""

from __future__ import annotations

from pathlib import Path

import yaml

from scenariokit import kimi_k3

SCENARIO = kimi_k3(requests=32, output_tokens=64)
GRID = ["--sweep", "num_spec_tokens=1..2", "--sweep", "concurrency=4,16", "--jobs", "1"]


def test_odd_context_spellings_are_usage_errors(run_cli, tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    for text in ("", ",", "1e3", "1.5k", "k", "0", "-1k", "1k,1024", "1m", "１k"):
        code, out, err = run_cli("sim", path, *GRID, "--context", text)
        assert code == 2 and out == "", (text, err)
        assert err.startswith("--context: ") and len(err.strip().splitlines()) == 1, (text, err)


def test_a_context_past_max_model_len_is_named(run_cli, tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    code, out, err = run_cli("sim", path, *GRID, "--context", "1k,99999999k")
    assert code == 1 and out == ""
    # The scenario's own checks, one line a problem, each naming the file and the field.
    first = err.strip().splitlines()[0]
    assert first.startswith(f"{path}: deployment.pools[0].engine.max_model_len: ")
    assert "workload.input_tokens up to 102399998976" in first


def test_no_speculating_pool_is_named(run_cli, tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    pools = [{"parallel": 8, "engine": {"max_num_seqs": 64}}]
    path.write_text(yaml.safe_dump({**SCENARIO, "deployment": {"pools": pools}}))
    code, out, err = run_cli("sim", path, *GRID, "--context", "1k")
    assert code == 1 and out == ""
    assert "--context needs a speculating pool" in err
