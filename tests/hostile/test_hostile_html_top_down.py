"""The top-down report parts from hostile files: a sweep's settings, engines and GPU counts of
any JSON type (lists and objects included) group into lines and name a throughput without a
crash, and a category's verify steps of any type never draw a bar the file does not hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reportkit import external_references, field_mismatches, scan
from speclens.runs.html_run import write_run_report
from speclens.runs.html_sweep import write_sweep_report

EVIL = '<script>alert(1)</script><img src="http://198.51.100.1/x.png">'
ODD: list[Any] = [None, [1, 2], {"k": 3}, EVIL, True, -1, 1e308, 3]


def _figure(mean: Any) -> dict[str, Any]:
    return {"mean": mean, "low": [], "high": {"x": 1}, "n": 1, "method": EVIL}


def _write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def _check(directory: Path, source: str) -> str:
    """Self-contained, no markup from the file, each number the file's (a decision's numbers
    are its own document's, not the sweep's)."""
    page = (directory / "report.html").read_text(encoding="utf-8")
    assert external_references(page) == [] and "<script>" not in page
    data = json.loads((directory / source).read_text())
    shown = [(path, text) for path, text in scan(page).fields if not path.startswith("decision.")]
    assert field_mismatches(shown, data) == []
    return page


def test_a_sweep_of_odd_settings_engines_and_gpus(tmp_path: Path) -> None:
    points, stats = [], []
    for i, odd in enumerate(ODD):
        where = f"points/p{i}"
        points.append({"id": f"p{i}", "dir": where, "status": "ok", "settings": {}})
        _write(tmp_path / where / "summary.json",
               {"figures": {}, "settings": {"gpus": odd, "num_spec_tokens": odd}})  # fmt: skip
        stats.append({
            "engine": odd,
            "settings": {"num_speculative_tokens": odd, "acceptance_length": odd,
                         "concurrency": odd},
            "figures": {"output_tokens_per_s": _figure(100.0 + i),
                        "tokens_per_s_per_user": _figure(odd if i % 2 else 50.0 - i),
                        "tpot_ms": _figure(10.0), "realized_al": _figure(odd)},
        })  # fmt: skip
    stats.append({"engine": "e", "settings": None, "figures": None})
    stats.append(EVIL)
    _write(tmp_path / "sweep.json", {"schema": "speclens.sweep/1", "kind": "server",
                                     "points": points, "stats": stats})  # fmt: skip
    write_sweep_report(tmp_path, {"headline": EVIL, "figure": ["x"], "ks": [{"tok_s_gpu": 1}]})
    page = _check(tmp_path, "sweep.json")
    assert "Peak output throughput per setting" in page
    assert "output tok/s (whole server)" in page  # the points state no one GPU count


def test_categories_with_odd_verify_steps(tmp_path: Path) -> None:
    categories = {f"c{i}": {"al": 1.0 if i % 2 else 2.0, "verify_steps": odd}
                  for i, odd in enumerate(ODD)}  # fmt: skip
    categories["none"] = {"al": 1.0, "verify_steps": 0}
    categories["bad"] = EVIL
    _write(tmp_path / "summary.json", {"figures": {"acceptance": {"al_by_category": categories}}})
    write_run_report(tmp_path)
    page = _check(tmp_path, "summary.json")
    assert "AL (none)</th><td>no data (" in page
