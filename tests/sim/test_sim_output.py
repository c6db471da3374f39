"""``speclens sim --output-dir``: the simulated run in bench's run format, read by the same
readers as a measured run, with the same figures ``speclens sim`` prints (one code path)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml

from speclens.acceptance import minimum_variance_rates
from speclens.runs.figures import summarize
from speclens.runs.record import from_json, row_problems
from speclens.runs.report import record_from_row, record_row
from speclens.runs.request import RunResult
from speclens.sim import run_output
from speclens.sim.run_output import ENGINE, spec_record
from speclens.sim.scenario import Scenario
from speclens.sim.simulate import simulate
from speclens.sim.sketch import RESOLUTION

SCENARIO = {
    "model": "kimi-k3",
    "deployment": {"pools": [{"engine": {"speculative": {"method": "dspark", "num_spec_tokens": 7}},
                              "replicas": 2}]},
    "workload": {"category": "coding", "thinking": "on", "input_tokens": {"min": 16, "max": 64},
                 "output_tokens": {"min": 1, "max": 48}, "concurrency": 6, "requests": 30},
}  # fmt: skip
RATES = minimum_variance_rates(3.78, 7)
#: A sketch percentile is within RESOLUTION / 2 of the exact order statistic (sim/sketch.py);
#: interpolating between two such reads stays within it.
PERCENTILE_REL = RESOLUTION
MEAN_REL = 1e-9


def _rows(records: list) -> list[dict]:
    """Each record as records.jsonl holds it (bytes through JSON and back)."""
    return [
        orjson.loads(orjson.dumps(record_row(r), option=orjson.OPT_NON_STR_KEYS)) for r in records
    ]


def _assert_same_figures(printed: dict, figures: dict) -> None:
    """``speclens sim``'s throughput and latency against summary.json's figures."""
    for key in ("requests_per_s", "output_tokens_per_s"):
        assert figures["throughput"][key] == pytest.approx(printed["throughput"][key], rel=MEAN_REL)
    for metric, dist in printed["latency_ms"].items():
        got = figures["latency_ms"][metric]
        for stat in ("mean", "min", "max"):
            assert got[stat] == pytest.approx(dist[stat], rel=MEAN_REL), (metric, stat)
        for stat in ("p50", "p90", "p99"):
            assert got[stat] == pytest.approx(dist[stat], rel=PERCENTILE_REL), (metric, stat)


@pytest.fixture(scope="module", params=[("fast", 1.0), ("fast", 0.6), ("exact", 0.6)])
def run(request, tmp_path_factory) -> tuple[dict, list]:
    """One simulated run with its records, per loop (and a coverage below 1)."""
    loop, coverage = request.param
    base = tmp_path_factory.mktemp("sim")
    result = simulate(
        Scenario.model_validate(SCENARIO), base, RATES, seed=3, draft_coverage=coverage,
        fast=loop == "fast", keep_records=True,
    )  # fmt: skip
    assert result["loop"] == loop
    return result, result.pop("records")


def test_every_row_passes_the_record_validator(run) -> None:
    _, records = run
    rows = _rows(records)
    assert [p for row in rows for p in row_problems(row)] == []
    for row in rows:
        spec = from_json(row["spec_decode_acceptance"])
        assert spec.engine == ENGINE and spec.num_spec_tokens == 7
        assert spec.num_decode_steps is not None and spec.num_spec_steps <= spec.num_decode_steps


def test_indices_number_the_requests_as_bench_does(run) -> None:
    """0..N-1, once each, in index order: arrival order of the workload's draws."""
    _, records = run
    assert [r.index for r in records] == list(range(SCENARIO["workload"]["requests"]))
    starts = [r.start for r in records]
    assert all(r.success and r.end >= r.start + r.ttft for r in records)
    assert min(starts) == 0.0


def test_summary_realized_al_is_the_simulated_al(run) -> None:
    """Kills the mutation: ``run_output.spec_record`` counting every decode step as a verify
    step (the drafting mask dropped), which at coverage 0.6 lowers the records' AL."""
    result, records = run
    acc = summarize(RunResult(records, 0.0, result["makespan_s"]))["acceptance"]
    assert acc["token_weighted_al"] == pytest.approx(
        result["realized_acceptance_length"], abs=1e-12
    )
    assert acc["histogram"] == result["histogram"]
    assert acc["verify_steps"] == sum(result["histogram"].values())
    assert acc["decode_steps"] == result["decode_request_steps"]
    assert acc["draft_coverage"] == pytest.approx(result["draft_coverage"], abs=1e-12)
    assert acc["num_spec_tokens"] == 7 and acc["inconsistent_requests"] == []


