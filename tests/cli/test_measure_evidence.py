"""``speclens measure`` writes no AL without evidence: every profile names the verify steps it
rests on, a category without enough of them gets no profile, and a run where none has enough
writes nothing (exit 4). The server and the load are stood in for: this is the command's logic."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from speclens.bench.client import RequestRecord
from speclens.bench.run import BenchOutcome
from speclens.cli import measure as measure_cli


def _acceptance(steps: dict[str, int]) -> dict[str, Any]:
    return {
        "requests_with_stats": len(steps),
        "counts_only_requests": 0,
        "verify_steps": sum(steps.values()),
        "al_by_category": {c: {"al": 2.5, "verify_steps": n} for c, n in steps.items()},
    }


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """The server (speclens, ngram, K 3) and a run whose categories hold ``steps`` verify steps."""
    steps: dict[str, int] = {}
    served = measure_cli.Served({"version": "1"}, "speclens", "ngram", 3, "cpu")
    monkeypatch.setattr(measure_cli, "_served", lambda *a: served)

    def run(*args: Any) -> BenchOutcome:
        records = [
            RequestRecord(i, c, spec={"num_spec_steps": n})
            for i, (c, n) in enumerate(steps.items())
        ]
        summary = {"figures": {"acceptance": _acceptance(steps)}}
        return BenchOutcome(summary, records)

    monkeypatch.setattr(measure_cli, "_run", run)
    return steps


def _measure(run_cli: Any, tmp_path: Path, *args: str) -> tuple[int, str, str, Path]:
    data = tmp_path / "q.jsonl"
    rows = [{"question_id": i, "category": c, "turns": ["hi"]} for i, c in enumerate("abc")]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "set.yaml"
    code, stdout, stderr = run_cli(
        "measure", "--model", "m", "--dataset-path", data, "-o", out, *args
    )
    return code, stdout, stderr, out


def test_a_category_with_zero_verify_steps_gets_no_profile_and_is_named(
    run_cli: Any, stand_in: dict[str, int], tmp_path: Path
) -> None:
    """Before: the zero-step category was dropped without a word, and the others' lines named
    prompts only."""
    stand_in.update(a=40, b=0)
    code, stdout, stderr, out = _measure(run_cli, tmp_path)
    assert code == 0, stdout + stderr
    assert "a: AL 2.5 over 40 verify steps in 1 prompts" in stdout
    assert "measure: b: 0 verify steps, below --min-verify-steps 1: no profile" in stderr
    document = yaml.safe_load(out.read_text())
    assert [p["category"] for p in document["profiles"]] == ["a"]
    assert "Verify steps per category: a 40." in document["caveats"]


def test_min_verify_steps_leaves_out_thin_categories(
    run_cli: Any, stand_in: dict[str, int], tmp_path: Path
) -> None:
    stand_in.update(a=40, b=3)
    code, _, stderr, out = _measure(run_cli, tmp_path, "--min-verify-steps", "10")
    assert code == 0
    assert "measure: b: 3 verify steps, below --min-verify-steps 10" in stderr
    assert [p["category"] for p in yaml.safe_load(out.read_text())["profiles"]] == ["a"]


def test_no_category_with_enough_steps_writes_nothing_and_exits_4(
    run_cli: Any, stand_in: dict[str, int], tmp_path: Path
) -> None:
    stand_in.update(a=0, b=0)
    code, _, stderr, out = _measure(run_cli, tmp_path)
    assert code == 4
    assert "measure: inconclusive: no category has 1 or more verify steps" in stderr
    assert not out.exists()
    code, _, stderr, _ = _measure(run_cli, tmp_path, "--min-verify-steps", "0")
    assert code == 2 and "command line: --min-verify-steps" in stderr
