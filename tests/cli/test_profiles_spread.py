"""``speclens profiles from-run`` writes a measured profile set from a natural-acceptance bench
run, each profile with its spread between requests where it rests on enough of them; the set
validates, and resolves with the spread, which ``profiles resolve`` prints (or says it is
unknown). ``speclens measure`` writes the spread the same way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from speclens.acceptance import AcceptanceProfileSet, load
from speclens.acceptance.spread import (
    DEFAULT_TOLERANCE,
    LEVEL_NAMES,
    MIN_REQUESTS,
    SPREAD_UNKNOWN,
    implied_mean,
)
from speclens.cli.measure import spread_of
from speclens.runs.figures import acceptance
from spreadkit import natural_requests, write_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two categories: coding with 24 requests (a spread), math with 6 (too few for one)."""
    records = natural_requests({"coding": 24, "math": 6}, seed=1)
    return write_run(tmp_path_factory.mktemp("runs") / "ngram-run", records)


def _from_run(run_cli: Any, run_dir: Path, out: Path, *args: str) -> Any:
    return run_cli("profiles", "from-run", run_dir, "-o", out, *args)


def _resolve(run_cli: Any, registry: Path, category: str, *args: str) -> Any:
    return run_cli(
        "profiles", "resolve", "--model", "dummy", "--method", "ngram", "-k", "3",
        "--thinking", "off", "--category", category, "--registry", registry, *args,
    )  # fmt: skip