def test_summary_figures_are_the_printed_figures(run) -> None:
    """Kills the mutation: ``run_output.from_trace`` timing a request's first decode gap from
    its arrival instead of its first token (the ITL would differ from what sim prints)."""
    result, records = run
    summary = run_output.summary(records, result["makespan_s"], {}, {}, result)
    _assert_same_figures(result, summary["figures"])


def test_the_warm_up_is_left_out_of_the_latencies_only(run) -> None:
    """The closed loop's first ``concurrency`` requests (6, on 2 replicas) are its warm-up:
    summary.json's latencies are those of the others, its throughput and AL every request's."""
    result, records = run
    assert result["warmup"]["requests"] == 6
    figures = run_output.summary(records, result["makespan_s"], {}, {}, result)["figures"]
    every = summarize(RunResult(records, 0.0, result["makespan_s"]))
    measured = summarize(RunResult(records[6:], 0.0, result["makespan_s"]))
    assert [r.index for r in records[:6]] == list(range(6))
    assert figures["latency_ms"] == measured["latency_ms"] != every["latency_ms"]
    shared = {k: v for k, v in figures["throughput"].items() if k in every["throughput"]}
    assert shared == every["throughput"]
    assert figures["acceptance"] == every["acceptance"]


def test_rows_read_back_give_the_same_figures(run) -> None:
    """records.jsonl alone (as merge and compare read it) gives summary.json's figures."""
    result, records = run
    back = [record_from_row(row) for row in _rows(records)]
    again = summarize(RunResult(back, 0.0, result["makespan_s"]))
    assert again == summarize(RunResult(records, 0.0, result["makespan_s"]))


def test_a_request_that_never_drafted_has_a_zero_step_record() -> None:
    spec = spec_record(3, np.array([False, False]), np.array([0, 0]))
    assert spec is not None
    assert (spec["num_spec_steps"], spec["num_decode_steps"], spec["mean_acceptance_length"]) == (
        0, 2, 1.0,
    )  # fmt: skip
    assert spec_record(0, np.array([False]), np.array([0])) is None


# ------------------------------------------------------------------------------ the command
def _scenario(tmp_path: Path) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    return path


def test_the_command_writes_a_run_directory(run_cli, tmp_path: Path) -> None:
    """One run of the command (the step-exact loop's records are checked above): the files,
    the figures it prints, settings that say it was simulated, rows that pass the validator,
    and a summary the console report of a measured run prints."""
    from rich.console import Console

    from speclens.runs.report import print_summary

    out = tmp_path / "run"
    args = ["sim", _scenario(tmp_path), "--json", "--seed", "5", "--output-dir", out]
    code, stdout, stderr = run_cli(*args)
    assert code == 0, stderr
    printed = json.loads(stdout)
    assert "records" not in printed
    summary = json.loads((out / "summary.json").read_text())
    assert {"records.jsonl", "summary.json", "summary.csv", "latency_cdf.png"} <= {
        p.name for p in out.iterdir()
    }
    _assert_same_figures(printed, summary["figures"])
    acc = summary["figures"]["acceptance"]
    assert acc["token_weighted_al"] == pytest.approx(
        printed["realized_acceptance_length"], abs=1e-12
    )
    settings = summary["settings"]
    assert (settings["executor"], settings["seed"], settings["num_spec_tokens"]) == ("sim", 5, 7)
    assert (settings["scenario"], settings["loop"]) == (str(_scenario(tmp_path)), "fast")
    assert summary["server"]["acceptance"]["acceptance_length"] == pytest.approx(3.78)
    assert summary["simulation"]["makespan_s"] == summary["figures"]["duration_s"]
    rows = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [row["index"] for row in rows] == list(range(30))
    assert [p for row in rows for p in row_problems(row)] == []
    assert all(f"wrote {out / name}" in stderr for name in ("records.jsonl", "summary.json"))
    console = Console(record=True, width=200)
    print_summary(console, summary)
    assert "30 completed, 0 failed" in console.export_text()


