"""How far to trust ``speclens sim``'s answer, stated where the answer is: a scenario's run (its
figures, ``--json``, each run directory's summary), the K sweep's decision at a target
interactivity (beside it, and each K's band), the K schedule (once, on the console and its
page) and a bench-run replay (the fit's own error). The figures are read from the shipped
accuracy table here, never written out: a statement taken from the wrong row or column shows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from speclens.sim import catalog, trust
from toyrooflinekit import cost_file

B200: dict[str, Any] = {
    "model": "deepseek-r1", "hardware": "b200", "precision": "fp8",
    "deployment": {"pools": [{"parallel": 8, "engine": {
        "speculative": {"method": "mtp", "num_spec_tokens": 2}}}]},
    "workload": {"category": "coding", "thinking": "on", "input_tokens": {"min": 16, "max": 64},
                 "output_tokens": {"min": 1, "max": 48}, "concurrency": 6, "requests": 30},
}  # fmt: skip
AL = ("--acceptance-length", "1.9")
GRID = ["--sweep", "num_spec_tokens=2..3", "--sweep", "concurrency=1,6", "--jobs", "1"]


def _table() -> dict[str, Any]:
    return yaml.safe_load(trust.table_path().read_text())


def _said(text: str) -> str:
    return " ".join(text.split())


def _write(tmp_path: Path, name: str, data: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _percent(value: float) -> str:
    return trust.percent(value)


def test_a_b200_run_prints_b200s_leave_one_chip_out_error(run_cli, tmp_path: Path) -> None:
    b200 = _table()["chips"]["b200"]
    path = _write(tmp_path, "b200.yaml", B200)
    code, out, err = run_cli("sim", path, *AL)
    assert code == 0, err
    said = _said(out)
    want = (f"expected error TPOT {_percent(b200['uncalibrated']['tpot'])}, TTFT "
            f"{_percent(b200['uncalibrated']['ttft'])}, throughput per GPU "
            f"{_percent(b200['uncalibrated']['throughput'])} (b200's catalog defaults")  # fmt: skip
    assert want in said
    assert "leave-one-chip-out" in said and "fitted on b200 itself" in said
    # the TTFT figure counts a front latency a scenario's run does not add: said so
    assert "front latency" in said and "TTFT reads low" in said
    # after the figures
    assert out.index("expected error") > out.index("TPOT p50")
    code, out, err = run_cli("sim", path, *AL, "--json")
    assert code == 0, err
    got = json.loads(out)["trust"]
    assert got["expected_error"] == b200["uncalibrated"]
    assert got["basis"] == "catalog defaults" and got["chip"] == "b200"


def test_a_chip_without_published_points_states_the_median_over_the_others(
    run_cli, tmp_path: Path
) -> None:  # fmt: skip
    """gb200 ran no single-node point: a single-node scenario on it states the other chips'
    median, and that its defaults were fitted on its disaggregated runs."""
    overall = _table()["uncalibrated"]
    path = _write(tmp_path, "gb200.yaml", {**B200, "hardware": "gb200"})
    code, out, err = run_cli("sim", path, *AL, "--json")
    assert code == 0, err
    got = json.loads(out)["trust"]
    assert got["expected_error"] == {k: overall[k] for k in ("tpot", "ttft", "throughput")}
    said = _said(got["line"])
    assert "no single-node points for gb200" in said and "disaggregated points" in said


def _points_fit() -> dict[str, Any]:
    return {"tpot_error_median": 0.021, "ttft_error_median": 0.083,
            "throughput_error_median": 0.019}  # fmt: skip


def test_a_pool_priced_by_a_calibrated_cost_file_states_its_held_out_error(
    run_cli, tmp_path: Path
) -> None:  # fmt: skip
    chips = _table()["chips"]
    cost_file(tmp_path / "c.yaml", fit=_points_fit(), hardware="b200")
    plain = {**B200, "deployment": {"pools": [{"step_cost_file": "c.yaml"}]}}
    path = _write(tmp_path, "plain.yaml", plain)
    code, out, err = run_cli("sim", path, "--json")
    assert code == 0, err
    got = json.loads(out)["trust"]
    assert got["basis"] == "calibrated on published points"
    assert got["expected_error"] == chips["b200"]["held_out"]
    assert got["own_error"] == {"tpot": 0.021, "ttft": 0.083, "throughput": 0.019}
    assert "TTFT reads low" in _said(got["line"])  # a scenario's run adds no front latency
    # speculating: the MTP runs' figures
    speculating = {**B200, "deployment": {"pools": [{"step_cost_file": "c.yaml", "engine": {
        "speculative": {"method": "mtp", "num_spec_tokens": 2}}}]}}  # fmt: skip
    path = _write(tmp_path, "spec.yaml", speculating)
    code, out, err = run_cli("sim", path, *AL, "--json")
    assert code == 0, err
    assert json.loads(out)["trust"]["expected_error"] == chips["b200"]["speculating"]


def test_pools_priced_differently_state_each_and_the_larger_error(
    run_cli, tmp_path: Path
) -> None:  # fmt: skip
    """A pool at b200's defaults and a pool from a calibrated cost file: each pool's
    statement, and as the run's expected error each figure's larger."""
    chips = _table()["chips"]
    cost_file(tmp_path / "c.yaml", fit=_points_fit(), hardware="b200")
    pools = [{"role": "mixed", "parallel": 8}, {"step_cost_file": "c.yaml"}]
    path = _write(tmp_path, "pd.yaml", {**B200, "deployment": {"pools": pools}})
    code, out, err = run_cli("sim", path, "--json")
    assert code == 0, err
    got = json.loads(out)["trust"]
    a, b = chips["b200"]["uncalibrated"], chips["b200"]["held_out"]
    assert got["expected_error"] == {k: max(a[k], b[k]) for k in a}
    line = _said(got["line"])
    assert line.startswith("pool 0: expected error") and "; pool 1: expected error" in line


def test_a_cost_file_with_a_broken_own_error_is_refused_before_anything_is_written(
    run_cli, tmp_path: Path
) -> None:  # fmt: skip
    cost = cost_file(tmp_path / "c.yaml", fit={**_points_fit(), "ttft_error_median": "low"})
    plain = {**B200, "deployment": {"pools": [{"step_cost_file": "c.yaml"}]}}
    path = _write(tmp_path, "plain.yaml", plain)
    out = tmp_path / "run"
    code, stdout, err = run_cli("sim", path, "--output-dir", out)
    assert code == 1 and stdout == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "fit.ttft_error_median" in lines[0] and str(cost) in lines[0]
    assert not out.exists()


def test_the_decision_states_its_expected_error_and_each_ks_band(run_cli, tmp_path: Path) -> None:
    error = _table()["chips"]["b200"]["uncalibrated"]["throughput"]
    path = _write(tmp_path, "b200.yaml", B200)
    target = ("--at-interactivity", "150")
    code, out, err = run_cli("sim", path, *AL, *GRID, *target, "--json")
    assert code == 0, err
    decision = json.loads(out)["decision"]
    assert decision["trust"]["expected_error"]["throughput"] == error
    reached = [e for e in decision["ks"] if e["tok_s_gpu"] is not None]
    assert reached, decision
    for e in reached:
        assert e["expected_low"] == pytest.approx(e["tok_s_gpu"] / (1 + error))
        assert e["expected_high"] == pytest.approx(e["tok_s_gpu"] * (1 + error))
    code, out, err = run_cli("sim", path, *AL, *GRID, *target, "--output-dir", tmp_path / "sw")
    assert code == 0, err
    lines = out.splitlines()
    said = _said(out)
    assert "expected range" in said
    # beside the decision (before the figures' table), and said once
    assert said.count("expected error TPOT") == 1
    first = next(i for i, line in enumerate(lines) if line.startswith("expected error"))
    assert first < next(i for i, line in enumerate(lines) if "speclens sim" in line)
    written = json.loads((tmp_path / "sw" / "decision.json").read_text())
    assert written["trust"] == decision["trust"]


def test_the_k_schedule_states_its_expected_error_once(run_cli, tmp_path: Path) -> None:
    b200 = _table()["chips"]["b200"]["uncalibrated"]
    path = _write(tmp_path, "b200.yaml", B200)
    grid = [*GRID, "--context", "1k,2k"]
    code, out, err = run_cli("sim", path, *AL, *grid, "--json", "--output-dir", tmp_path / "k")
    assert code == 0, err
    said = json.loads(out)["schedule"]["trust"]
    assert said["expected_error"] == b200  # K 0 and each K priced alike: one statement
    page = (tmp_path / "k" / "report.html").read_text()
    import html

    assert html.escape(said["line"], quote=True) in page
    code, out, err = run_cli("sim", path, *AL, *grid)
    assert code == 0, err
    assert _said(out).count("expected error TPOT") == 1
    assert _said(said["line"]) in _said(out)


def _mooncake(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    rows = [{"timestamp": 100 * i, "input_length": 32, "output_length": 8} for i in range(6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_replay_on_a_bench_run_fit_states_its_own_error(run_cli, tmp_path: Path) -> None:
    cost = tmp_path / "c.yaml"
    cost.write_text(yaml.safe_dump({
        "kind": "StepCostFit", "step_cost": {"base": 0.01, "per_token": 1e-4},
        "fit": {"decode_time_error_median": 0.041}, "provenance": {"model": "m"},
    }))  # fmt: skip
    out = tmp_path / "replay"
    code, stdout, err = run_cli("sim", "--trace", _mooncake(tmp_path), "--step-cost", cost,
                                "--json", "--output-dir", out)  # fmt: skip
    assert code == 0, err
    got = json.loads(stdout)["trust"]
    assert got["basis"] == "calibrated on bench runs" and got["expected_error"] is None
    assert got["own_error"] == {"decode_time": 0.041}
    assert json.loads((out / "summary.json").read_text())["provenance"]["trust"] == got
    code, stdout, err = run_cli("sim", "--trace", _mooncake(tmp_path), "--step-cost", cost)
    assert code == 0, err
    assert "not measured held out" in _said(stdout) and "median decode time 4.1%" in stdout


def test_a_replay_priced_by_a_scenario_states_its_chips_error(run_cli, tmp_path: Path) -> None:
    b200 = _table()["chips"]["b200"]["uncalibrated"]
    plain = {**B200, "deployment": {"pools": [{"parallel": 8}]}}
    path = _write(tmp_path, "b200.yaml", plain)
    code, stdout, err = run_cli("sim", path, "--trace", _mooncake(tmp_path), "--json")
    assert code == 0, err
    got = json.loads(stdout)["trust"]
    assert got["expected_error"] == b200 and "TTFT reads low" in _said(got["line"])


def test_a_run_past_the_concurrencies_its_defaults_were_fitted_on_says_so(
    run_cli, tmp_path: Path
) -> None:  # fmt: skip
    """b200's defaults were fitted on single-node points at concurrency 1 to 64: a run at 512
    (InferenceX's B200 SGLang FP8 MTP point there is off by 117%) says it extrapolates, a sweep
    names its span, and a run inside the span says nothing of it."""
    fitted = catalog.chip("b200").fitted_on
    assert fitted is not None and fitted.concurrency == [1, 64]
    wide = {**B200, "workload": {**B200["workload"], "concurrency": 512, "requests": 512}}
    code, out, err = run_cli("sim", _write(tmp_path, "wide.yaml", wide), *AL, "--json")
    assert code == 0, err
    got = json.loads(out)["trust"]
    note = ("b200's catalog defaults were fitted on single-node points at concurrency 1 to 64 "
            "and this run reaches 512 to 512: outside them it extrapolates")  # fmt: skip
    assert note in _said(got["line"]) and got["notes"] == [note]
    code, out, err = run_cli("sim", _write(tmp_path, "wide.yaml", wide), *AL, "--sweep",
                             "concurrency=16,128", "--jobs", "1")  # fmt: skip
    assert code == 0, err
    assert "this run reaches 16 to 128: outside them it extrapolates" in _said(out)
    code, out, err = run_cli("sim", _write(tmp_path, "inside.yaml", B200), *AL, "--json")
    assert code == 0 and "extrapolates" not in json.loads(out)["trust"]["line"]
