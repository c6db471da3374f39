"""``speclens calibrate --acceptance-from RUN --write-profile FILE``: the AL the run's TPOT
implies, the AL at K 1..8 through it (``speclens.acceptance.curve``) printed and in ``--json``,
written as a profile set of method ``inferred`` that ``sim --registry`` resolves at each K; a
K x concurrency sweep then names a best K and says the AL at each K was inferred, and from what.

On InferenceX's MI355X SGLang FP8 1024 x 1024 TP 8 runs (docs/calibrate.md's example): calibrate
on the MTP-off run, infer from the MTP run's c4 point, sweep K on a deepseek-r1 / mi355x
scenario priced by the fitted roofline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from curvekit import off_points, point
from publishedkit import INFERENCEX_DIR
from speclens.acceptance import (
    AcceptanceProfileSet,
    Registry,
    WorkloadAcceptance,
    curve,
    load,
    resolve,
)
from speclens.sim.decide import decide

OFF = "dsr1-mi355x-sglang-fp8-1024x1024-tp8-nomtp-2026-05-27"
MTP = "dsr1-mi355x-sglang-fp8-1024x1024-tp8-mtp-2026-05-21"
TARGET = 50.0

needs_data = pytest.mark.skipif(
    not (INFERENCEX_DIR / "benchmarks.json").is_file(),
    reason="InferenceX's published data (../shared/data/inferencex/) is not present",
)


def _scenario(path: Path, cost: Path) -> Path:
    """deepseek-r1 on 8 x mi355x with MTP, priced by the calibrated roofline; the workload's
    thinking mode and category are the profiles' (the run's random prompts)."""
    path.write_text(yaml.safe_dump({
        "model": "deepseek-r1", "hardware": "mi355x",
        "deployment": {"pools": [{"role": "mixed", "parallel": 8, "step_cost_file": cost.name,
                                  "engine": {"speculative": {"method": "mtp", "num_spec_tokens": 3},
                                             "max_num_seqs": 256}}]},
        "workload": {"category": "random", "thinking": "on", "input_tokens": 1024,
                     "output_tokens": 128, "concurrency": 16, "requests": 160},
    }))  # fmt: skip
    return path


@needs_data
def test_a_curve_inferred_on_mi355x_names_a_best_k_at_50_tok_s_user(
    run_cli, tmp_path: Path
) -> None:
    published = tmp_path / "published"
    where = ["hardware=mi355x", "framework=sglang", "precision=fp8", "isl=1024", "osl=1024",
             "decode_tp=8"]  # fmt: skip
    code, _, err = run_cli("import", "inferencex", INFERENCEX_DIR / "benchmarks.json",
                           INFERENCEX_DIR / "benchmarks-history.json", "--output-dir", published,
                           *[arg for w in where for arg in ("--where", w)])  # fmt: skip
    assert code == 0, err

    cost, profiles = tmp_path / "mi355x.yaml", tmp_path / "reg" / "acceptance" / "dsr1-mtp.yaml"
    run = published / MTP / "points" / "c4"
    code, out, err = run_cli("calibrate", published / OFF, "-o", cost, "--acceptance-from", run,
                             "--write-profile", profiles, "--thinking", "on", "--json")  # fmt: skip
    assert code == 0, err
    written = yaml.safe_load(cost.read_text())
    found = written["acceptance"]
    assert json.loads(out)["acceptance"] == found  # --json prints what the file holds
    al, k = found["acceptance_length"], found["num_spec_tokens"]
    assert k == 3 and found["curve"]["decay"] == curve.shipped().decay
    points = found["curve"]["points"]
    assert [p["num_spec_tokens"] for p in points] == list(curve.CURVE_KS)
    assert points[k - 1]["acceptance_length"] == round(al, 4)
    assert points[k - 1]["range"] == [round(x, 4) for x in found["range"]]
    values = [p["acceptance_length"] for p in points]
    assert values == sorted(values) and all(
        1 <= p["range"][0] <= p["acceptance_length"] <= p["range"][1] <= p["num_spec_tokens"] + 1
        for p in points
    )
    # the terminal (stderr with --json) prints the curve under the Ks
    lines = err.splitlines()
    assert any(line.startswith("AL curve (inferred): through AL") for line in lines)
    row = next(line for line in lines if line.startswith("  AL "))
    assert row.split()[1:] == [f"{v:.2f}" for v in values]

    profile_set = load(AcceptanceProfileSet, profiles)
    assert profile_set.name == "dsr1-mtp" and "&id" not in profiles.read_text()  # no aliases
    assert [(p.model, p.speculative_method, p.num_spec_tokens, p.thinking, p.category, p.method)
            for p in profile_set.profiles] == [
        ("deepseek-r1", "mtp", t, "on", "random", "inferred") for t in curve.CURVE_KS
    ]  # fmt: skip
    assert [p.acceptance_length for p in profile_set.profiles] == values
    source = profile_set.profiles[0].provenance.source  # type: ignore[union-attr]
    assert f"--acceptance-from {run}" in source and curve.TRAINING_SET in source

    scenario = _scenario(tmp_path / "scenario.yaml", cost)
    code, out, err = run_cli("sim", scenario, "--registry", tmp_path / "reg",
                             "--sweep", "num_spec_tokens=1,2,4,8", "--sweep", "concurrency=16,64",
                             "--at-interactivity", f"{TARGET:g}", "--json")  # fmt: skip
    assert code == 0, err
    decision = json.loads(out)["decision"]
    assert decision["best"] in (1, 2, 4, 8), decision["headline"]
    assert [e["acceptance_length"] for e in decision["ks"]] == [values[t - 1] for t in (1, 2, 4, 8)]
    assert decision["headline"].startswith(
        f"at {TARGET:g} tok/s/user, K {decision['best']} delivers"
    )
    assert decision["headline"].endswith(f"; the AL at each K was inferred, from {source}")
    # how far to trust it: the calibrated fit's held-out error, each K's figure banded by it
    said = decision["trust"]
    assert said["line"].startswith("expected error") and "calibrated on published points" in (
        said["line"] + " " + str(said.get("basis"))
    ), said
    assert all(e["expected_low"] < e["tok_s_gpu"] < e["expected_high"]
               for e in decision["ks"] if e["tok_s_gpu"])  # fmt: skip


def _entry(k: int, method: str | None, source: str | None) -> tuple[int, dict[str, Any]]:
    row = {"throughput": {"output_tokens_per_s": 400.0 + k}, "latency_ms": {"tpot": {"mean": 20.0}},
           "resolution": None if k == 0 else {"acceptance_length": 1.5, "method": method,
                                              "source": source}}  # fmt: skip
    return k, row


def test_the_decision_says_which_ks_were_inferred_and_from_what() -> None:
    """Only the Ks whose profile was inferred are named (K 0 speculates nothing and is left out);
    two sources are both named; measured Ks add nothing."""
    every = decide([_entry(0, None, None), _entry(1, "inferred", "run A"),
                    _entry(2, "inferred", "run A")], 50.0, 1)  # fmt: skip
    assert every["headline"].endswith("(best of no speculation, K 1..2); the AL at each K was "
                                      "inferred, from run A")  # fmt: skip
    some = decide([_entry(1, "measured", "golden"), _entry(2, "inferred", "run A"),
                   _entry(3, "inferred", "run B")], 50.0, 1)  # fmt: skip
    assert some["headline"].endswith("; the AL at K 2, 3 was inferred, from run A and run B")
    assert [e["acceptance_method"] for e in some["ks"]] == ["measured", "inferred", "inferred"]
    measured = decide([_entry(1, "measured", "golden"), _entry(2, None, "--acceptance-length")],
                      50.0, 1)  # fmt: skip
    assert "inferred" not in measured["headline"]


def test_the_profile_set_resolves_at_each_k_as_inferred(run_cli, tmp_path: Path) -> None:
    """On points a known roofline made (no published data needed): the set holds the curve the
    model draws through the inferred AL, keyed by the flags and the fit's model, with the run,
    the chip, the TP and each K's range; the resolver takes it at every K, method inferred."""
    off = off_points(tmp_path / "off")
    run = point(tmp_path / "mtp", 4, k=3, al=2.4)
    cost, target = tmp_path / "cost.yaml", tmp_path / "reg" / "acceptance" / "v3.yml"
    code, out, err = run_cli("calibrate", off, "-o", cost, "--acceptance-from", run,
                             "--write-profile", target, "--thinking", "off",
                             "--category", "coding")  # fmt: skip
    assert code == 0, err
    found = yaml.safe_load(cost.read_text())["acceptance"]
    assert found["acceptance_length"] == pytest.approx(2.4, abs=0.08)
    expected = curve.shipped().predict(found["acceptance_length"], 3, *found["range"])
    profile_set = load(AcceptanceProfileSet, target)
    assert [p.acceptance_length for p in profile_set.profiles] == [
        round(p.acceptance_length, 4) for p in expected
    ]
    for p, e in zip(profile_set.profiles, expected, strict=True):
        assert p.rationale is not None and p.rationale.endswith(
            f"range {e.low:.2f} to {e.high:.2f}"
        )
        how = (f"through AL {found['acceptance_length']:.2f} at K 3" if p.num_spec_tokens != 3
               else "reproduces the run's median TPOT")  # fmt: skip
        assert how in p.rationale
        assert p.provenance is not None
        assert (p.provenance.run, p.provenance.hardware, p.provenance.tp) == (str(run), "h200", 8)
    assert (
        f"wrote {target} (8 inferred profiles: deepseek-v3/mtp/k1..k8/thinking-off/coding)"
        in " ".join(out.split())  # the console wraps a long path's line
    )

    registry = Registry.load(extra=[tmp_path / "reg"])
    for k in curve.CURVE_KS:
        resolved = resolve(model="deepseek-v3", method="mtp", num_spec_tokens=k, registry=registry,
                           workload=WorkloadAcceptance(thinking="off", category="coding"))  # fmt: skip
        assert (resolved.method, resolved.profile_set) == ("inferred", "v3")
        assert resolved.acceptance_length == round(expected[k - 1].acceptance_length, 4)
        assert resolved.source is not None and f"--acceptance-from {run}" in resolved.source
