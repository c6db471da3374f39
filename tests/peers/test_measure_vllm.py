"""Peer test 3c: ``speclens measure`` against a real vLLM 0.32.0, and against ``speclens serve``
with the same settings.

vLLM's ``/version`` is ``{"version": "0.32.0"}`` alone (``vllm/entrypoints/openai/api_server.py``,
``show_version``): no engine name, method or K. ``measure`` names the engine from its counters
(``vllm:spec_decode_*``), reads K from the per-position counter vLLM creates for positions
0..K-1 at start-up (``vllm/v1/spec_decode/metrics.py``, ``SpecDecodingProm``), and takes the
method from ``--method``. The set it writes must validate, resolve, and name vLLM 0.32.0 in its
provenance; ``speclens serve`` on the same exported weights with the same speculative config
must give every category's AL within 2% of vLLM's (the n-gram rule is vLLM's, test 3b).

vLLM gets one request at a time (its batch shapes then match a lone request's numerics, as in
3b); speclens's engine, whose batched forward gives a lone request's tokens, gets four.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from serverkit import ServerProcess
from speclens.cli import app

SPEC_BENCH = Path(__file__).parents[2] / ".." / "shared" / "data" / "spec-bench" / "question.jsonl"
PER_CATEGORY = 2
MAX_TOKENS = 64
#: The issue's bar for per-category AL, speclens serve against vLLM.
TOLERANCE = 0.02


def measure(url: str, out: Path, concurrency: int, *extra: str) -> dict[str, Any]:
    """Run ``speclens measure`` and return the profile set it wrote."""
    if not SPEC_BENCH.exists():
        pytest.fail(f"the Spec-Bench prompts are missing: {SPEC_BENCH}")
    result = CliRunner().invoke(
        app,
        ["measure", "--url", url, "--model", "smollm2", "--dataset-path", str(SPEC_BENCH),
         "--prompts-per-category", str(PER_CATEGORY), "--max-tokens", str(MAX_TOKENS),
         "--concurrency", str(concurrency), "--hardware", "cpu", "--output", str(out), *extra],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    print(result.output)
    document: dict[str, Any] = yaml.safe_load(out.read_text(encoding="utf-8"))
    return document


def al_by_category(document: dict[str, Any]) -> dict[str, float]:
    return {p["category"]: p["acceptance_length"] for p in document["profiles"]}


def test_measure_against_vllm_matches_speclens_serve(
    vllm_server: Any, speclens_ngram: ServerProcess, tmp_path: Path
) -> None:
    registry = tmp_path / "registry"
    theirs = measure(vllm_server.base_url, registry / "vllm.yaml", 1, "--method", "ngram")
    provenance = theirs["profiles"][0]["provenance"]
    assert provenance["engine_image"] == "vllm==0.32.0", provenance
    assert "vllm 0.32.0" in provenance["source"], provenance
    assert {p["num_spec_tokens"] for p in theirs["profiles"]} == {4}  # K read from vLLM's counters
    assert len(theirs["profiles"]) == 13

    runner = CliRunner()
    valid = runner.invoke(app, ["profiles", "validate", str(registry / "vllm.yaml")])
    assert valid.exit_code == 0, valid.output
    resolved = runner.invoke(
        app,
        ["profiles", "resolve", "--registry", str(registry), "--model", "smollm2",
         "--method", "ngram", "--num-spec-tokens", "4", "--thinking", "off", "--category", "coding",
         "--json"],
    )  # fmt: skip
    assert resolved.exit_code == 0, resolved.output
    answer = json.loads(resolved.stdout)
    assert answer["acceptance_length"] == al_by_category(theirs)["coding"], answer

    ours = measure(speclens_ngram.url, tmp_path / "speclens.yaml", 4)
    assert ours["profiles"][0]["provenance"]["engine_image"].startswith("speclens")
    mine, peer = al_by_category(ours), al_by_category(theirs)
    lines = [f"{c:<16} vllm {peer[c]:.4f}  speclens {mine.get(c, float('nan')):.4f}" for c in peer]
    print("\n".join(lines))
    assert mine.keys() == peer.keys()
    far = {c: (mine[c], peer[c]) for c in peer if abs(mine[c] - peer[c]) > TOLERANCE * peer[c]}
    assert not far, "\n".join(lines)
