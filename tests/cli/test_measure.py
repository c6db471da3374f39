"""``speclens measure``: natural acceptance per category becomes a valid, resolvable profile set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serverkit import running_server
from speclens.acceptance import AcceptanceProfileSet, load

pytestmark = pytest.mark.integration

ROWS = [
    {"question_id": i, "category": cat, "turns": [text]}
    for i, (cat, text) in enumerate(
        [
            ("coding", "def add(a, b): return a + b. def add(a, b): return"),
            ("coding", "for i in range(10): print(i) for i in range(10):"),
            ("writing", "Once upon a time there was a cat. Once upon a time"),
            ("writing", "The end of the story is the end of the"),
            ("math", "2 + 2 = 4, 3 + 3 = 6, 4 + 4 ="),
        ]
    )
]


def test_measure_writes_one_measured_profile_per_category(run_cli, tmp_path: Path) -> None:
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / "registry" / "acceptance" / "tiny-ngram.yaml"
    args = (
        "--method",
        "ngram",
        "--num-speculative-tokens",
        "3",
        "--per-request-spec-decode-stats",
        "summary",
    )
    with running_server(tmp_path / "logs", *args) as server:
        code, stdout, stderr = run_cli(
            "measure", "--url", server.url, "--model", "dummy", "--catalog-model", "tiny",
            "--dataset-path", data, "--max-tokens", "32", "--concurrency", "4", "-o", out,
        )  # fmt: skip
    assert code == 0, stdout + stderr
    profile_set = load(AcceptanceProfileSet, out)
    by_category = {p.category: p for p in profile_set.profiles}
    assert set(by_category) == {"coding", "writing", "math"}
    coding = by_category["coding"]
    assert coding.method == "measured" and coding.speculative_method == "ngram"
    assert coding.num_spec_tokens == 3 and 1.0 <= coding.acceptance_length <= 4.0
    assert coding.provenance is not None and coding.provenance.prompts == 2
    assert coding.provenance.hardware and coding.provenance.engine_image.startswith("speclens==")
    assert coding.provenance.sampling is not None and coding.provenance.sampling.max_tokens == 32
    code, stdout, _ = run_cli(
        "profiles", "resolve", "--model", "tiny", "--method", "ngram", "--num-spec-tokens", "3",
        "--thinking", "off", "--category", "coding", "--registry", out.parent.parent, "--json",
    )  # fmt: skip
    assert code == 0
    assert json.loads(stdout)["acceptance_length"] == coding.acceptance_length


def test_measure_refuses_a_forced_server(run_cli, tmp_path: Path) -> None:
    data = tmp_path / "questions.jsonl"
    data.write_text(json.dumps(ROWS[0]) + "\n")
    forced = (
        "--method",
        "draft_model",
        "--num-speculative-tokens",
        "3",
        "--spec-decode-acceptance-length",
        "2",
    )
    with running_server(tmp_path / "logs", *forced, "--executor", "sim") as server:
        code, _, stderr = run_cli(
            "measure", "--url", server.url, "--model", "dummy", "--dataset-path", data,
            "-o", tmp_path / "x.yaml",
        )  # fmt: skip
    assert code == 1
    assert "natural acceptance" in stderr
