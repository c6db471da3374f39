"""``sim`` with the shipped SmolLM2 n-gram profiles predicts what the engine measured.

The set was measured by ``speclens measure`` against ``speclens serve`` (all 480 Spec-Bench
prompts, 128 tokens). Its AL counts only the decode steps that drafted; its ``draft_coverage`` is
the share that did. The engine's tokens per decode step over that run is
1 + Σ accepted / Σ decode steps = 1 + coverage × (AL − 1), exactly, from the two figures the
profile stores. ``sim`` must predict it within 5% in every category (issue: a simulator that
forces K drafts on every step overstated it by about 27% for coding).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from speclens.acceptance import AcceptanceProfileSet, load

SHIPPED = (
    Path(__file__).parents[2]
    / "src" / "speclens" / "registry" / "acceptance" / "smollm2-ngram-spec-bench.yaml"
)  # fmt: skip
TOLERANCE = 0.05


def shipped() -> AcceptanceProfileSet:
    return load(AcceptanceProfileSet, SHIPPED)


def test_every_shipped_profile_states_its_draft_coverage() -> None:
    profiles = shipped().profiles
    assert sorted(p.category for p in profiles) == CATEGORIES
    assert all(p.draft_coverage is not None and 0 < p.draft_coverage < 1 for p in profiles)


CATEGORIES = ["coding", "extraction", "humanities", "math", "math_reasoning", "qa", "rag",
              "reasoning", "roleplay", "stem", "summarization", "translation", "writing"]  # fmt: skip


@pytest.mark.parametrize("category", CATEGORIES)
def test_sim_predicts_the_engines_tokens_per_decode_step(
    run_cli, tmp_path: Path, category: str
) -> None:
    (profile,) = [p for p in shipped().profiles if p.category == category]
    assert profile.draft_coverage is not None
    measured = 1 + profile.draft_coverage * (profile.acceptance_length - 1)
    scenario = {
        "model": profile.model,
        "deployment": {"pools": [{"engine": {"speculative": {
            "method": profile.speculative_method, "num_spec_tokens": profile.num_spec_tokens}}}]},
        "workload": {"category": category, "thinking": "off", "input_tokens": 64,
                     "output_tokens": 128, "concurrency": 8, "requests": 64},
    }  # fmt: skip
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario), encoding="utf-8")
    code, out, err = run_cli("sim", path, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["resolution"]["draft_coverage"] == profile.draft_coverage
    predicted = result["tokens_per_step"]
    assert abs(predicted - measured) <= TOLERANCE * measured, (category, predicted, measured)
