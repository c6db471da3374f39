"""The odd run flagged: a speculation A/B whose measured TPOT speedup is below 1 at some
concurrency gets one line naming the comparison (console, compare.json's ``notes``, the page);
one that speeds up everywhere gets none."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from aggregatekit import summary, write_sweep

#: (concurrency, median TPOT ms) off; on is off / speedup.
OFF = [(4, 8.0), (16, 12.0), (64, 20.0)]


def _ab(tmp_path: Path, speedups: list[float]) -> tuple[Path, Path]:
    off = write_sweep(tmp_path / "off", [summary(concurrency=c, tpot_p50=t) for c, t in OFF])
    on = write_sweep(tmp_path / "on", [summary(concurrency=c, tpot_p50=t / s, method="mtp", k=2)
                                       for (c, t), s in zip(OFF, speedups, strict=True)])  # fmt: skip
    return off, on


def _compare(run_cli, tmp_path: Path, speedups: list[float]) -> tuple[str, dict, str]:
    off, on = _ab(tmp_path, speedups)
    out = tmp_path / "out"
    code, text, err = run_cli("compare", off, on, "--label", "off", "--label", "mtp",
                              "--output-dir", out)  # fmt: skip
    assert code == 0, err
    data = json.loads((out / "compare.json").read_text())
    assert data["pairs"][0]["verdict"] == "speculation A/B"
    return text, data, (out / "report.html").read_text()


def test_a_speedup_below_one_is_flagged_everywhere(run_cli, tmp_path: Path) -> None:
    text, data, page = _compare(run_cli, tmp_path, [1.4, 0.94, 1.1])
    speedups = {r["concurrency"]: r["speedup"] for r in data["pairs"][0]["speculation"]["speedup"]}
    assert speedups[16] == pytest.approx(0.94) and speedups[4] > 1 and speedups[64] > 1
    assert len(data["notes"]) == 1, data["notes"]
    note = data["notes"][0]
    # the comparison named: which method, against what, where, and by how much
    assert note.startswith("MTP is slower than no speculation at concurrency 16 (0.94x) "), note
    assert "(mtp against off" in note and "concurrency 4" not in note and "64" not in note
    lines = [x for x in text.splitlines() if x.startswith("note: MTP is slower")]
    assert lines == [f"note: {note}"], text
    shown = html.escape(note)
    assert shown in page and page.index(shown) < page.index("Comparability checks"), page


def test_every_load_below_one_is_named(run_cli, tmp_path: Path) -> None:
    _, data, _ = _compare(run_cli, tmp_path, [0.97, 0.94, 0.99])
    (note,) = data["notes"]
    assert "concurrency 4 (0.97x), concurrency 16 (0.94x), concurrency 64 (0.99x)" in note


def test_a_speedup_above_one_everywhere_is_not_flagged(run_cli, tmp_path: Path) -> None:
    text, data, page = _compare(run_cli, tmp_path, [1.4, 1.02, 1.1])
    assert data["notes"] == []
    assert "slower than no speculation" not in text and "slower than no speculation" not in page