def test_a_sweep_writes_a_sweep_directory(run_cli, tmp_path: Path) -> None:
    """``--sweep concurrency=...`` with ``--output-dir``: sweep.json in the sweep format, one
    ordinary run directory per point, each with the figures the command printed for it."""
    out = tmp_path / "sweep"
    code, stdout, stderr = run_cli(
        "sim", _scenario(tmp_path), "--json", "--sweep", "concurrency=1,3", "--jobs", "1",
        "--output-dir", out,
    )  # fmt: skip
    assert code == 0, stderr
    printed = json.loads(stdout)
    doc = json.loads((out / "sweep.json").read_text())
    assert (doc["schema"], doc["kind"], doc["rounds"], doc["axes"]) == (
        "speclens.sweep/1", "load", 1, {"concurrency": [1, 3]},
    )  # fmt: skip
    assert [(p["id"], p["dir"], p["status"]) for p in doc["points"]] == [
        ("c1-r0", "points/c1-r0", "ok"), ("c3-r0", "points/c3-r0", "ok"),
    ]  # fmt: skip
    assert [s["settings"]["concurrency"] for s in doc["stats"]] == [1, 3]
    for point, row, stats in zip(doc["points"], printed, doc["stats"], strict=True):
        summary = json.loads((out / point["dir"] / "summary.json").read_text())
        assert summary["settings"]["concurrency"] == point["settings"]["concurrency"]
        _assert_same_figures(row, summary["figures"])
        al = stats["figures"]["realized_al"]["mean"]
        assert al == pytest.approx(row["realized_acceptance_length"], abs=1e-12)
    assert (out / "sweep.csv").read_text().startswith("id,engine,concurrency")


def test_every_run_and_sweep_point_records_its_deployment(run_cli, tmp_path: Path) -> None:
    """A scenario naming b200 x 8 (one pool of TP 8): each run directory's settings state the
    chip, the precision, the parallelism and the GPUs under the names a published run uses,
    and its figures the deployment's total tokens/s and each per GPU, from the run's own
    token counts and makespan."""
    scenario = {**SCENARIO, "model": "deepseek-r1", "hardware": "b200", "precision": "fp8",
                "deployment": {"pools": [{"parallel": 8, "engine": {
                    "speculative": {"method": "mtp", "num_spec_tokens": 2}}}]}}  # fmt: skip
    path = tmp_path / "b200.yaml"
    path.write_text(yaml.safe_dump(scenario))
    out = tmp_path / "sweep"
    code, _, stderr = run_cli("sim", path, "--acceptance-length", "2.4", "--sweep",
                              "concurrency=2,6", "--jobs", "1", "--output-dir", out)  # fmt: skip
    assert code == 0, stderr
    code, _, stderr = run_cli("sim", path, "--acceptance-length", "2.4", "--output-dir",
                              tmp_path / "one")  # fmt: skip
    assert code == 0, stderr
    for run in (out / "points" / "c2-r0", out / "points" / "c6-r0", tmp_path / "one"):
        summary = json.loads((run / "summary.json").read_text())
        settings = summary["settings"]
        assert {k: settings[k] for k in ("hardware", "precision", "tensor_parallel",
                                         "expert_parallel", "dp_attention", "disaggregated",
                                         "gpus", "method", "num_spec_tokens")} == {
            "hardware": "b200", "precision": "fp8", "tensor_parallel": 8, "expert_parallel": 1,
            "dp_attention": False, "disaggregated": False, "gpus": 8, "method": "mtp",
            "num_spec_tokens": 2,
        }  # fmt: skip
        fig = summary["figures"]
        tokens = fig["throughput"]["total_output_tokens"] + fig["throughput"]["total_prompt_tokens"]
        total = fig["throughput"]["total_tokens_per_s"]
        assert total == pytest.approx(tokens / fig["duration_s"], rel=1e-12)
        assert fig["throughput"]["total_tokens_per_s_per_gpu"] == pytest.approx(total / 8)
        assert fig["throughput"]["output_tokens_per_s_per_gpu"] == pytest.approx(
            fig["throughput"]["output_tokens_per_s"] / 8
        )


def test_a_pool_without_speculation_records_no_method(run_cli, tmp_path: Path) -> None:
    """A scenario that does not speculate states no method (compare reads a run with a method
    as speculating), and pools of different parallelism state no one tensor parallelism."""
    scenario = {**SCENARIO, "deployment": {"pools": [{"parallel": 2}, {"parallel": 1}]}}
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump(scenario))
    code, _, stderr = run_cli("sim", path, "--output-dir", tmp_path / "run")
    assert code == 0, stderr
    settings = json.loads((tmp_path / "run" / "summary.json").read_text())["settings"]
    assert (settings["method"], settings["num_spec_tokens"]) == (None, None)
    assert (settings["tensor_parallel"], settings["gpus"], settings["hardware"]) == (None, 3, None)


