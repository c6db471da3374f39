"""``speclens sweep`` with server axes, end to end (the end-to-end tier: five server start-ups,
each a fresh interpreter the sweep starts itself): a natural sweep over K written as the golden
curve, then that curve forced back at each K beside a server that cannot start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import launch

pytestmark = pytest.mark.integration
PY = sys.executable
#: Tiny runs: a point costs its requests and bench's report files.
LOAD = ["--model", "dummy", "--max-tokens", "16", "--ignore-eos", "--backend", "openai"]


def sweep(*args: str | Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return launch.run([PY, "-m", "speclens", "sweep", *map(str, args)], timeout=timeout)


def document(root: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((root / "sweep.json").read_text())
    return data


def _engine(name: str, command: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "command": command, "startup_timeout_s": 180, **extra}


@pytest.mark.slow
@pytest.mark.timeout(600)  # five server start-ups, each importing torch
def test_server_axes_golden_curve_then_forced_back_at_each_k(tmp_path: Path) -> None:
    """A natural n-gram sweep over K 2 and 4 (the dummy model, real drafting) writes the curve as
    a measured profile set; a second sweep forces that curve back in the sim executor through
    {forcing} (``profiles resolve --emit vllm``) and realizes each K's AL; a server whose
    command exits 1 fails its points with its log and the sweep goes on (exit 3)."""
    serve = f"{PY} -m speclens serve --port {{port}} --per-request-spec-decode-stats summary"
    natural = {
        "engines": [_engine("speclens", f"{serve} --method ngram --num-speculative-tokens {{k}}")],
        "axes": {"num_speculative_tokens": [2, 4], "concurrency": [2]},
    }
    (tmp_path / "natural.yaml").write_text(yaml.safe_dump(natural))
    registry = tmp_path / "registry"
    (registry / "acceptance").mkdir(parents=True)
    curve_path = registry / "acceptance" / "curve.yaml"
    first = sweep("--sweep-file", tmp_path / "natural.yaml", *LOAD, "--num-requests", "6",
                  "--output-dir", tmp_path / "natural", "--write-profile", curve_path)  # fmt: skip
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    curve = yaml.safe_load(curve_path.read_text())
    by_k = {p["num_spec_tokens"]: p for p in curve["profiles"]}
    assert sorted(by_k) == [2, 4]
    for k, profile in by_k.items():
        assert profile["method"] == "measured" and profile["speculative_method"] == "ngram"
        prov = profile["provenance"]
        assert prov["run"] == str(tmp_path / "natural") and prov["prompts"] == 6
        assert prov["engine_image"].startswith("speclens==") and prov["sampling"]["max_tokens"] == 16  # fmt: skip
        assert 1.0 < profile["acceptance_length"] <= k + 1
        log = tmp_path / "natural" / "points" / f"speclens-k{k}-c2-r0" / "server.log"
        assert log.is_file()

    forced = {
        "engines": [
            _engine("sim", f"{serve} --executor sim {{forcing}}", emit="vllm", method="ngram"),
            _engine(
                "broken", f"{PY} -c \"print('cannot start: boom'); raise SystemExit(1)\" {{port}}"
            ),
        ],
        "axes": {
            "num_speculative_tokens": [2, 4],
            "concurrency": [4],
            "acceptance_profile": {
                "model": "dummy",
                "method": "ngram",
                "thinking": "off",
                "category": "random",
            },
        },
    }
    (tmp_path / "forced.yaml").write_text(yaml.safe_dump(forced))
    out = tmp_path / "forced"
    second = sweep("--sweep-file", tmp_path / "forced.yaml", *LOAD, "--num-requests", "16",
                   "--registry", registry, "--output-dir", out)  # fmt: skip
    assert second.returncode == 3, second.stdout[-3000:] + second.stderr[-3000:]
    data = document(out)
    assert data["kind"] == "server" and data["axes"]["engine"] == ["sim", "broken"]
    points = {p["id"]: p for p in data["points"]}
    for k in (2, 4):
        point = points[f"sim-k{k}-al{by_k[k]['acceptance_length']:g}-c4-r0"]
        assert point["status"] == "ok", point
        summary = json.loads((out / point["dir"] / "summary.json").read_text())
        assert summary["server"]["acceptance"]["num_speculative_tokens"] == k
        (stats,) = [s for s in data["stats"] if s["engine"] == "sim" and s["settings"]["num_speculative_tokens"] == k]  # fmt: skip
        al = stats["figures"]["realized_al"]
        se = (al["high"] - al["low"]) / 3.92
        assert abs(al["mean"] - by_k[k]["acceptance_length"]) <= 4 * se + 1e-3, (k, al)
        broken = points[f"broken-k{k}-al{by_k[k]['acceptance_length']:g}-c4-r0"]
        assert broken["status"] == "failed" and broken["exit_code"] == 3
        assert "exited with code 1 before" in broken["error"] and "boom" in broken["error"]
        assert "boom" in (out / broken["dir"] / "server.log").read_text()
