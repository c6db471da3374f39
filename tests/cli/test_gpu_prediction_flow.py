"""What speculation buys on real GPUs, end to end on InferenceX's published runs (docs/calibrate.md's
"What will speculation buy on my GPUs?"): import them, calibrate on MTP-off points, infer the AL
of an MTP run from its lowest concurrency, predict that run at its other concurrencies, and
compare the prediction with the measurement.

The configuration is MI355X, SGLang, FP8, 1024 in / 1024 out, TP 8. The AL these runs reached
was never published (random prompts, real MTP), so the prediction answers to their TPOT alone.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import yaml

from publishedkit import INFERENCEX_DIR

pytestmark = pytest.mark.skipif(
    not (INFERENCEX_DIR / "benchmarks.json").is_file(),
    reason="InferenceX's published data (../shared/data/inferencex/) is not present",
)

OFF = "dsr1-mi355x-sglang-fp8-1024x1024-tp8-nomtp-2026-05-27"
MTP = "dsr1-mi355x-sglang-fp8-1024x1024-tp8-mtp-2026-05-21"


def test_mtp_predicted_from_mtp_off_points_on_mi355x(run_cli, tmp_path: Path) -> None:
    published = tmp_path / "published"
    where = ["hardware=mi355x", "framework=sglang", "precision=fp8", "isl=1024", "osl=1024",
             "decode_tp=8"]  # fmt: skip
    code, out, err = run_cli(
        "import", "inferencex", INFERENCEX_DIR / "benchmarks.json",
        INFERENCEX_DIR / "benchmarks-history.json", "--output-dir", published,
        *[arg for w in where for arg in ("--where", w)],
    )  # fmt: skip
    assert code == 0, err
    off = published / OFF
    assert sorted(p.name for p in (off / "points").iterdir()) == ["c16", "c4", "c64", "c8"]

    cost = tmp_path / "cost.yaml"
    code, out, err = run_cli("calibrate", off, "-o", cost, "--acceptance-from",
                             published / MTP / "points" / "c4", "--method", "mtp", "-k", "3")  # fmt: skip
    assert code == 0, err
    fitted = yaml.safe_load(cost.read_text())
    al = fitted["acceptance"]["acceptance_length"]
    assert 1.0 <= fitted["acceptance"]["range"][0] <= al <= fitted["acceptance"]["range"][1] <= 4
    assert fitted["roofline"]["model"]["name"] == "deepseek-r1"
    assert fitted["roofline"]["chip"]["name"] == "mi355x"

    predicted = tmp_path / "predicted"
    code, out, err = run_cli("sim", "--trace", published / MTP, "--step-cost", cost, "--method",
                             "mtp", "--num-speculative-tokens", "3", "--acceptance-length",
                             f"{al:.4f}", "--output-dir", predicted)  # fmt: skip
    assert code == 0, err

    errors = []
    for c in (16, 32, 64):
        measured = json.loads((published / MTP / "points" / f"c{c}" / "summary.json").read_text())
        guess = json.loads((predicted / "points" / f"c{c}" / "summary.json").read_text())
        assert guess["settings"]["executor"] == "sim" and guess["settings"]["concurrency"] == c
        tpot = guess["figures"]["latency_ms"]["tpot"]["p50"]
        errors.append(abs(tpot / measured["figures"]["latency_ms"]["tpot"]["p50"] - 1))
    assert statistics.median(errors) <= 0.15, errors

    code, out, err = run_cli("compare", published / MTP, predicted, "--json")
    assert code == 0, err
    fidelity = json.loads(out)["pairs"][0]["fidelity"]
    assert fidelity["kind"] == "aggregate"
