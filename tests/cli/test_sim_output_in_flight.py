"""``sim --sweep ... --output-dir`` writes each point's files as it finishes and keeps only the
points in flight, so a sweep whose points together exceed the records budget runs when each
point fits (the Done-means grid: 48 points of 256 requests up to 512 tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from speclens.sim import run_output

SMALL = {
    "model": "kimi-k3",
    "deployment": {"pools": [{"engine": {"speculative": {"method": "dspark", "num_spec_tokens": 7}}}]},
    "workload": {"category": "coding", "thinking": "on", "input_tokens": 16,
                 "output_tokens": 16, "concurrency": 4, "requests": 8},
}  # fmt: skip


def test_points_in_flight_fit_the_budget() -> None:
    budget = run_output.MAX_RECORDED_REQUEST_STEPS
    assert run_output.points_in_flight(1, budget // 2, workers=16) == 2
    assert run_output.points_in_flight(1, budget, workers=16) == 1
    assert run_output.points_in_flight(1, 10, workers=3) == 3
    assert run_output.points_in_flight(1, budget * 2, workers=4) == 1  # refused before, anyway


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_sweep_over_the_budget_in_total_but_not_per_point_writes_every_point(
    run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs: str
) -> None:
    monkeypatch.setattr(run_output, "MAX_RECORDED_REQUEST_STEPS", 8 * 16 * 2)  # two points
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(SMALL))
    out = tmp_path / "out"
    code, _, err = run_cli(
        "sim", scenario, "--sweep", "concurrency=1,2,4", "--output-dir", out, "--jobs", jobs
    )
    assert code == 0, err
    sweep = json.loads((out / "sweep.json").read_text())
    assert [p["status"] for p in sweep["points"]] == ["ok"] * 3
    for point in sweep["points"]:
        summary = json.loads((out / point["dir"] / "summary.json").read_text())
        assert summary["settings"]["concurrency"] == point["settings"]["concurrency"]
        assert len((out / point["dir"] / "records.jsonl").read_text().splitlines()) == 8
