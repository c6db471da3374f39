"""Observe, calibrate, replay, compare, end to end against a real server: ``speclens serve`` on
the dummy model with n-gram K 4 (real drafting), benched closed-loop at concurrency 1 and 4,
``calibrate`` on those two runs (its step counts against the engine's own, its price of a step
against what the runs took), a held-out run at concurrency 8 replayed from its trace with the
fitted cost, and ``compare OBSERVED SIMULATED``. What is checked is the plumbing: the replay
sends the same requests (indices, lengths, each one's acceptance) in the same loop, and compare
reports its fidelity request by request. How close the prediction is, is a timing claim:
``benchmarks/replay.py`` measures it (with the machine's own noise beside it), and
``tests/sim/test_replay.py`` checks the fit recovers a known cost exactly.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import launch
import serverkit

NGRAM = ["--model", "dummy", "--method", "ngram", "--num-speculative-tokens", "4",
         "--per-request-spec-decode-stats", "summary",
         "--speculative-config", '{"prompt_lookup_min": 2, "prompt_lookup_max": 4}']  # fmt: skip
LOAD = ["--model", "dummy", "--max-tokens", "48", "--ignore-eos", "--dataset", "random",
        "--input-len", "64", "--stream", "--warmup", "1"]  # fmt: skip

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def speclens(*args: str | Path, code: int = 0) -> tuple[str, str]:
    done = launch.run([sys.executable, "-m", "speclens", *map(str, args)], timeout=240)
    assert done.returncode == code, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout, done.stderr


def rows(run: Path) -> dict[int, dict[str, Any]]:
    out = {}
    for line in (run / "records.jsonl").read_text().splitlines():
        row = json.loads(line)
        if not row["warmup"]:
            out[row["index"]] = row
    return out


def test_observe_calibrate_replay_compare(tmp_path: Path) -> None:
    runs = {}
    with serverkit.running_server(tmp_path, *NGRAM) as server:
        for concurrency, count in ((1, 8), (4, 16), (8, 24)):
            runs[concurrency] = tmp_path / f"c{concurrency}"
            speclens("bench", "--url", server.url, *LOAD, "--concurrency", concurrency,
                     "--num-requests", count, "--output-dir", runs[concurrency])  # fmt: skip
    cost = tmp_path / "cost.yaml"
    out, _ = speclens("calibrate", runs[1], runs[4], "-o", cost)
    fitted = yaml.safe_load(cost.read_text())
    assert fitted["fit"]["batch_widths"] == [1, 4] and fitted["fit"]["requests"] == 24, fitted[
        "fit"
    ]
    assert fitted["provenance"]["engine"].startswith("speclens==") and "decode steps" in out
    # Observed on a real server, not built by the replay: the fit counts each request's decode
    # steps as the engine ran them. Counted from tokens (completion - 1 - accepted) they come
    # out short wherever max_tokens cut the last step's accepted drafts: 10 of 14 at K 4.
    calibrated = [row for c in (1, 4) for row in rows(runs[c]).values()]
    ran = [row["spec_decode_acceptance"]["num_decode_steps"] for row in calibrated]
    assert fitted["fit"]["decode_steps"] == sum(ran)
    assert sum(ran) > sum(row["completion_tokens"] - 1
                          - row["spec_decode_acceptance"]["num_accepted_draft_tokens"]
                          for row in calibrated)  # fmt: skip
    # and prices a step of one request as the concurrency-1 run took one (its decode time over
    # its decode steps, at its context half way). The bound is what a loaded 2-core machine
    # allows (CI saw 1.36x with other tests beside it); what it is for is the unit: a price in
    # milliseconds, or of a whole batch of 4, misses it by 1000x or 4x.
    price, c1 = fitted["step_cost"], rows(runs[1]).values()
    took = [(row["latency_s"] - row["ttft_s"]) / row["spec_decode_acceptance"]["num_decode_steps"]
            for row in c1]  # fmt: skip
    priced = [price["base"] + price["per_seq"]
              + price["per_context_token"] * (row["prompt_tokens"] + row["completion_tokens"] / 2)
              for row in c1]  # fmt: skip
    assert float(np.median(priced)) == pytest.approx(float(np.median(took)), rel=0.6)

    sim = tmp_path / "sim8"
    _, err = speclens("sim", "--trace", runs[8], "--step-cost", cost, "--output-dir", sim)
    assert "outside them it extrapolates" in err
    observed, replayed = rows(runs[8]), rows(sim)
    assert replayed.keys() == observed.keys()
    for index, row in observed.items():
        mine = replayed[index]
        assert (mine["prompt_tokens"], mine["completion_tokens"]) == (
            row["prompt_tokens"], row["completion_tokens"])  # fmt: skip
        theirs, ours = row["spec_decode_acceptance"], mine["spec_decode_acceptance"]
        assert ours["num_spec_steps"] == theirs["num_spec_steps"], index
        assert ours["acceptance_histogram"] == theirs["acceptance_histogram"], index
    summary = json.loads((sim / "summary.json").read_text())
    assert summary["settings"]["concurrency"] == 8 and summary["settings"]["executor"] == "sim"

    out, _ = speclens("compare", runs[8], sim, "--label", "observed", "--label", "replay",
                      "--json")  # fmt: skip
    (pair,) = json.loads(out)["pairs"]
    checks = {c["name"]: c for c in pair["checks"]}
    assert checks["prompts"]["ok"] and checks["lengths"]["ok"] and checks["k"]["ok"], checks
    fidelity = pair["fidelity"]
    assert fidelity["matched"] == 24 and fidelity["unmatched"] == 0
    for name in ("e2e", "ttft", "tpot", "itl"):
        assert fidelity["figures"][name]["requests"] == 24, name
        assert fidelity["figures"][name]["median_ape"] >= 0, name
    assert fidelity["throughput_error"] is not None
