"""Peer test 3a: ``speclens bench`` against a real vLLM 0.32.0 agrees with vLLM's own counters.

One Spec-Bench prompt per category (13), greedy, 64 tokens, for each of completions/chat and
streaming/not. Every request must carry vLLM's per-request stats (root
``metrics.speculative_decoding``), and the client's totals must equal, exactly, what vLLM's
Prometheus counters gained over the run: ``vllm:spec_decode_num_drafts``, ``_num_draft_tokens``,
``_num_accepted_tokens`` and ``_num_accepted_tokens_per_pos{position}`` (``vllm/v1/spec_decode/
metrics.py``, ``SpecDecodingProm``: labelled ``model_name`` and ``engine``; summed over engines
here, for the served model only). The per-position figures in ``summary.json`` must be the
server's and equal the pooled per-request ``per_step_accepted``.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

SPEC_BENCH = Path(__file__).parents[2] / ".." / "shared" / "data" / "spec-bench" / "question.jsonl"
CATEGORIES = 13
MAX_TOKENS = 64
COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def one_per_category(out: Path) -> Path:
    """The first prompt of each category, as a Spec-Bench JSONL file of its own."""
    if not SPEC_BENCH.exists():
        pytest.fail(f"the Spec-Bench prompts are missing: {SPEC_BENCH}")
    first: dict[str, str] = {}
    for line in SPEC_BENCH.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        first.setdefault(row["category"], line)
    assert len(first) == CATEGORIES
    out.write_text("\n".join(first.values()) + "\n", encoding="utf-8")
    return out


def counters(base_url: str, model: str) -> dict[str, Any]:
    """vLLM's speculative counters for ``model``, summed over engines; per position by label."""
    text = httpx.get(base_url + "/metrics", timeout=10.0).text
    totals: dict[str, float] = defaultdict(float)
    per_position: dict[int, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model_name") != model or not sample.name.endswith("_total"):
                continue
            name = sample.name.removesuffix("_total")
            totals[name] += sample.value
            if name == PER_POSITION:
                per_position[int(sample.labels["position"])] += sample.value
    missing = [name for name in [*COUNTERS.values(), PER_POSITION] if name not in totals]
    assert not missing, f"vLLM's /metrics lacks {missing} for model_name={model}"
    return {key: totals[name] for key, name in COUNTERS.items()} | {"per_position": per_position}


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_bench_totals_equal_vllm_counters(
    vllm_server: Any, endpoint: str, stream: bool, tmp_path: Path
) -> None:
    base_url, model, _model_dir, speculative = vllm_server
    k = speculative["num_speculative_tokens"]
    dataset = one_per_category(tmp_path / "prompts.jsonl")
    before = counters(base_url, model)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "speclens", "bench", "--url", base_url, "--model", model),
            *("--endpoint", endpoint, "--dataset", "jsonl", "--dataset-path", str(dataset)),
            *("--num-requests", str(CATEGORIES), "--concurrency", "4"),
            *("--max-tokens", str(MAX_TOKENS), "--temperature", "0"),
            "--stream" if stream else "--no-stream",
            *("--output-dir", str(tmp_path / "out")),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    after = counters(base_url, model)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))
    lines = (tmp_path / "out" / "records.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]

    # Every request got a record, and each carried vLLM's per-request stats.
    assert len(records) == CATEGORIES
    assert [r["spec_decode_status"] for r in records] == ["ok"] * CATEGORIES, records
    assert all(r["spec_decode_acceptance"]["num_spec_tokens"] == k for r in records)

    # The client's totals are exactly what vLLM's counters gained.
    acc = summary["figures"]["acceptance"]
    delta = {key: after[key] - before[key] for key in COUNTERS}
    client = {
        "drafts": acc["verify_steps"],
        "draft_tokens": acc["draft_tokens"],
        "accepted_tokens": acc["accepted_tokens"],
    }
    assert client == delta
    assert delta["drafts"] > 0 and 0 < delta["accepted_tokens"] < delta["draft_tokens"]
    check = summary["server_check"]
    assert check["available"] and check["consistent"], check
    assert check["server_delta"] == delta

    # Per-position: vLLM's counter deltas, the summary's, and the records' per_step_accepted.
    pooled = [0] * k
    for r in records:
        spec = r["spec_decode_acceptance"]
        if spec["per_step_accepted"] is None:  # vLLM omits it for a request that never drafted
            assert spec["num_spec_steps"] == 0, spec
        steps = spec["per_step_accepted"] or []
        assert len(steps) == spec["num_spec_steps"]
        for accepted in steps:
            for p in range(accepted):
                pooled[p] += 1
    server = [after["per_position"][p] - before["per_position"].get(p, 0.0) for p in range(k)]
    assert sorted(after["per_position"]) == list(range(k))
    assert server == pooled
    per_position = check["per_position"]
    assert per_position["server_accepted"] == server
    assert per_position["client_accepted"] == pooled
    assert per_position["server_rates"] == [n / delta["drafts"] for n in server]
    assert acc["per_position_rates"] == [n / acc["verify_steps"] for n in pooled]
    # A rate by position is P(the first p + 1 drafts were all accepted): non-increasing.
    assert all(a >= b for a, b in itertools.pairwise(pooled))