def test_from_run_writes_a_valid_set_whose_spread_resolves(
    run_cli: Any, run_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "registry" / "acceptance" / "ngram.yaml"
    code, stdout, stderr = _from_run(run_cli, run_dir, out)
    assert code == 0, stdout + stderr
    by_category = {p.category: p for p in load(AcceptanceProfileSet, out).profiles}
    coding, math_ = by_category["coding"], by_category["math"]
    assert coding.method == "measured" and coding.num_spec_tokens == 3
    assert coding.provenance is not None and coding.provenance.prompts == 24
    assert coding.provenance.run == "ngram-run" and coding.provenance.hardware == "cpu-x86_64"
    # The spread is the run's own: its quantiles, rounded as written.
    records = natural_requests({"coding": 24, "math": 6}, seed=1)
    measured = acceptance(records)["al_by_category"]["coding"]["per_request"]
    assert coding.spread is not None and coding.spread.requests == 24
    assert coding.spread.values == pytest.approx(
        [measured["quantiles"][n] for n in LEVEL_NAMES], abs=5e-5
    )
    assert coding.spread.tolerance is not None
    assert abs(implied_mean(coding.spread.values) - coding.acceptance_length) <= (
        coding.spread.tolerance
    )
    assert math_.spread is None
    assert "coding: AL" in stdout and f"spread p10 {coding.spread.quantiles['p10']:g}" in stdout
    assert "wrote" in stdout and "(2 measured profiles, 1 with a spread)" in stdout
    assert (f"profiles from-run: math: no spread: 6 requests, fewer than the {MIN_REQUESTS} a "
            "spread needs") in stderr  # fmt: skip
    caveats = yaml.safe_load(out.read_text())["caveats"]
    assert any("stated for coding; not for math (6 requests" in c for c in caveats)

    code, stdout, stderr = run_cli("profiles", "validate", out)
    assert code == 0, stdout + stderr
    code, stdout, stderr = _resolve(run_cli, out.parent.parent, "coding", "--json")
    assert code == 0, stdout + stderr
    resolved = json.loads(stdout)
    assert resolved["spread"]["quantiles"] == coding.spread.quantiles
    assert resolved["spread"]["requests"] == 24
    code, stdout, _ = _resolve(run_cli, out.parent.parent, "coding")
    q = coding.spread.quantiles
    assert f"per-request AL p10 {q['p10']:g}, p50 {q['p50']:g}, p90 {q['p90']:g} over 24" in stdout
    assert SPREAD_UNKNOWN not in stdout
    code, stdout, _ = _resolve(run_cli, out.parent.parent, "math")
    assert code == 0 and SPREAD_UNKNOWN in stdout


def test_category_pools_the_whole_run_into_one_profile_with_a_spread(
    run_cli: Any, run_dir: Path, tmp_path: Path
) -> None:
    """Six math requests give no spread on their own; pooled with coding's, 30 requests do."""
    out = tmp_path / "pooled.yaml"
    code, stdout, stderr = _from_run(run_cli, run_dir, out, "--category", "spec-bench")
    assert code == 0, stdout + stderr
    (profile,) = load(AcceptanceProfileSet, out).profiles
    records = natural_requests({"coding": 24, "math": 6}, seed=1)
    pooled = acceptance(records)
    assert profile.category == "spec-bench"
    assert profile.acceptance_length == round(pooled["token_weighted_al"], 4)
    assert profile.provenance is not None and profile.provenance.prompts == 30
    assert profile.spread is not None and profile.spread.requests == 30
    assert profile.spread.quantiles["p50"] == round(pooled["per_request"]["quantiles"]["p50"], 4)
    assert "no spread" not in stderr


def _block(quantiles: list[float], requests: int = 40) -> dict[str, Any]:
    return {"requests": requests, "quantiles": dict(zip(LEVEL_NAMES, quantiles, strict=True))}


SKEWED = [1.0, 1.0, 1.1, 1.2, 1.5, 2.5, 3.6, 3.9, 4.0]  # implied mean about 2.08


def test_the_tolerance_covers_the_gap_rounded_up_to_a_hundredth() -> None:
    mean = implied_mean(SKEWED)
    spread, why = spread_of(_block(SKEWED), round(mean, 4), 3, None)
    assert why is None and spread is not None
    assert spread["tolerance"] == DEFAULT_TOLERANCE  # no gap: the default
    spread, why = spread_of(_block(SKEWED), round(mean - 0.0712, 4), 3, "run-a")
    assert spread is not None and spread["tolerance"] == 0.08 and spread["source"] == "run-a"
    assert spread["requests"] == 40 and spread["num_spec_tokens"] == 3


def test_a_gap_past_the_widest_tolerance_states_no_spread_and_says_why() -> None:
    mean = implied_mean(SKEWED)
    spread, why = spread_of(_block(SKEWED), round(mean + 0.6, 4), 3, None)
    assert spread is None
    assert why is not None and "beyond the widest tolerance 0.5" in why
    assert f"a mean AL of {mean:.4f}" in why


def test_too_few_requests_state_no_spread() -> None:
    spread, why = spread_of(_block(SKEWED, requests=MIN_REQUESTS - 1), 2.0, 3, None)
    assert (
        spread is None and why == f"{MIN_REQUESTS - 1} requests, fewer than the 20 a spread needs"
    )


# ------------------------------------------------------------------------------ measure


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """``speclens measure`` with its server and load stood in for: the run is ``records``."""
    from speclens.bench.run import BenchOutcome
    from speclens.cli import measure as measure_cli
    from speclens.runs.figures import summarize
    from speclens.runs.request import RunResult

    records: list[Any] = []
    served = measure_cli.Served({"version": "1"}, "speclens", "ngram", 3, "cpu")
    monkeypatch.setattr(measure_cli, "_served", lambda *a: served)
    monkeypatch.setattr(measure_cli, "_run", lambda *a: BenchOutcome(
        {"figures": summarize(RunResult(records, 0.0, 1.0))}, records))  # fmt: skip
    return records


def test_measure_writes_the_spread_as_from_run_does(
    run_cli: Any, measured: list[Any], tmp_path: Path
) -> None:
    measured.extend(natural_requests({"coding": 24, "math": 6}, seed=1))
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": ["hi"]}) + "\n"
                            for i, c in enumerate(["coding", "math"])))  # fmt: skip
    out = tmp_path / "measured.yaml"
    code, stdout, stderr = run_cli("measure", "--model", "dummy", "--dataset-path", data, "-o", out)
    assert code == 0, stdout + stderr
    by_category = {p.category: p for p in load(AcceptanceProfileSet, out).profiles}
    assert by_category["coding"].spread is not None and by_category["math"].spread is None
    assert by_category["coding"].spread.requests == 24
    assert by_category["coding"].spread.source is None  # no run directory to name
    assert "measure: math: no spread: 6 requests, fewer than the 20" in stderr
