"""``speclens measure`` stores draft coverage: the share of decode steps that drafted.

The n-gram drafter finds no match on many steps; AL counts only the steps that drafted (as every
engine reports it), so a profile without coverage overstates tokens per step. The profile's
coverage must be the server's own count: Δ verify steps (``vllm:spec_decode_num_drafts``) over
Δ decode steps (``speclens:decode_steps``) on ``/metrics``, scraped around a one-category run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from serverkit import ServerProcess, running_server, scrape
from speclens.acceptance import AcceptanceProfileSet, load

pytestmark = pytest.mark.integration

ROWS = [
    # Prose without repeats (few matches) and a repeating list (many): coverage strictly inside
    # (0, 1) over the category.
    {"question_id": 1, "category": "mixed", "turns": ["Write about rivers, mountains and wind."]},
    {"question_id": 2, "category": "mixed", "turns": ["a b c d a b c d a b c d a b c"]},
]


@pytest.fixture(scope="module")
def ngram_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    args = ("--method", "ngram", "--num-speculative-tokens", "3",
            "--speculative-config", '{"prompt_lookup_min": 2, "prompt_lookup_max": 3}',
            "--per-request-spec-decode-stats", "summary")  # fmt: skip
    with running_server(tmp_path_factory.mktemp("measure-coverage"), *args) as server:
        yield server


def counted(base: str) -> tuple[float, float]:
    samples = scrape(base)

    def total(name: str) -> float:
        return sum(v for (n, _labels), v in samples.items() if n == name)

    return total("vllm:spec_decode_num_drafts_total"), total("speclens:decode_steps_total")


def test_the_profile_carries_the_servers_draft_coverage(
    run_cli, ngram_server: ServerProcess, tmp_path: Path
) -> None:
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / "set.yaml"
    drafts_before, decode_before = counted(ngram_server.url)
    code, stdout, stderr = run_cli(
        "measure", "--url", ngram_server.url, "--model", "dummy", "--dataset-path", data,
        "--max-tokens", "48", "--concurrency", "2", "-o", out,
    )  # fmt: skip
    assert code == 0, stdout + stderr
    drafts_after, decode_after = counted(ngram_server.url)
    expected = (drafts_after - drafts_before) / (decode_after - decode_before)
    assert 0.0 < expected < 1.0, "the prompts must give steps with and without drafts"
    (profile,) = load(AcceptanceProfileSet, out).profiles
    assert profile.draft_coverage == round(expected, 4)
    assert f"draft coverage {profile.draft_coverage}" in stdout
    assert profile.provenance is not None and profile.provenance.settings is not None
    settings = profile.provenance.settings
    assert (settings["prompt_lookup_min"], settings["prompt_lookup_max"]) == (2, 3)
