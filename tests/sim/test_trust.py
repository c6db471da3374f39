"""How far to trust a prediction (``speclens.sim.trust``): the figures a statement gives come
from the accuracy table, chosen by how the steps were priced, and each says what they measure.

The statements are checked against a table written here by hand (figures no benchmark made), so
a figure taken from the wrong row or column shows; the shipped table is checked for its shape
and its chips, and ``test_trust_benchmark.py`` holds its figures to the benchmark's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from aggregatekit import write_sweep
from speclens.acceptance import ValidationError
from speclens.sim import catalog, trust
from speclens.sim.roofline import Efficiency, Roofline
from toyrooflinekit import cost_file, toy_point

#: A table as ``benchmarks/inferencex.py --write-trust`` writes one, its figures made up.
TABLE: dict[str, Any] = {
    "kind": "Accuracy",
    "source": "by hand",
    "error": "|predicted / measured - 1|",
    "held_out": {"deployments": 30, "tpot": 0.051, "ttft": 0.21, "throughput": 0.047},
    "speculating": {"deployments": 12, "tpot": 0.081, "ttft": 0.17, "throughput": 0.093,
                    "speedup": 0.08},
    "uncalibrated": {"deployments": 30, "tpot": 0.22, "ttft": 0.46, "throughput": 0.17},
    "chips": {
        "b200": {"deployments": 8, "points": 24,
                 "uncalibrated": {"tpot": 0.204, "ttft": 0.537, "throughput": 0.152},
                 "held_out": {"tpot": 0.043, "ttft": 0.31, "throughput": 0.039},
                 "speculating": {"tpot": 0.062, "ttft": 0.12, "throughput": 0.071},
                 "speculating_deployments": 5},
        "mi300x": {"deployments": 3, "points": 15,
                   "uncalibrated": {"tpot": 0.225, "ttft": 0.153, "throughput": 0.339},
                   "held_out": {"tpot": 0.066, "ttft": 0.091, "throughput": 0.064}},
    },
    "disaggregated": {
        "held_out": {"deployments": 36, "tpot": 0.204, "ttft": 0.647, "throughput": 0.194},
        "speculating": {"deployments": 21, "tpot": 0.267, "ttft": 0.9, "throughput": 0.2},
        "uncalibrated": {"deployments": 44, "tpot": 0.18, "ttft": 0.925, "throughput": 0.196},
        "chips": {
            "gb200": {"deployments": 10, "points": 63,
                      "uncalibrated": {"tpot": 0.192, "ttft": 0.872, "throughput": 0.206},
                      "held_out": {"tpot": 0.211, "ttft": 0.55, "throughput": 0.23},
                      "speculating": {"tpot": 0.44, "ttft": 0.87, "throughput": 0.4},
                      "speculating_deployments": 3},
        },
    },
}  # fmt: skip


@pytest.fixture
def table(tmp_path: Path) -> trust.Accuracy:
    path = tmp_path / "accuracy.yaml"
    path.write_text(yaml.safe_dump(TABLE))
    return trust.read_table(path)


def _said(t: trust.Trust) -> str:
    return " ".join(t.line.split())


def test_a_chips_catalog_defaults_state_its_leave_one_chip_out_error(table: Any) -> None:
    got = trust.for_chip("b200", table)
    assert got.expected is not None
    assert got.expected.model_dump() == TABLE["chips"]["b200"]["uncalibrated"]
    said = _said(got)
    assert said.startswith("expected error TPOT 20%, TTFT 54%, throughput per GPU 15% ")
    assert "leave-one-chip-out" in said and "scored on b200's 8 deployments" in said
    assert "b200's shipped defaults were fitted on b200 itself, those 24 points" in said
    assert got.as_dict()["expected_error"] == TABLE["chips"]["b200"]["uncalibrated"]
    assert got.as_dict()["line"] == got.line and got.as_dict()["chip"] == "b200"


def test_a_chip_without_published_points_states_the_median_and_says_so(table: Any) -> None:
    assert "tpu9" not in catalog.names("chips")  # a chip from a file: the global defaults
    got = trust.for_chip("tpu9", table)
    assert got.expected is not None
    want = {k: v for k, v in TABLE["uncalibrated"].items() if k != "deployments"}
    assert got.expected.model_dump() == want
    said = _said(got)
    assert said.startswith("expected error TPOT 22%, TTFT 46%, throughput per GPU 17% ")
    assert "no published points for tpu9: the median over the other chips'" in said
    assert "30 deployments" in said and "global defaults" in said
    assert "fitted on tpu9 itself" not in said


def test_a_rack_scale_chip_predicting_one_node_says_what_its_defaults_rest_on(
    table: Any,
) -> None:
    """gb200's defaults were fitted on its disaggregated runs: a single-node prediction on it
    states the other chips' median, a guide only, and what its defaults rest on."""
    assert catalog.chip("gb200").fitted_on is not None
    said = _said(trust.for_chip("gb200", table))
    assert "no single-node points for gb200: the median over the other chips'" in said
    points = catalog.chip("gb200").fitted_on.points
    assert f"gb200's defaults were fitted on its {points} disaggregated points" in said
    assert "global defaults" not in said


