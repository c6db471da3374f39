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


def test_the_schedule_says_each_ks_al_its_source_and_how_steps_were_priced(run_cli, tmp_path):
    """Each K's AL and where it came from, and the step pricing, printed and in the JSON: the
    AL is the one a plain ``sim`` at that K resolves (the same registry profile)."""
    path = _write(tmp_path, "s.yaml", SCENARIO)
    code, out, err = run_cli("sim", path, *GRID, "--context", "1k")
    assert code == 0, err
    code, js, err = run_cli("sim", path, *GRID, "--context", "1k", "--json")
    assert code == 0, err
    sched = json.loads(js)["schedule"]
    assert [a["num_spec_tokens"] for a in sched["acceptance"]] == [1, 2]
    for k, entry in zip((1, 2), sched["acceptance"], strict=True):
        code, plain, err = run_cli("sim", path, "--sweep", f"num_spec_tokens={k}", "--json")
        assert code == 0, err
        resolved = json.loads(plain)[0]["resolution"]
        assert entry["acceptance_length"] == resolved["acceptance_length"]
        assert entry["source"] == resolved["source"] and entry["source"]
        assert entry["line"] in out.replace("\n", "")
        assert entry["line"].startswith(f"acceptance at K {k}: AL {resolved['acceptance_length']:g}"
                                        f" from the {resolved['layer']} layer")  # fmt: skip
    (pricing,) = sched["pricing"]
    assert pricing["line"].startswith("pool 0 steps: roofline of kimi-k3 on 8 x b300")
    assert pricing["line"] in out.replace("\n", "")
    assert sched["deployment"] == {
        "hardware": "b300", "engine": None, "precision": None, "tensor_parallel": 8,
        "expert_parallel": 1, "dp_attention": False, "disaggregated": False, "gpus": 8,
    }  # fmt: skip


def test_emitted_sglang_flags_turn_speculation_on_and_vllm_is_one_line(run_cli, tmp_path):
    """SGLang's lines name ``--speculative-algorithm`` (DSpark: DSPARK, K its block size);
    vLLM's identical setting at both contexts is one line naming both."""
    path = _write(tmp_path, "s.yaml", SCENARIO)
    code, js, err = run_cli("sim", path, *GRID, "--context", "1k,4k", "--json", "--emit",
                            "sglang")  # fmt: skip
    assert code == 0, err
    lines = json.loads(js)["schedule"]["emit"]["lines"]
    flags = [line for line in lines if line.startswith("sglang: --")]
    assert flags and all(line.startswith("sglang: --speculative-algorithm DSPARK "
                                         "--speculative-dspark-block-size ") for line in flags)  # fmt: skip
    code, js, err = run_cli("sim", path, *GRID, "--context", "1k,4k", "--json", "--emit", "vllm")
    assert code == 0, err
    sched = json.loads(js)["schedule"]
    same = all(len({c["num_spec_tokens"] for c in row["cells"]}) == 1 for row in sched["rows"])
    assert same  # the scenario's best K does not move between 1k and 4k
    (line,) = sched["emit"]["lines"]
    assert line.startswith("vllm: --speculative-config ") and line.endswith("  # 1k, 4k")


def test_output_dir_writes_the_schedule_page(run_cli, tmp_path):
    """``--output-dir`` writes report.html beside k_schedule.json: the schedule as a table
    whose every number is the file's, one plot a context, the AL per K, the pricing and the
    flags; static and self-contained."""
    from reportkit import external_references, field_mismatches, scan

    path = _write(tmp_path, "s.yaml", SCENARIO)
    out_dir = tmp_path / "run"
    code, out, err = run_cli("sim", path, *GRID, "--context", "1k,4k", "--emit", "sglang",
                             "--output-dir", out_dir)  # fmt: skip
    assert code == 0, err
    assert f"wrote {out_dir / 'report.html'}" in out
    sched = json.loads((out_dir / "k_schedule.json").read_text())
    page = (out_dir / "report.html").read_text()
    parsed = scan(page)
    assert field_mismatches(parsed.fields, sched) == []
    shown = {path for path, _ in parsed.fields}
    for i, row in enumerate(sched["rows"]):
        for j, _ in enumerate(row["cells"]):
            assert f"rows[{i}].cells[{j}].num_spec_tokens" in shown
            assert f"rows[{i}].cells[{j}].tok_s_gpu" in shown
    assert {f"acceptance[{i}].acceptance_length" for i in (0, 1)} <= shown
    assert page.count('<figure class="plot"') == 2 and page.count("<svg") == 2
    assert "<caption>Best K by concurrency and context</caption>" in page
    assert sched["pricing"][0]["line"] in page
    assert "--speculative-algorithm DSPARK" in page
    assert external_references(page) == [] and "<script" not in page


def test_an_output_dir_that_cannot_take_the_page_is_refused_before_simulating(run_cli, tmp_path):
    path = _write(tmp_path, "s.yaml", SCENARIO)
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    (out_dir / "report.html").symlink_to(tmp_path / "elsewhere.html")
    code, out, err = run_cli("sim", path, *GRID, "--context", "1k", "--output-dir", out_dir)
    assert (code, out) == (2, "")
    assert err.strip() == (f"command line: --output-dir: {str(out_dir)!r}: report.html is a "
                           "symbolic link (never written through)")  # fmt: skip
    assert not (tmp_path / "elsewhere.html").exists()
    assert not (out_dir / "k_schedule.json").exists()
