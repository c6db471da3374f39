"""The decision block of ``speclens compare SWEEP_DIR --at-interactivity X --output-dir`` in a
real browser: the page loads clean, the decision is its first heading, its numbers come before
every other one and are on screen, and each equals compare.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cdp import Browser
from chromium_env import ensure_chromium

from ksweepkit import k_sweep
from reportkit import field_mismatches

pytestmark = pytest.mark.integration


def test_the_compare_decision_is_first_and_equals_compare_json(run_cli, tmp_path: Path) -> None:
    sweep = k_sweep(tmp_path / "k", {1: 1.0, 3: 1.3}, prompts=None)
    code, out, err = run_cli("compare", sweep, "--json", "--at-interactivity", "1")
    assert code == 0, err
    curves = [c["curve"] for c in json.loads(out)["decision"]["choices"]]
    x = round((max(c[0]["tok_s_user"] for c in curves) + min(c[-1]["tok_s_user"]
                                                              for c in curves)) / 2, 1)  # fmt: skip
    out_dir = tmp_path / "cmp"
    code, _, err = run_cli("compare", sweep, "--at-interactivity", x, "--output-dir", out_dir)
    assert code == 0, err
    decision = json.loads((out_dir / "compare.json").read_text())["decision"]
    assert decision["best"] == "K 3"
    browser = Browser(ensure_chromium())
    try:
        loaded = browser.load(out_dir / "report.html")
    finally:
        browser.close()
    assert loaded.console_errors == [] and loaded.exceptions == []
    assert loaded.requests == [loaded.url]
    ours = [(p, t, shown) for p, t, shown in loaded.fields if p.startswith("decision.")]
    # each input's K, tok/s/GPU with its bounds, and its ratio to the best with its bounds
    names = ("num_spec_tokens", "tok_s_gpu", "low", "high", "ratio_to_best", "ratio_low",
             "ratio_high")  # fmt: skip
    assert {p for p, _, _ in ours} == {
        f"decision.choices[{i}].{n}" for i in range(len(decision["choices"])) for n in names
    }
    assert all(shown for _, _, shown in ours)
    assert field_mismatches([(p, t) for p, t, _ in ours], {"decision": decision}) == []
    paths = [p for p, _, _ in loaded.fields]
    assert paths[: len(ours)] == [p for p, _, _ in ours]
    assert len(paths) > len(ours)
    page = (out_dir / "report.html").read_text()
    assert page.index("<h2>") == page.index("<h2>Decision</h2>")
    assert decision["headline"] in page
