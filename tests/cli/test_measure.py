"""``speclens measure``: natural acceptance per category becomes a valid, resolvable profile set."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from serverkit import ServerProcess, mtp_stats, running_server
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


@pytest.fixture(scope="module")
def ngram_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A real torch server speculating with the n-gram drafter, natural acceptance, K = 3."""
    args = ("--method", "ngram", "--num-speculative-tokens", "3",
            "--per-request-spec-decode-stats", "summary")  # fmt: skip
    with running_server(tmp_path_factory.mktemp("measure"), *args) as server:
        yield server


def _dataset(tmp_path: Path) -> Path:
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return data


def test_measure_writes_one_measured_profile_per_category(
    run_cli, ngram_server: ServerProcess, tmp_path: Path
) -> None:
    data = _dataset(tmp_path)
    out = tmp_path / "registry" / "acceptance" / "tiny-ngram.yaml"
    code, stdout, stderr = run_cli(
        "measure", "--url", ngram_server.url, "--model", "dummy", "--catalog-model", "tiny",
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


@pytest.mark.parametrize("category", ["coding", "writing", "math"])
def test_measured_al_is_the_servers_own_count(
    run_cli, ngram_server: ServerProcess, tmp_path: Path, category: str
) -> None:
    """The profile's AL is exactly what the server counted over the run: 1 + accepted drafts /
    verify steps, from /debug/mtp_stats scraped before and after a run of one category (the
    server's counters pool everything it served), rounded as the profile stores it."""
    out = tmp_path / "one.yaml"
    before = mtp_stats(ngram_server.url)
    code, stdout, stderr = run_cli(
        "measure", "--url", ngram_server.url, "--model", "dummy", "--dataset-path",
        _dataset(tmp_path), "--category", category, "--max-tokens", "32", "--concurrency", "4",
        "-o", out,
    )  # fmt: skip
    after = mtp_stats(ngram_server.url)
    assert code == 0, stdout + stderr
    steps = sum(after["distribution"].values()) - sum(before["distribution"].values())
    accepted = after["total_accepted_tokens"] - before["total_accepted_tokens"]
    assert steps > 0
    (profile,) = load(AcceptanceProfileSet, out).profiles
    assert profile.category == category
    assert profile.acceptance_length == pytest.approx(1 + accepted / steps, abs=5e-5)


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
