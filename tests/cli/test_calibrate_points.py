"""``speclens calibrate POINTS --acceptance-from RUN``: the roofline fitted on published points
at their own deployment (TP, EP, DP attention), and the AL a speculating run of that deployment
implies; a run of another deployment, or one that did not speculate, is refused before the fit.

The points are made by the simulator from a roofline of known parameters, as an engine of that
deployment would have published them (``tests/sim/test_fit_points.py`` does the same for the
fit itself); the fit starts from the chip's defaults and must find them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from speclens.sim import catalog
from speclens.sim.closed_loop import Load, schedule
from speclens.sim.roofline import Efficiency, Roofline

TRUTH = Efficiency(compute=0.3, memory=0.6, overhead=4e-3, per_sequence=0.0, per_token=3e-5)
FRONT = 0.08


def _settings(c: int, **changes: Any) -> dict[str, Any]:
    base = {"model": "deepseek-v3", "hardware": "h200", "engine": "sglang", "precision": "fp8",
            "tensor_parallel": 8, "expert_parallel": 8, "dp_attention": False, "gpus": 8,
            "disaggregated": False, "input_tokens": {"min": 1024, "max": 1024},
            "output_tokens": {"min": 256, "max": 256}, "concurrency": c, "method": None,
            "num_spec_tokens": None, "date": "2026-05-27"}  # fmt: skip
    return {**base, **changes}


def _point(path: Path, settings: dict[str, Any], k: int = 0, al: float = 1.0) -> Path:
    """An aggregate-only run whose figures a roofline of ``settings``' deployment predicts."""
    model = catalog.with_precision(catalog.model("deepseek-v3"), "fp8")
    roof = Roofline(model, catalog.chip("h200"), settings["tensor_parallel"], "mtp" if k else None,
                    efficiency=TRUTH,
                    expert_parallel=settings["expert_parallel"],
                    dp_attention=settings["dp_attention"])  # fmt: skip
    load = Load(settings["concurrency"], 1024, 256, k, al)
    figures = schedule(load).figures(roof, FRONT, settings["gpus"]).summary_figures()
    path.mkdir(parents=True)
    (path / "summary.json").write_text(
        json.dumps({"aggregate_only": True, "settings": settings, "figures": figures})
    )
    return path


def _sweep(root: Path, **changes: Any) -> Path:
    for c in (2, 4, 16, 64):
        _point(root / "points" / f"c{c}", _settings(c, **changes))
    return root


def _mtp(path: Path, al: float = 2.6, **changes: Any) -> Path:
    return _point(path, _settings(4, method="mtp", num_spec_tokens=3, **changes), k=3, al=al)


def test_the_fit_keeps_the_points_expert_parallelism(run_cli, tmp_path: Path) -> None:
    """Points of TP 8 with the experts spread over 8 ranks (EP 8): the cost file's roofline is
    that deployment's (what sim then replays), and the AL the MTP run implies on it is the one
    that made it."""
    out = tmp_path / "cost.yaml"
    code, stdout, err = run_cli("calibrate", _sweep(tmp_path / "off"), "-o", out,
                                "--acceptance-from", _mtp(tmp_path / "mtp"))  # fmt: skip
    assert code == 0, err
    assert "roofline of deepseek-v3 on 8 x h200 (TP 8, EP 8), fitted to 4" in " ".join(
        stdout.split()
    )
    written = yaml.safe_load(out.read_text())
    assert written["roofline"]["parallel"] == 8
    assert written["roofline"]["expert_parallel"] == 8
    assert written["roofline"].get("dp_attention", False) is False
    assert written["fit"]["tpot_error_median"] < 0.02
    found = written["acceptance"]
    assert found["method"] == "mtp" and found["num_spec_tokens"] == 3
    assert found["acceptance_length"] == pytest.approx(2.6, abs=0.08)


