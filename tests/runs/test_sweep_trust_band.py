"""A simulated sweep's page states how far to trust it: the decision table brackets each K's
figure with its expected range (decision.json's ``expected_low`` / ``expected_high``), and the
trust line follows the table; a sweep without a decision shows each point's trust line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from reportkit import field_mismatches, scan
from scenariokit import kimi_k3

pytestmark = pytest.mark.slow

SCENARIO = kimi_k3(requests=128)


def _sim(run_cli, tmp_path: Path, *args: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    out = tmp_path / "grid"
    code, _, err = run_cli("sim", path, *args, "--jobs", "1", "--output-dir", out)
    assert code == 0, err
    return out


def test_the_decision_brackets_each_k_with_its_expected_range(run_cli, tmp_path: Path) -> None:
    out = _sim(run_cli, tmp_path, "--sweep", "num_spec_tokens=1,3", "--sweep",
               "concurrency=4,16,64", "--at-interactivity", "100")  # fmt: skip
    decision = json.loads((out / "decision.json").read_text())
    page = (out / "report.html").read_text()
    fields = scan(page).fields
    for i, k in enumerate(decision["ks"]):
        assert k["expected_low"] < k["tok_s_gpu"] < k["expected_high"]
        for end in ("expected_low", "expected_high"):
            assert any(p == f"decision.ks[{i}].{end}" for p, _ in fields), end
    assert field_mismatches([(p, t) for p, t in fields if p.startswith("decision.")],
                            {"decision": decision}) == []  # fmt: skip
    line = decision["trust"]["line"]
    assert line.startswith("expected error")
    assert page.index('class="trust"') > page.index("decision.ks[0].expected_high")


def test_a_sweep_without_a_decision_shows_its_points_trust(run_cli, tmp_path: Path) -> None:
    out = _sim(run_cli, tmp_path, "--sweep", "concurrency=4,16")
    lines = {
        json.loads(p.read_text())["provenance"]["trust"]["line"]
        for p in out.glob("points/*/summary.json")
    }
    assert len(lines) == 1
    page = (out / "report.html").read_text()
    assert page.count('class="trust"') == 1
    assert "expected error" in page.split('class="trust"')[1].split("</p>")[0]
