"""Hostile ``compare SWEEP_DIR``: a sweep whose points do not share one workload is never called
comparable just because they sit in one directory; labels and reasons that reach the page are
escaped; a K sweep whose points record a K only in their runs still splits by K."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from comparekit import DIGEST
from ksweepkit import k_sweep
from speclens.runs import compare as cmp
from speclens.runs import compare_decide as cd
from speclens.runs.compare_inputs import read_inputs
from speclens.runs.html_compare import write_compare_report


def test_points_with_different_workloads_are_not_made_comparable(run_cli, tmp_path: Path) -> None:
    sweep = k_sweep(tmp_path / "k", {1: 1.0, 2: 1.2}, prompts=None)
    point = sweep / "points" / "k2-c4-r0" / "summary.json"
    summary = orjson.loads(point.read_bytes())
    summary["settings"]["dataset"] = "sharegpt"  # one point drew other prompts
    point.write_bytes(orjson.dumps(summary))
    code, out, err = run_cli("compare", sweep, "--json")
    assert code == 1, err
    pair = json.loads(out)["pairs"][0]
    prompts = next(c for c in pair["checks"] if c["name"] == "prompts")
    assert prompts["ok"] is False and not pair["comparable"]


def test_a_recorded_digest_is_never_overwritten(tmp_path: Path) -> None:
    """Points that record their own prompts digest keep it: a sweep whose points drew from two
    datasets stays not comparable."""
    sweep = k_sweep(tmp_path / "k", {1: 1.0, 2: 1.2})
    point = sweep / "points" / "k2-c1-r0" / "summary.json"
    summary = orjson.loads(point.read_bytes())
    summary["settings"]["prompts_sha256"] = "f" * 64
    point.write_bytes(orjson.dumps(summary))
    inputs, named = cd.whole_sweep(read_inputs([sweep], ["A"], [1]), [])
    assert named == ["k"]
    digests = {run.settings["prompts_sha256"] for item in inputs for run in item.runs}
    assert "f" * 64 in digests and len(digests) == 2
    pair = cmp.compare(inputs, named)["pairs"][0]
    assert next(c for c in pair["checks"] if c["name"] == "prompts")["ok"] is False


def test_a_digest_every_point_records_is_the_one_the_check_shows(tmp_path: Path) -> None:
    sweep = k_sweep(tmp_path / "k", {1: 1.0, 2: 1.2})
    inputs, named = cd.whole_sweep(read_inputs([sweep], ["A"], [1]), [])
    pair = cmp.compare(inputs, named)["pairs"][0]
    prompts = next(c for c in pair["checks"] if c["name"] == "prompts")
    assert prompts["ok"] is True and DIGEST[:12] in prompts["detail"]


def test_markup_in_a_label_or_reason_is_escaped_on_the_page(tmp_path: Path) -> None:
    sweep = k_sweep(tmp_path / "k", {1: 1.0, 2: 1.2})
    inputs, named = cd.whole_sweep(read_inputs([sweep], ["A"], [1]), [])
    inputs[0].label = "<script>alert(1)</script>"
    result = cmp.compare(inputs, named)
    result["decision"] = cd.decide(inputs, 1e5)  # beyond every curve: each says its span
    result["decision"]["choices"][1]["reason"] = "<img src=x onerror=alert(1)>"
    page = write_compare_report(tmp_path / "out", result).read_text()
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


@pytest.mark.parametrize("engines", [("vllm", "sglang")])
def test_a_sweep_over_engines_and_k_labels_each_choice_by_both(
    tmp_path: Path, engines: tuple[str, str]
) -> None:
    sweep = k_sweep(tmp_path / "k", {1: 1.0, 2: 1.2})
    doc = orjson.loads((sweep / "sweep.json").read_bytes())
    for i, point in enumerate(doc["points"]):
        point["engine"] = engines[i % 2]
    (sweep / "sweep.json").write_bytes(orjson.dumps(doc))
    inputs, named = cd.whole_sweep(read_inputs([sweep], ["A"], [1]), [])
    assert [i.label for i in inputs] == ["sglang K 1", "sglang K 2", "vllm K 1", "vllm K 2"]
    cmp.compare(inputs, named)
    decision = cd.decide(inputs, 1e5, by_k=True)
    # two engines share each K: the span names the inputs, not "K 1..2"
    assert "(sglang K 1, sglang K 2, vllm K 1, vllm K 2)" in decision["headline"]
