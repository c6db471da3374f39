"""``speclens sim --context``: the K schedule's table first, K 0 a real no-speculation run at each
context (the same figures as ``sim`` on that scenario), each speculating point the same as ``sim``
at that context, the engine flags, the JSON beside the run, and its bounds refused in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

SCENARIO: dict[str, Any] = {
    "model": "kimi-k3",
    "hardware": "b300",
    "deployment": {"pools": [{"parallel": 8, "engine": {
        "speculative": {"method": "dspark", "num_spec_tokens": 7}, "max_num_seqs": 64}}]},
    "workload": {"category": "coding", "thinking": "on", "input_tokens": {"min": 128, "max": 512},
                 "output_tokens": 64, "concurrency": 8, "requests": 32},
}  # fmt: skip
GRID = ["--sweep", "num_spec_tokens=1..2", "--sweep", "concurrency=4,16", "--jobs", "1"]


def _write(tmp_path: Path, name: str, data: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_schedule_table_comes_first_with_flags_and_attribution(run_cli, tmp_path) -> None:
    path = _write(tmp_path, "s.yaml", SCENARIO)
    code, out, err = run_cli("sim", path, *GRID, "--context", "1k,4k", "--emit", "vllm")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == (
        "K schedule by concurrency x context 1k, 4k: best K and its gain over no speculation "
        "(tok/s/GPU, 8 GPUs)"
    )
    assert "context 1k" in out and "context 4k" in out
    assert "k = 1024" in out
    assert 'vllm: --speculative-config \'{"method": "dspark", "num_speculative_tokens": ' in out


def test_k0_and_each_point_are_sim_runs_at_that_context(run_cli, tmp_path) -> None:
    path = _write(tmp_path, "s.yaml", SCENARIO)
    code, out, err = run_cli("sim", path, *GRID, "--context", "1k,4k", "--json", "--output-dir",
                             tmp_path / "run")  # fmt: skip
    assert code == 0, err
    sched = json.loads(out)["schedule"]
    assert json.loads((tmp_path / "run" / "k_schedule.json").read_text()) == sched
    got = {(p["context"], p["num_spec_tokens"], p["concurrency"]): p["tok_s_gpu"]
           for p in sched["points"]}  # fmt: skip
    assert len(got) == 2 * 3 * 2
    for context in (1024, 4096):
        fixed = {**SCENARIO, "workload": {**SCENARIO["workload"], "input_tokens": context}}
        spec = _write(tmp_path, f"spec{context}.yaml", fixed)
        code, out, err = run_cli("sim", spec, *GRID, "--json")
        assert code == 0, err
        for row in json.loads(out):
            key = (context, row["sweep"]["num_spec_tokens"], row["sweep"]["concurrency"])
            assert got[key] == row["throughput"]["output_tokens_per_s"] / 8
        pools = [{**fixed["deployment"]["pools"][0], "engine": {"max_num_seqs": 64}}]
        plain = _write(tmp_path, f"plain{context}.yaml", {**fixed, "deployment": {"pools": pools}})
        code, out, err = run_cli("sim", plain, "--sweep", "concurrency=4,16", "--json")
        assert code == 0, err
        for row in json.loads(out):
            key = (context, 0, row["sweep"]["concurrency"])
            assert got[key] == row["throughput"]["output_tokens_per_s"] / 8
    # Each cell is the best of K 0..2 at its point, its gain over K 0.
    for row in sched["rows"]:
        for cell in row["cells"]:
            by_k = {k: got[cell["context"], k, row["concurrency"]] for k in (0, 1, 2)}
            best = max(by_k, key=lambda k: by_k[k])
            assert cell["num_spec_tokens"] == best
            assert cell["gain"] == by_k[best] / by_k[0] - 1


def test_bounds_and_misuse_are_refused_in_one_line(run_cli, tmp_path) -> None:
    path = _write(tmp_path, "s.yaml", SCENARIO)
    cases = [
        ([*GRID, "--context", "1k,2q"], "--context: expected token counts like 1k,8k,32k"),
        (["--sweep", "num_spec_tokens=1..8", "--sweep", "concurrency=1..8", "--context",
          "1k,2k,3k,4k"], "--context: 4 contexts x 9 K (K 0 included) x 8 concurrencies = 288 "
         "points, over the limit of 256"),
        (["--sweep", "num_spec_tokens=1..2", "--context", "1k"],
         "--context needs --sweep num_spec_tokens=... and --sweep concurrency=..."),
        ([*GRID, "--emit", "vllm"], "--emit needs --context"),
        ([*GRID, "--context", "1k", "--emit", "tgi"],
         "--emit: expected one of vllm, atom, sglang, trtllm, got 'tgi'"),
    ]  # fmt: skip
    for args, message in cases:
        code, out, err = run_cli("sim", path, *args)
        assert code == 2 and out == "", (args, err)
        assert len(err.strip().splitlines()) == 1 and message in err, (args, err)
