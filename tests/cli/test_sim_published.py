"""``speclens sim --trace`` on published points: each point's load replayed on a calibrated
roofline, written as published points of the same shape; and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from aggregatekit import summary, write_point, write_sweep
from speclens.sim import catalog
from speclens.sim.calibrate import KIND, _RooflineFile
from speclens.sim.closed_loop import Load, schedule
from speclens.sim.roofline import Efficiency, Roofline

ROOF = Roofline(catalog.model("deepseek-r1"), catalog.chip("mi355x"), 8,
                efficiency=Efficiency(compute=0.2, memory=0.9, overhead=6e-3, per_sequence=0.0,
                                      per_token=2e-5))  # fmt: skip


def _cost(path: Path, hardware: str = "mi355x", linear: bool = False) -> Path:
    priced = ({"step_cost": {"base": 0.01}} if linear else
              {"roofline": _RooflineFile.of(ROOF).model_dump(exclude_none=True)})  # fmt: skip
    document = {"kind": KIND, **priced, "fit": {"front_latency_s": 0.05},
                "provenance": {"hardware": hardware}}  # fmt: skip
    path.write_text(yaml.safe_dump(document))
    return path


def _sweep(root: Path) -> Path:
    return write_sweep(root, [summary(concurrency=c, method="mtp", k=3) for c in (4, 16)])


def test_each_point_is_replayed_at_the_given_acceptance(run_cli, tmp_path: Path) -> None:
    out = tmp_path / "pred"
    code, _, err = run_cli("sim", "--trace", _sweep(tmp_path / "mtp"), "--step-cost",
                                _cost(tmp_path / "c.yaml"), "--method", "mtp",
                                "--num-speculative-tokens", "3", "--acceptance-length", "2.5",
                                "--output-dir", out)  # fmt: skip
    assert code == 0, err
    for c in (4, 16):
        got = json.loads((out / "points" / f"c{c}" / "summary.json").read_text())
        assert got["aggregate_only"] is True and got["settings"]["executor"] == "sim"
        assert got["settings"]["method"] == "mtp" and got["settings"]["num_spec_tokens"] == 3
        assert got["figures"]["acceptance"] == {"acceptance_length": 2.5, "num_spec_tokens": 3}
        fp8 = catalog.with_precision(ROOF.model, "fp8")  # the points' precision
        want = schedule(Load(c, 1024, 1024, 3, 2.5)).figures(
            Roofline(fp8, ROOF.chip, 8, "mtp", efficiency=ROOF.efficiency), 0.05, 8
        )
        assert got["figures"]["latency_ms"]["tpot"]["p50"] == pytest.approx(
            want.median_tpot_s * 1e3, rel=1e-9)  # fmt: skip
    assert (out / "sweep.json").is_file()


def test_without_speculation_the_points_are_replayed_plain(run_cli, tmp_path: Path) -> None:
    run = write_point(tmp_path / "c4", summary(concurrency=4))
    code, stdout, err = run_cli("sim", "--trace", run, "--step-cost", _cost(tmp_path / "c.yaml"),
                                "--json")  # fmt: skip
    assert code == 0, err
    result = json.loads(stdout)
    fp8 = Roofline(catalog.with_precision(ROOF.model, "fp8"), ROOF.chip, 8,
                   efficiency=ROOF.efficiency)  # fmt: skip
    want = schedule(Load(4, 1024, 1024)).figures(fp8, 0.05, 8)
    assert result["points"][0]["tpot_ms"]["predicted"] == pytest.approx(
        want.median_tpot_s * 1e3, rel=1e-9)  # fmt: skip
    assert result["points"][0]["tpot_ms"]["trace"] == 10.0


@pytest.mark.parametrize(
    "flags, code, message",
    [(["--method", "mtp", "--acceptance-length", "2"], 2, "--method: goes with"),
     (["--num-speculative-tokens", "3"], 2, "go with --method"),
     (["--method", "mtp", "--num-speculative-tokens", "3", "--acceptance-length", "4.5"], 2,
      "--acceptance-length"),
     ([], 2, "roofline: published points are replayed on a roofline")],
)  # fmt: skip
def test_usage_errors(run_cli, tmp_path: Path, flags: list[str], code: int, message: str) -> None:
    linear = not flags
    cost = _cost(tmp_path / "c.yaml", linear=linear)
    got, _, err = run_cli("sim", "--trace", _sweep(tmp_path / "s"), "--step-cost", cost, *flags,
                          "--output-dir", tmp_path / "out")  # fmt: skip
    assert got == code and message in err
    assert not (tmp_path / "out").exists()


def test_a_cost_fitted_on_another_chip_is_refused(run_cli, tmp_path: Path) -> None:
    code, _, err = run_cli("sim", "--trace", _sweep(tmp_path / "s"), "--step-cost",
                           _cost(tmp_path / "c.yaml", hardware="h200"), "--output-dir",
                           tmp_path / "out")  # fmt: skip
    assert code == 1 and "fitted on 'h200'" in err and "ran on 'mi355x'" in err
    assert not (tmp_path / "out").exists()


def test_a_published_trace_needs_a_step_cost(run_cli, tmp_path: Path) -> None:
    code, _, err = run_cli("sim", "--trace", _sweep(tmp_path / "s"))
    assert code == 2 and "needs --step-cost" in err