def _points_fit(chip: str = "b200", n: int = 4) -> dict[str, Any]:
    return {"fit": {"tpot_error_median": 0.021, "ttft_error_median": 0.083,
                    "throughput_error_median": 0.019,
                    "load_points": [{"concurrency": c} for c in range(1, n + 1)]},
            "provenance": {"hardware": chip}}  # fmt: skip


def test_a_fit_on_published_points_states_the_held_out_error_and_its_own(table: Any) -> None:
    got = trust.for_cost_file(_points_fit(), "c.yaml", accuracy=table)
    assert got.expected is not None
    assert got.expected.model_dump() == TABLE["chips"]["b200"]["held_out"]
    assert got.own == {"tpot": 0.021, "ttft": 0.083, "throughput": 0.019}
    said = _said(got)
    assert said.startswith("expected error TPOT 4.3%, TTFT 31%, throughput per GPU 3.9% (held out")
    assert "median over b200's 8 deployments" in said
    assert "on its own 4 points TPOT 2.1%, TTFT 8.3%, throughput per GPU 1.9%" in said


def test_a_speculating_prediction_states_the_mtp_error(table: Any) -> None:
    got = trust.for_cost_file(_points_fit(), "c.yaml", speculating=True, accuracy=table)
    assert got.expected is not None
    assert got.expected.model_dump() == TABLE["chips"]["b200"]["speculating"]
    assert "b200's 5 deployments with MTP runs" in _said(got)
    # A chip with no MTP run: the median over every chip's.
    other = trust.for_cost_file(_points_fit("mi300x"), "c.yaml", speculating=True, accuracy=table)
    assert other.expected is not None
    want = {k: TABLE["speculating"][k] for k in ("tpot", "ttft", "throughput")}
    assert other.expected.model_dump() == want
    assert "median over 12 deployments of every chip" in _said(other)


def test_a_fit_on_a_chip_the_table_lacks_states_the_median_over_all(table: Any) -> None:
    got = trust.for_cost_file(_points_fit("toy-gpu"), "c.yaml", accuracy=table)
    assert got.expected is not None
    want = {k: TABLE["held_out"][k] for k in ("tpot", "ttft", "throughput")}
    assert got.expected.model_dump() == want
    assert "median over 30 deployments of every chip" in _said(got)


def test_a_fit_on_bench_runs_states_its_own_error_and_no_held_out_one(table: Any) -> None:
    meta = {"fit": {"decode_time_error_median": 0.041}, "provenance": {"model": "m"}}
    got = trust.for_cost_file(meta, "c.yaml", accuracy=table)
    assert got.expected is None and got.own == {"decode_time": 0.041}
    assert got.band("tpot", 10.0) is None
    said = _said(got)
    assert "not measured held out" in said and "median decode time 4.1%" in said
    assert got.as_dict()["expected_error"] is None and got.as_dict()["source"] is None


def test_a_fit_that_records_no_error_says_none_was_measured(table: Any) -> None:
    got = trust.for_cost_file({"fit": {"front_latency_s": 0.1}}, "c.yaml", accuracy=table)
    assert got.expected is None and got.own == {}
    assert "expected error not measured (c.yaml's fit records no error" in _said(got)