def test_sim_against_a_published_run_compares_per_gpu(run_cli, tmp_path: Path) -> None:
    """A simulated b200 x 8 sweep against InferenceX's published b200 x 8 points: the
    deployment check reads both (not "unknown"), and the pair is a prediction whose total
    tokens/s per GPU is the simulated run's own total over its 8 GPUs."""
    from publishedkit import metrics, point, write_points

    pts = [point(hardware="b200", conc=c, spec_method="mtp", metrics=metrics(conc=c))
           for c in (2, 6)]  # fmt: skip
    published = tmp_path / "published"
    code, _, err = run_cli("import", "inferencex", write_points(tmp_path / "p.json", pts),
                           "--output-dir", published)  # fmt: skip
    assert code == 0, err
    (measured,) = published.iterdir()
    scenario = {**SCENARIO, "model": "deepseek-r1", "hardware": "b200", "precision": "fp8",
                "deployment": {"pools": [{"parallel": 8, "engine": {
                    "speculative": {"method": "mtp", "num_spec_tokens": 2}}}]}}  # fmt: skip
    path = tmp_path / "b200.yaml"
    path.write_text(yaml.safe_dump(scenario))
    predicted = tmp_path / "predicted"
    code, _, err = run_cli("sim", path, "--acceptance-length", "2.4", "--sweep",
                           "concurrency=2,6", "--jobs", "1", "--output-dir", predicted)  # fmt: skip
    assert code == 0, err
    code, out, err = run_cli("compare", measured, predicted, "--json")
    assert code == 0, err
    (pair,) = json.loads(out)["pairs"]
    checks = {c["name"]: c for c in pair["checks"]}
    assert checks["deployment"]["ok"] is True, checks["deployment"]
    assert checks["deployment"]["detail"].startswith("hardware b200, precision fp8, "
                                                     "tensor_parallel 8")  # fmt: skip
    assert checks["k"]["detail"] == "MTP K 2 in both"
    assert pair["verdict"] == "prediction"
    for row in pair["fidelity"]["points"]:
        summary = json.loads((predicted / "points" / f"c{row['concurrency']}-r0" /
                              "summary.json").read_text())  # fmt: skip
        fig = summary["figures"]
        total = (fig["throughput"]["total_output_tokens"]
                 + fig["throughput"]["total_prompt_tokens"]) / fig["duration_s"]  # fmt: skip
        got = row["figures"]["total_tokens_per_s_per_gpu"]
        assert got["predicted"] == pytest.approx(total / 8, rel=1e-9)
        assert got["measured"] == pytest.approx(2 * row["concurrency"] / (0.01 * 8))
    code, text, err = run_cli("compare", measured, predicted)
    assert code == 0, err
    assert "deployment: unknown" not in text and "total tok/s/GPU" in text


def test_every_run_and_sweep_point_records_how_far_to_trust_it(run_cli, tmp_path: Path) -> None:
    """Each run directory's summary.json states the run's expected error under
    ``provenance.trust`` (where a published replay's prediction states it too), the same
    statement ``--json`` gives."""
    from speclens.sim import trust

    scenario = {**SCENARIO, "model": "deepseek-r1", "hardware": "b200", "precision": "fp8",
                "deployment": {"pools": [{"parallel": 8, "engine": {
                    "speculative": {"method": "mtp", "num_spec_tokens": 2}}}]}}  # fmt: skip
    path = tmp_path / "b200.yaml"
    path.write_text(yaml.safe_dump(scenario))
    want = yaml.safe_load(trust.table_path().read_text())["chips"]["b200"]["uncalibrated"]
    out = tmp_path / "sweep"
    code, stdout, stderr = run_cli("sim", path, "--acceptance-length", "1.9", "--sweep",
                                   "concurrency=2,6", "--jobs", "1", "--output-dir", out,
                                   "--json")  # fmt: skip
    assert code == 0, stderr
    rows = json.loads(stdout)
    code, stdout, stderr = run_cli("sim", path, "--acceptance-length", "1.9", "--output-dir",
                                   tmp_path / "one", "--json")  # fmt: skip
    assert code == 0, stderr
    one = json.loads(stdout)
    for run, row in ((out / "points" / "c2-r0", rows[0]), (out / "points" / "c6-r0", rows[1]),
                     (tmp_path / "one", one)):  # fmt: skip
        summary = json.loads((run / "summary.json").read_text())
        assert summary["provenance"]["trust"] == row["trust"]
        assert summary["provenance"]["trust"]["expected_error"] == want
        assert "trust" not in summary["simulation"]  # stated once, in provenance