def _refused(run_cli: Any, tmp_path: Path, off: Path, run: Path, *flags: str) -> str:
    out = tmp_path / "cost.yaml"
    code, stdout, err = run_cli("calibrate", off, "-o", out, "--acceptance-from", run, *flags)
    assert code == 1, stdout + err
    assert not out.exists()
    assert "Traceback" not in stdout + err
    return " ".join(err.split())


@pytest.mark.parametrize("change", [{"expert_parallel": 1}, {"dp_attention": True}])
def test_a_run_of_another_layout_is_priced_at_its_own(run_cli, tmp_path: Path,
                                                      change: dict[str, Any]) -> None:  # fmt: skip
    """One fit prices every layout of its chip and engine: an MTP run at another EP or with DP
    attention implies the AL that made it at its own layout (at the fit's, it would not)."""
    out = tmp_path / "cost.yaml"
    code, _, err = run_cli("calibrate", _sweep(tmp_path / "off"), "-o", out, "--acceptance-from",
                           _mtp(tmp_path / "mtp", **change))  # fmt: skip
    assert code == 0, err
    found = yaml.safe_load(out.read_text())["acceptance"]
    assert found["acceptance_length"] == pytest.approx(2.6, abs=0.08)


@pytest.mark.parametrize(
    "change, shown",
    [({"hardware": "b200"}, "settings.hardware: 'b200', but the fit's points ran 'h200'"),
     ({"disaggregated": True}, "settings.disaggregated: True, but the fit's points ran False"),
     ({"precision": "fp4"}, "settings.precision: 'fp4', but the fit's points ran 'fp8'")],
)  # fmt: skip
def test_a_run_of_another_deployment_is_refused(run_cli, tmp_path: Path, change: dict[str, Any],
                                                shown: str) -> None:  # fmt: skip
    off = _sweep(tmp_path / "off")
    run = _mtp(tmp_path / "mtp", **change)
    err = _refused(run_cli, tmp_path, off, run)
    assert f"{run / 'summary.json'}: {shown}" in err
    assert "the AL is inferred on the deployment the fit priced" in err


def test_a_run_that_did_not_speculate_is_refused(run_cli, tmp_path: Path) -> None:
    """A run whose settings say no speculation: its TPOT is no AL's, whatever --method says."""
    off = _sweep(tmp_path / "off")
    run = _point(tmp_path / "plain", _settings(4))
    err = _refused(run_cli, tmp_path, off, run, "--method", "mtp", "-k", "3")
    assert f"{run / 'summary.json'}: settings.method: is None: the run did not speculate" in err


@pytest.mark.parametrize(
    "flags, shown",
    [(["--method", "eagle3"], "settings.method: is 'mtp', but --method says 'eagle3'"),
     (["-k", "2"], "settings.num_spec_tokens: is 3, but -k says 2")],
)  # fmt: skip
def test_flags_that_contradict_the_run_are_refused(run_cli, tmp_path: Path, flags: list[str],
                                                   shown: str) -> None:  # fmt: skip
    run = _mtp(tmp_path / "mtp")
    err = _refused(run_cli, tmp_path, _sweep(tmp_path / "off"), run, *flags)
    assert f"{run / 'summary.json'}: {shown}" in err


def test_a_run_that_states_no_k_takes_the_flags(run_cli, tmp_path: Path) -> None:
    run = _mtp(tmp_path / "mtp")
    data = json.loads((run / "summary.json").read_text())
    data["settings"]["num_spec_tokens"] = None
    (run / "summary.json").write_text(json.dumps(data))
    out = tmp_path / "cost.yaml"
    code, _, err = run_cli("calibrate", _sweep(tmp_path / "off"), "-o", out, "--acceptance-from",
                           run)  # fmt: skip
    assert code == 2 and "--num-speculative-tokens: the run's K" in err and not out.exists()
    code, _, err = run_cli("calibrate", _sweep(tmp_path / "off2"), "-o", out,
                           "--acceptance-from", run, "-k", "3")  # fmt: skip
    assert code == 0, err
    assert yaml.safe_load(out.read_text())["acceptance"]["num_spec_tokens"] == 3
