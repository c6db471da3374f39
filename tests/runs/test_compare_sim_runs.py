"""Simulated run directories are comparable: with each other when their workloads match (one
workload on two chips), as a prediction against a measurement, and a run written before a
setting existed is named as such, a fresh one never."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from speclens.runs import compare as cmp
from speclens.runs.compare_deltas import PER_GPU
from speclens.runs.compare_inputs import labels_for, read_inputs

SCENARIO = """model: kimi-k3
hardware: {hardware}
deployment:
  pools:
    - role: mixed
      parallel: {parallel}
      engine:
        speculative: {{method: dspark, num_spec_tokens: 7}}
        max_num_seqs: 64
workload:
  category: coding
  thinking: "on"
  input_tokens: {{min: 64, max: 256}}
  output_tokens: {{min: 32, max: {output}}}
  concurrency: 4
  requests: 24
"""


def _sim(
    run_cli: Any, root: Path, name: str, hardware: str, parallel: int, output: int = 64
) -> Path:
    scenario = root / f"{name}.yaml"
    scenario.write_text(SCENARIO.format(hardware=hardware, parallel=parallel, output=output))
    out = root / name
    code, stdout, stderr = run_cli(
        "sim", scenario, "--sweep", "concurrency=4,8", "--output-dir", out
    )
    assert code == 0, stdout + stderr
    return out


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from typer.testing import CliRunner

    from speclens.cli import app

    root = tmp_path_factory.mktemp("sims")
    runner = CliRunner()

    def run_cli(*args: Any) -> tuple[int, str, str]:
        result = runner.invoke(app, [str(a) for a in args])
        return result.exit_code, result.stdout, result.stderr

    return {
        "b300": _sim(run_cli, root, "b300", "b300", 8),
        "h200": _sim(run_cli, root, "h200", "h200", 16),
        "longer": _sim(run_cli, root, "longer", "b300", 8, output=128),
    }


def _pair(*paths: Path) -> dict[str, Any]:
    inputs = read_inputs(list(paths), labels_for(len(paths), []), [None] * len(paths))
    out = cmp.compare(inputs, metric="output")
    return {"inputs": out["inputs"], **out["pairs"][0]}


def _check(pair: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pair["checks"] if c["name"] == name)


def _point(sweep: Path, concurrency: int) -> Path:
    return sweep / "points" / f"c{concurrency}-r0"


def test_one_workload_on_two_chips_is_comparable_per_gpu(sweeps: dict[str, Path]) -> None:
    """Was: "not comparable: prompts (unknown: A records no settings.prompts_sha256 (runs
    before speclens bench recorded it))", each side "1 GPU", sampling "stream true"."""
    pair = _pair(sweeps["b300"], sweeps["h200"])
    assert pair["verdict"] == "comparable", pair["label"]
    assert [i["gpus"] for i in pair["inputs"]] == [8, 16]
    assert "simulated" in _check(pair, "sampling")["detail"]
    assert "stream" not in _check(pair, "sampling")["detail"]
    rows = pair["deltas"]["matched_concurrency"]
    assert {r["concurrency"] for r in rows} == {4, 8}
    for c in (4, 8):
        total = next(
            r for r in rows if r["concurrency"] == c and r["figure"] == "output_tokens_per_s"
        )
        per_gpu = next(r for r in rows if r["concurrency"] == c and r["figure"] == PER_GPU)
        assert per_gpu["ratio"] == pytest.approx(total["ratio"] * 8 / 16, rel=1e-9)
        assert per_gpu["a"]["mean"] == pytest.approx(total["a"]["mean"] / 8)


def test_the_workload_digest_leaves_out_the_chip_and_the_load(sweeps: dict[str, Path]) -> None:
    settings = [
        json.loads((_point(sweeps[name], c) / "summary.json").read_text())["settings"]
        for name in ("b300", "h200") for c in (4, 8)
    ]  # fmt: skip
    assert len({s["prompts_sha256"] for s in settings}) == 1
    assert {(s["gpus"], s["hardware"]) for s in settings} == {(8, "b300"), (16, "h200")}
    first = settings[0]
    assert first["sampling"] == "simulated" and first["stream"] is None
    assert first["num_spec_tokens"] == 7
    assert first["acceptance_profile"] and first["acceptance_source"]
    assert first["settings_schema"] == "speclens.settings/2"


def test_another_workload_is_not_comparable(sweeps: dict[str, Path]) -> None:
    pair = _pair(sweeps["b300"], sweeps["longer"])
    assert pair["verdict"] == "not comparable"
    prompts = _check(pair, "prompts")
    assert prompts["ok"] is False and prompts["detail"].startswith("different datasets")
    assert "before" not in pair["label"]


def _as_bench(run: Path, to: Path) -> Path:
    """The run as bench would have written it of the same requests: a measurement (no executor,
    streamed over the completions endpoint, natural acceptance)."""
    shutil.copytree(run, to)
    path = to / "summary.json"
    summary = json.loads(path.read_text())
    settings = summary["settings"]
    settings.update(executor=None, sampling=None, stream=True, endpoint="completions",
                    gpus=None, acceptance_source=None, acceptance_profile=None)  # fmt: skip
    summary["server"] = {"engine": "vllm", "acceptance": None}
    path.write_text(json.dumps(summary))
    return to


def test_a_simulation_against_a_bench_run_is_a_prediction(
    sweeps: dict[str, Path], tmp_path: Path
) -> None:
    sim = _point(sweeps["b300"], 4)
    bench = _as_bench(sim, tmp_path / "bench")
    pair = _pair(bench, sim)
    assert pair["verdict"] == "prediction", pair["label"]
    assert pair["comparable"] is True
    assert pair["label"] == "comparable as a prediction against a measurement: B predicts A"
    assert _check(pair, "sampling")["ok"] is True
    assert _check(pair, "acceptance")["ok"] is True
    assert pair["fidelity"]["matched"] == 24


def _strip(run: Path, to: Path, *names: str) -> Path:
    shutil.copytree(run, to)
    path = to / "summary.json"
    summary = json.loads(path.read_text())
    for name in names:
        summary["settings"].pop(name, None)
    path.write_text(json.dumps(summary))
    return to


def test_an_old_run_is_named_old_and_a_fresh_one_never(
    sweeps: dict[str, Path], tmp_path: Path
) -> None:
    run = _point(sweeps["b300"], 4)
    fresh = _pair(run, _point(sweeps["h200"], 4))
    assert "before" not in json.dumps(fresh)
    old = _strip(run, tmp_path / "old", "prompts_sha256", "settings_schema")
    detail = _check(_pair(old, run), "prompts")["detail"]
    assert (
        detail
        == "unknown: A records no settings.prompts_sha256: a run written before speclens sim recorded it"
    )
    bench_old = _strip(_as_bench(run, tmp_path / "b"), tmp_path / "bench_old",
                       "prompts_sha256", "settings_schema")  # fmt: skip
    assert (
        "written before speclens bench recorded it"
        in _check(_pair(bench_old, run), "prompts")["detail"]
    )
    new = _strip(run, tmp_path / "new", "prompts_sha256")  # the marker stays: a fresh run
    detail = _check(_pair(new, run), "prompts")["detail"]
    assert "before" not in detail and "leave the digest null" in detail
