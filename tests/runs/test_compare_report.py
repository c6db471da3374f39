"""The compare page against compare()'s own output, not a compare.json written by hand: the
file ``speclens compare --output-dir`` writes is what ``compare`` computes, every number the
page shows is the file's, every sentence is shown, and each sentence states its own row's
delta and interval (a "+0%" beside a delta of 25% is caught)."""

from __future__ import annotations

import html
import re
from pathlib import Path

import orjson
import pytest

from comparekit import write_sweep
from reportkit import field_mismatches, scan
from speclens.runs import compare as cmp
from speclens.runs.compare_inputs import read_inputs

#: The labels these tests read (default labels are the directory names).
AB = ("--label", "A", "--label", "B")


def test_the_compare_page_shows_compares_own_numbers(run_cli, tmp_path: Path) -> None:
    a = write_sweep(tmp_path / "a", [(c, r, {"seed": 10 * c + r}) for c in (1, 4) for r in (0, 1)])
    b = write_sweep(tmp_path / "b", [(c, r, {"seed": 20 * c + r, "speed": 1.5})
                                     for c in (1, 4) for r in (0, 1)])  # fmt: skip
    code, out, err = run_cli("compare", a, b, *AB, "--gpus", "2", "--output-dir", tmp_path / "out")
    assert code == 0, out + err
    data = orjson.loads((tmp_path / "out" / "compare.json").read_bytes())
    expected = cmp.compare(read_inputs([a, b], ["A", "B"], [2, 2]))
    assert data == orjson.loads(orjson.dumps(expected))

    pair = data["pairs"][0]
    rows = pair["deltas"]["matched_interactivity"]
    assert pair["comparable"] and rows and pair["deltas"]["matched_concurrency"]
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    fields = scan(page).fields
    assert field_mismatches(fields, data) == []
    shown = {path for path, _ in fields}
    for j, m in enumerate(rows):
        assert html.escape(m["sentence"], quote=False) in page, m["sentence"]
        for key in ("tokens_per_s_per_user", "a_tok_s_gpu", "b_tok_s_gpu", "delta_pct"):
            assert f"pairs[0].deltas.matched_interactivity[{j}].{key}" in shown
        said = re.search(r"delivers ([+-]\d+)% total tok/s/GPU \(CI ([+-]\d+)% to ([+-]\d+)%\)",
                         m["sentence"])  # fmt: skip
        assert said, m["sentence"]
        numbers = [round(m[k]) for k in ("delta_pct", "low_pct", "high_pct")]
        assert [int(g) for g in said.groups()] == numbers, (m["sentence"], numbers)
        assert m["b_tok_s_gpu"] / m["a_tok_s_gpu"] - 1 == pytest.approx(m["delta_pct"] / 100)
