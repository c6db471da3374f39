"""A decision over predicted runs states how far to trust them: each ``sim --output-dir`` run
records its expected error (``provenance.trust``, from the package's accuracy table), and
``compare --at-interactivity`` reads it back as the prediction's band, value / (1 + e) to
value x (1 + e), e the largest throughput error the input's runs state."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from scenariokit import kimi_k3
from speclens.runs.compare_inputs import stated_error
from speclens.runs.rundir import InputError, Run

pytestmark = pytest.mark.slow

SCENARIO = kimi_k3(requests=128)


def _sweep(run_cli, tmp_path: Path, name: str, hardware: str, parallel: int) -> Path:
    scenario = json.loads(json.dumps(SCENARIO))
    scenario["hardware"] = hardware
    scenario["deployment"]["pools"][0]["parallel"] = parallel
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(scenario))
    out = tmp_path / name
    code, _, err = run_cli("sim", path, "--sweep", "concurrency=4,16,64", "--jobs", "1",
                           "--output-dir", out)  # fmt: skip
    assert code == 0, err
    return out


def _throughput_error(sweep: Path) -> float:
    errors = {
        json.loads(p.read_text())["provenance"]["trust"]["expected_error"]["throughput"]
        for p in sweep.glob("points/*/summary.json")
    }
    assert len(errors) == 1, errors
    return errors.pop()


def test_a_decision_over_predicted_runs_states_each_ones_band(run_cli, tmp_path: Path) -> None:
    a = _sweep(run_cli, tmp_path, "b300", "b300", 8)
    b = _sweep(run_cli, tmp_path, "b200", "b200", 16)
    code, out, err = run_cli("compare", a, b, "--at-interactivity", "120", "--json")
    assert code == 0, err
    decision = json.loads(out)["decision"]
    for label, sweep in (("b300", a), ("b200", b)):
        (choice,) = [c for c in decision["choices"] if c["label"] == label]
        error = _throughput_error(sweep)
        assert error > 0
        assert choice["expected_error"] == pytest.approx(error)
        value = choice["tok_s_gpu"]
        assert choice["low"] == pytest.approx(value / (1 + error), rel=1e-3)
        assert choice["high"] == pytest.approx(value * (1 + error), rel=1e-3)
    code, out, _ = run_cli("compare", a, b, "--at-interactivity", "120")
    first = out.splitlines()[0]
    assert re.search(r"\(predicted, expected range [\d,]+ to [\d,]+\)", first), first


def test_a_run_that_states_no_error_leaves_the_input_unbanded(tmp_path: Path) -> None:
    def run(trust: object) -> Run:
        return Run(tmp_path / "r", {"settings": {}, "provenance": {"trust": trust}}, [])

    stated = {"expected_error": {"throughput": 0.2}}
    assert stated_error([run(stated), run({"expected_error": {"throughput": 0.3}})]) == 0.3
    assert stated_error([run(stated), run({"expected_error": None})]) is None
    with pytest.raises(InputError, match=r"provenance.trust.expected_error.throughput"):
        stated_error([run({"expected_error": {"throughput": "a lot"}})])