@pytest.mark.parametrize("value", ["5%", -0.1, float("nan"), True])
def test_an_own_error_that_is_not_a_fraction_is_refused_naming_the_field(
    table: Any, value: Any
) -> None:  # fmt: skip
    meta = _points_fit()
    meta["fit"]["ttft_error_median"] = value
    with pytest.raises(ValidationError) as exc:
        trust.for_cost_file(meta, "c.yaml", accuracy=table)
    assert len(exc.value.problems) == 1
    said = str(exc.value)
    assert "c.yaml" in said and "fit.ttft_error_median" in said and "fraction" in said


def test_a_band_is_the_prediction_over_and_times_one_plus_the_error(table: Any) -> None:
    got = trust.for_chip("b200", table)
    low, high = got.band("tpot", 10.0) or (0.0, 0.0)
    assert low == pytest.approx(10.0 / 1.204) and high == pytest.approx(10.0 * 1.204)
    low, high = got.band("ttft", 10.0) or (0.0, 0.0)
    assert (low, high) == (pytest.approx(10.0 / 1.537), pytest.approx(15.37))


def test_the_pricing_a_sim_run_states_picks_its_figures(table: Any) -> None:
    model = catalog.model("deepseek-r1")
    at_defaults = Roofline(model, catalog.chip("b200"), 8).describe()
    assert at_defaults["efficiency_source"] == "chip"
    assert trust.for_pricing(at_defaults, accuracy=table).basis == "catalog defaults"
    global_defaults = Roofline(model, catalog.chip("gb200"), 8).describe()
    got = trust.for_pricing(global_defaults, accuracy=table)
    assert got.basis == "no published points" and got.chip == "gb200"
    stated = Roofline(model, catalog.chip("b200"), 8, efficiency=Efficiency(compute=0.3)).describe()
    got = trust.for_pricing(stated, accuracy=table)
    assert got.expected is None and "efficiencies stated for b200" in _said(got)
    linear = {"kind": "step_cost", "source": "stated in the scenario"}
    got = trust.for_pricing(linear, accuracy=table)
    assert got.expected is None and "step prices stated in the scenario" in _said(got)
    got = trust.for_pricing({**stated, "source": "from c.yaml"}, _points_fit(), accuracy=table)
    assert got.basis == "calibrated on published points"


def test_the_shipped_table_covers_every_chip_that_ships_defaults() -> None:
    """Single-node defaults: the chips the table scores single-node; every chip with
    disaggregated runs: the table's disaggregated block."""
    shipped = trust.table()
    single = {n for n in catalog.names("chips")
              if (f := catalog.chip(n).fitted_on) is not None and f.runs == "single-node"}  # fmt: skip
    assert set(shipped.chips) == single
    assert shipped.disaggregated is not None
    assert {"gb200", "gb300", "h100"} <= set(shipped.disaggregated.chips)
    for name in catalog.names("chips"):
        got = trust.for_chip(name)
        assert got.expected is not None, name
        fitted_on_itself = "fitted on " + name + " itself" in _said(got)
        assert fitted_on_itself == (name in single), name
        assert trust.for_chip(name, disaggregated=True).expected is not None, name


def test_a_broken_table_is_refused_naming_each_field(tmp_path: Path) -> None:
    broken = json.loads(json.dumps(TABLE))
    del broken["chips"]["b200"]["points"]
    broken["held_out"]["tpot"] = -1
    path = tmp_path / "accuracy.yaml"
    path.write_text(yaml.safe_dump(broken))
    with pytest.raises(ValidationError) as exc:
        trust.read_table(path)
    fields = sorted(p.path for p in exc.value.problems)
    assert fields == ["chips.b200.points", "held_out.tpot"]
    assert all(p.file == str(path) for p in exc.value.problems)


# --- sim --trace on published points: the statement printed, in --json and in each summary.


def _shipped() -> dict[str, Any]:
    return yaml.safe_load(trust.table_path().read_text())


