"""A comparability check that is not required of a pair reads "stated", never "pass": a
forced run against a natural one, or a named K difference, whose histograms a chi-square
finds far from one distribution, says so in the console, in compare.json and on the page."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from comparekit import write_run
from speclens.cli import app


def _pair(tmp_path: Path, kind: str) -> tuple[list[str], Path, Path, int]:
    """(compare's extra arguments, A, B, compare's exit code): histograms drawn from very
    different rates (a forced run against a natural one is no comparison: exit 1)."""
    if kind == "forced-vs-natural":
        a = write_run(tmp_path / "a", seed=1, rates=(1.0, 1.0, 0.78))
        b = write_run(tmp_path / "b", seed=2, forced=False, rates=(0.4, 0.2, 0.1))
        return [], a, b, 1
    a = write_run(tmp_path / "a", seed=1, k=3, rates=(0.95, 0.9, 0.85))
    b = write_run(tmp_path / "b", seed=2, k=5, rates=(0.5, 0.3, 0.2, 0.1, 0.1))
    return ["--differ", "k"], a, b, 0


def _compare(*args: str | Path, code: int = 0) -> str:
    try:
        result = CliRunner().invoke(app, ["compare", *map(str, args)])
    finally:
        logging.getLogger().handlers.clear()
    assert result.exit_code == code, result.stderr
    return result.stdout


@pytest.mark.parametrize("kind", ["forced-vs-natural", "named-k"])
def test_a_histogram_far_from_homogeneous_reads_stated_everywhere(
    tmp_path: Path, kind: str
) -> None:
    extra, a, b, code = _pair(tmp_path, kind)
    out = tmp_path / "out"
    console = _compare(a, b, "--label", "A", "--label", "B", *extra, "--output-dir", out, code=code)

    data = orjson.loads((out / "compare.json").read_bytes())
    histogram = next(c for c in data["pairs"][0]["checks"] if c["name"] == "histogram")
    p = float(re.search(r"chi-square p (\S+)", histogram["detail"]).group(1))
    assert p < 1e-6, histogram  # far from one distribution: nothing may read "pass"
    assert histogram["stated"] is True, histogram

    line = next(x for x in console.splitlines() if " histogram: " in x)
    assert line.split()[0] == "stated", line
    assert not re.search(r"\b(ok|FAIL|n/a)\b", line.split(" histogram: ")[0]), line

    page = (out / "report.html").read_text()
    row = re.search(r"<tr><td>histogram</td><td>(.*?)</td>", page)
    assert row is not None, page
    assert "stated" in row.group(1) and "pass" not in row.group(1), row.group(1)


def test_a_required_check_never_reads_stated(tmp_path: Path) -> None:
    """Two forced runs at one K: the histogram is required, passes or fails, never stated."""
    a = write_run(tmp_path / "a", seed=1)
    b = write_run(tmp_path / "b", seed=2)
    out = tmp_path / "out"
    console = _compare(a, b, "--output-dir", out)
    data = orjson.loads((out / "compare.json").read_bytes())
    assert not any(c.get("stated") for c in data["pairs"][0]["checks"]), data["pairs"][0]
    assert not any(x.split()[0] == "stated" for x in console.splitlines() if x.strip())
