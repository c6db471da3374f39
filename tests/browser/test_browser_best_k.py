"""The decision block of ``speclens sim --at-interactivity --output-dir`` in a real browser: the
page loads clean, the decision is its first heading, its numbers come before every other one and
are on screen, and each equals decision.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cdp import Browser
from chromium_env import ensure_chromium

from reportkit import field_mismatches
from scenariokit import kimi_k3

pytestmark = pytest.mark.integration

SCENARIO = kimi_k3(requests=128)


def test_the_decision_block_is_first_and_equals_decision_json(run_cli, tmp_path: Path) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    out_dir = tmp_path / "grid"
    code, _, err = run_cli("sim", path, "--sweep", "num_spec_tokens=1..2", "--sweep",
                           "concurrency=4,64", "--at-interactivity", "120", "--jobs", "1",
                           "--output-dir", out_dir)  # fmt: skip
    assert code == 0, err
    decision = json.loads((out_dir / "decision.json").read_text())
    assert decision["best"] is not None
    browser = Browser(ensure_chromium())
    try:
        loaded = browser.load(out_dir / "report.html")
    finally:
        browser.close()
    assert loaded.console_errors == [] and loaded.exceptions == []
    assert loaded.requests == [loaded.url]
    ours = [(p, t, shown) for p, t, shown in loaded.fields if p.startswith("decision.")]
    # K, AL, tok/s/GPU, its expected range and the ratio for each K, and the GPUs.
    names = ("num_spec_tokens", "acceptance_length", "tok_s_gpu", "expected_low",
             "expected_high", "ratio_to_best")  # fmt: skip
    assert len(ours) == len(names) * len(decision["ks"]) + 1
    assert {p for p, _, _ in ours} == {"decision.gpus"} | {
        f"decision.ks[{i}].{n}" for i in range(len(decision["ks"])) for n in names
    }
    assert all(shown for _, _, shown in ours)
    assert field_mismatches([(p, t) for p, t, _ in ours], {"decision": decision}) == []
    best = decision["ks"].index(max(decision["ks"], key=lambda e: e["tok_s_gpu"] or 0))
    shown = {p: t for p, t, _ in ours}
    assert shown[f"decision.ks[{best}].ratio_to_best"] == "1.000"
    # The decision comes first: in document order, its numbers precede every other one.
    paths = [p for p, _, _ in loaded.fields]
    assert paths[: len(ours)] == [p for p, _, _ in ours]
    assert len(paths) > len(ours)
    page = (out_dir / "report.html").read_text()
    assert page.index("<h2>") == page.index("<h2>Decision</h2>")