def test_a_published_replay_prints_and_records_its_expected_error(run_cli, tmp_path: Path) -> None:
    trace = write_sweep(tmp_path / "s", [toy_point(c, hardware="b200") for c in (1, 4)])
    fit = {k: v for k, v in _points_fit()["fit"].items() if k != "load_points"}
    cost = cost_file(tmp_path / "c.yaml", fit=fit, hardware="b200")
    out = tmp_path / "pred"
    code, stdout, err = run_cli("sim", "--trace", trace, "--step-cost", cost, "--json",
                                "--output-dir", out)  # fmt: skip
    assert code == 0, err
    said = json.loads(stdout)["trust"]
    assert said["expected_error"] == _shipped()["chips"]["b200"]["held_out"]
    assert said["own_error"] == {"tpot": 0.021, "ttft": 0.083, "throughput": 0.019}
    assert said["basis"] == "calibrated on published points" and said["chip"] == "b200"
    for c in (1, 4):
        summary = json.loads((out / "points" / f"c{c}" / "summary.json").read_text())
        assert summary["provenance"]["trust"] == said
    code, stdout, err = run_cli("sim", "--trace", trace, "--step-cost", cost)
    assert code == 0, err
    assert " ".join(said["line"].split()) in " ".join(stdout.split())


def test_a_speculating_published_replay_states_the_mtp_error(run_cli, tmp_path: Path) -> None:
    trace = write_sweep(tmp_path / "s", [toy_point(1, method="mtp", k=3)])
    cost = cost_file(tmp_path / "c.yaml", fit=_points_fit()["fit"], hardware="toy-gpu")
    code, stdout, err = run_cli("sim", "--trace", trace, "--step-cost", cost, "--json",
                                "--method", "mtp", "--num-speculative-tokens", "3",
                                "--acceptance-length", "2")  # fmt: skip
    assert code == 0, err
    overall = _shipped()["speculating"]
    want = {k: overall[k] for k in ("tpot", "ttft", "throughput")}
    assert json.loads(stdout)["trust"]["expected_error"] == want


def test_a_published_replay_with_a_broken_own_error_writes_nothing(run_cli, tmp_path: Path) -> None:
    trace = write_sweep(tmp_path / "s", [toy_point(1)])
    fit = {**_points_fit()["fit"], "tpot_error_median": "low"}
    cost = cost_file(tmp_path / "c.yaml", fit=fit)
    out = tmp_path / "pred"
    code, stdout, err = run_cli("sim", "--trace", trace, "--step-cost", cost, "--output-dir", out)
    assert code == 1 and stdout == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "fit.tpot_error_median" in lines[0] and str(cost) in lines[0]
    assert not out.exists()


def test_a_disaggregated_prediction_states_the_disaggregated_figures(table: Any) -> None:
    """A disaggregated prediction at a chip's defaults states the chip's leave-one-chip-out
    error on disaggregated runs (not its single-node one), and what its defaults rest on; a
    chip the block lacks, the block's median; a cost file, the block's held-out error."""
    got = trust.for_chip("gb200", table, disaggregated=True)
    assert got.expected is not None
    assert got.expected.model_dump() == TABLE["disaggregated"]["chips"]["gb200"]["uncalibrated"]
    said = _said(got)
    assert said.startswith("expected error TPOT 19%, TTFT 87%, throughput per GPU 21% ")
    assert "on disaggregated runs" in said and "scored on gb200's 10 configurations" in said
    fitted = catalog.chip("gb200").fitted_on
    assert fitted is not None and f"its own disaggregated runs, {fitted.points} points" in said
    other = trust.for_chip("b200", table, disaggregated=True)
    assert other.expected is not None and other.expected.tpot == 0.18
    assert "no disaggregated points for b200" in _said(other)
    fit = trust.for_cost_file(_points_fit("mi355x"), "c.yaml", accuracy=table, disaggregated=True)
    assert fit.expected is not None and fit.expected.tpot == 0.204
    assert "36 disaggregated configurations" in _said(fit)
    spec = trust.for_cost_file(_points_fit("mi355x"), "c.yaml", speculating=True, accuracy=table,
                               disaggregated=True)  # fmt: skip
    assert spec.expected is not None and spec.expected.tpot == 0.267
    chip = trust.for_cost_file(_points_fit("gb200"), "c.yaml", accuracy=table,
                               disaggregated=True)  # fmt: skip
    assert chip.expected is not None and chip.expected.tpot == 0.211
    assert "median over gb200's 10 disaggregated configurations" in _said(chip)
    mtp = trust.for_cost_file(_points_fit("gb200"), "c.yaml", speculating=True, accuracy=table,
                              disaggregated=True)  # fmt: skip
    assert mtp.expected is not None and mtp.expected.tpot == 0.44
    assert "gb200's 3 disaggregated configurations with MTP runs" in _said(mtp)
