"""Predictions from published points (``sim --trace PUBLISHED``, ``calibrate --acceptance-from``)
on files that must be refused: one line naming the file and the field, exit 1 (data) or 2
(usage), no traceback, nothing written. The bounds are docs/bounds.md's: no step over a year,
no replay whose span is 0 s, not finite or past a year."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from aggregatekit import summary, write_point, write_sweep
from toyrooflinekit import CHIP, cost_file, toy_point


def _refused(run_cli: Any, tmp_path: Path, *args: str | Path, code: int = 1) -> str:
    out = tmp_path / "out"
    got, stdout, err = run_cli(*args, "--output-dir", out)
    assert got == code, stdout + err
    assert "Traceback" not in stdout + err
    assert not out.exists()
    assert err.count("\n") == 1, err
    return " ".join(err.split())


@pytest.mark.parametrize(
    "chip, efficiency",
    [({"memory_bandwidth_tbps": 1e-300}, {}),  # the issue's: TPOT 1.2e301 ms was written
     ({"memory_bandwidth_tbps": 1e-320}, {}),  # a step of infinite seconds
     ({}, {"memory": 1e-300})],
)  # fmt: skip
def test_a_step_over_a_year_is_refused_before_the_replay(
    run_cli, tmp_path: Path, chip: dict[str, Any], efficiency: dict[str, Any]
) -> None:  # fmt: skip
    cost = cost_file(tmp_path / "c.yaml", chip={**CHIP, **chip})
    if efficiency:
        document = yaml.safe_load(cost.read_text())
        document["roofline"]["efficiency"].update(efficiency)
        cost.write_text(yaml.safe_dump(document))
    trace = write_sweep(tmp_path / "s", [toy_point(c) for c in (1, 4)])
    err = _refused(run_cli, tmp_path, "sim", "--trace", trace, "--step-cost", cost)
    assert f"{cost}: roofline: prices a step at" in err
    assert "expected prices in seconds" in err


def test_a_replay_past_a_year_is_refused(run_cli, tmp_path: Path) -> None:
    """Each step under a year (about 0.26 years: 8.0e6 s), but 1,023-token outputs take
    thousands of them: the replay's span is refused, never written as a prediction."""
    slow = {**CHIP, "memory_bandwidth_tbps": 1.6e-11}
    cost = cost_file(tmp_path / "c.yaml", chip=slow)
    run = write_point(tmp_path / "c1", toy_point(1, osl=1024))
    err = _refused(run_cli, tmp_path, "sim", "--trace", run, "--step-cost", cost)
    assert f"{cost}: roofline: the replay of {run} ran" in err
    assert "at most a year" in err


def test_a_replay_of_no_time_is_refused(run_cli, tmp_path: Path) -> None:
    """A chip so fast every price underflows to 0 s, no overhead, no front latency: no
    throughput is worked out of a span of 0 s."""
    fast = {**CHIP, "tflops": {"bf16": 1e308, "fp8": 1e308, "fp4": 1e308},
            "memory_bandwidth_tbps": 1e308, "interconnect_gbps": 1e308}  # fmt: skip
    cost = cost_file(tmp_path / "c.yaml", chip=fast, fit={"front_latency_s": 0.0})
    document = yaml.safe_load(cost.read_text())
    document["roofline"]["efficiency"].update(overhead=0.0, per_token=0.0)
    cost.write_text(yaml.safe_dump(document))
    err = _refused(run_cli, tmp_path, "sim", "--trace", write_point(tmp_path / "c1", toy_point(1)),
                   "--step-cost", cost)  # fmt: skip
    assert f"{cost}: roofline: the replay of" in err and "ran 0 s of virtual time" in err


@pytest.mark.parametrize(
    "key, value, message",
    [("tensor_parallel", "8", "settings.tensor_parallel: expected an integer from 1 to 1024, "
                              "got '8'"),
     ("tensor_parallel", 0, "settings.tensor_parallel: expected an integer from 1 to 1024"),
     ("expert_parallel", 4, "settings.expert_parallel: expected 1..1 (parallel), got 4"),
     ("dp_attention", "yes", "settings.dp_attention: expected true or false, got 'yes'")],
)  # fmt: skip
def test_a_points_bad_deployment_is_named(run_cli, tmp_path: Path, key: str, value: Any,
                                          message: str) -> None:  # fmt: skip
    data = toy_point(1)
    data["settings"][key] = value
    run = write_point(tmp_path / "c1", data)
    err = _refused(run_cli, tmp_path, "sim", "--trace", run, "--step-cost",
                   cost_file(tmp_path / "c.yaml"))  # fmt: skip
    assert f"{run / 'summary.json'}: {message}" in err


@pytest.mark.parametrize(
    "fit, field",
    [([1, 2], "fit: expected a mapping"),
     ({"batch_widths": ["a", "b"]}, "fit.batch_widths: expected [low, high] requests"),
     ({"batch_widths": [64, 4]}, "fit.batch_widths: expected [low, high] requests"),
     ({"misfit": 5}, "fit.misfit: expected text or null, got 5")],
)  # fmt: skip
def test_a_bad_fit_block_is_named(run_cli, tmp_path: Path, fit: Any, field: str) -> None:
    cost = cost_file(tmp_path / "c.yaml")
    document = yaml.safe_load(cost.read_text())
    document["fit"] = fit
    cost.write_text(yaml.safe_dump(document))
    err = _refused(run_cli, tmp_path, "sim", "--trace", write_point(tmp_path / "c1", toy_point(1)),
                   "--step-cost", cost)  # fmt: skip
    assert f"{cost}: {field}" in err


# --- calibrate --acceptance-from: the run is checked before any fit ---------------------------


def _points(root: Path) -> Path:
    for c in (4, 16, 64):
        write_point(root / "points" / f"c{c}", summary(concurrency=c, tpot_p50=10.0 + c / 4))
    return root


@pytest.mark.parametrize(
    "change, message",
    [({"method": 5}, "settings.method: expected a method name or null, got 5"),
     ({"method": "none"}, "settings.method: is 'none': the run did not speculate"),
     ({"num_spec_tokens": "3"}, "settings.num_spec_tokens: expected an integer from 1 to 64 or "
                                "null, got '3'"),
     ({"num_spec_tokens": 1000}, "settings.num_spec_tokens: expected an integer from 1 to 64"),
     ({"disaggregated": True}, "settings.disaggregated: True, but the fit's points ran False")],
)  # fmt: skip
def test_a_bad_speculating_run_is_named(run_cli, tmp_path: Path, change: dict[str, Any],
                                        message: str) -> None:  # fmt: skip
    data = summary(concurrency=4, tpot_p50=6.0, method="mtp", k=3)
    data["settings"].update(change)
    run = write_point(tmp_path / "mtp", data)
    out = tmp_path / "cost.yaml"
    code, stdout, err = run_cli("calibrate", _points(tmp_path / "off"), "-o", out,
                                "--acceptance-from", run)  # fmt: skip
    assert code == 1, stdout + err
    assert "Traceback" not in stdout + err and not out.exists()
    assert err.count("\n") == 1, err
    assert f"{run / 'summary.json'}: {message}" in " ".join(err.split())


def test_a_run_directory_of_garbage_is_named(run_cli, tmp_path: Path) -> None:
    run = write_point(tmp_path / "mtp", {}, raw=b"{not json")
    out = tmp_path / "cost.yaml"
    code, stdout, err = run_cli("calibrate", _points(tmp_path / "off"), "-o", out,
                                "--acceptance-from", run)  # fmt: skip
    assert code == 1 and "Traceback" not in stdout + err and not out.exists()
    assert str(run / "summary.json") in err
