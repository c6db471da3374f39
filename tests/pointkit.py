"""A run directory as bench writes it, as far as a sweep point's figures read it
(``runs.points``): the tests of the figures and of the sweep's state share it."""

from __future__ import annotations

import json
from pathlib import Path


def write_run(
    run: Path, tpot_s: list[float], steps: list[int], accepted: list[int],
    tokens: int = 16, ttft_s: float = 0.05,
) -> Path:  # fmt: skip
    """One request per TPOT, with its verify steps and accepted drafts, back to back."""
    run.mkdir(parents=True, exist_ok=True)
    rows, start = [], 0.0
    for i, (tpot, n, a) in enumerate(zip(tpot_s, steps, accepted, strict=True)):
        latency = ttft_s + tpot * (tokens - 1)
        rows.append({
            "index": i, "warmup": False, "success": True, "start_s": start,
            "latency_s": latency, "ttft_s": ttft_s, "tpot_s": tpot,
            "itl_runs_s": [[tpot, tokens - 1]], "completion_tokens": tokens,
            "category": "random",
            "spec_decode_acceptance": {"num_spec_steps": n, "num_accepted_draft_tokens": a},
        })  # fmt: skip
        start += latency
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"figures": {"duration_s": start}}))
    return run
