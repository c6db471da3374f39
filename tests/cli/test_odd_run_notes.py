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


# --- an inferred AL far from what the same model infers elsewhere or the registry holds ---

#: InferenceX's SGLang FP8 1024 x 1024 TP 8 runs: (MTP-off run, MTP run, its K) on each chip.
RUNS = {
    "h200": ("dsr1-h200-sglang-fp8-1024x1024-tp8-nomtp-2026-05-17",
             "dsr1-h200-sglang-fp8-1024x1024-tp8-mtp-2026-05-20", 2),
    "mi355x": ("dsr1-mi355x-sglang-fp8-1024x1024-tp8-nomtp-2026-05-27",
               "dsr1-mi355x-sglang-fp8-1024x1024-tp8-mtp-2026-05-21", 3),
}  # fmt: skip


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from publishedkit import INFERENCEX_DIR

    if not (INFERENCEX_DIR / "benchmarks.json").is_file():
        pytest.skip("InferenceX's published data (../shared/data/inferencex/) is not present")
    from typer.testing import CliRunner

    from speclens.cli import app

    out = tmp_path_factory.mktemp("published")
    for chip in RUNS:
        where = [f"hardware={chip}", "framework=sglang", "precision=fp8", "isl=1024",
                 "osl=1024", "decode_tp=8"]  # fmt: skip
        result = CliRunner().invoke(app, [
            "import", "inferencex", str(INFERENCEX_DIR / "benchmarks.json"),
            str(INFERENCEX_DIR / "benchmarks-history.json"), "--output-dir", str(out / chip),
            *[arg for w in where for arg in ("--where", w)]])  # fmt: skip
        assert result.exit_code == 0, result.stderr
    return out


def _calibrate(run_cli, published: Path, tmp_path: Path, chip: str) -> tuple[str, dict, dict]:
    off, mtp, k = RUNS[chip]
    cost = tmp_path / f"{chip}.yaml"
    code, out, err = run_cli("calibrate", published / chip / off, "-o", cost, "--acceptance-from",
                             published / chip / mtp / "points" / "c4", "-k", str(k), "--json")  # fmt: skip
    assert code == 0, err
    import yaml

    return err, json.loads(out), yaml.safe_load(cost.read_text())


def test_the_h200_mtp_run_is_flagged(run_cli, published: Path, tmp_path: Path) -> None:
    """AL 1.38 at K 2 where the other deployments infer 2 and more: the note names the
    comparison, in the console (stderr under --json), --json and the cost file."""
    from speclens.acceptance import curve
    from speclens.sim import trust

    console, printed, written = _calibrate(run_cli, published, tmp_path, "h200")
    acceptance = written["acceptance"]
    assert printed["acceptance"] == acceptance
    al, k = acceptance["acceptance_length"], acceptance["num_spec_tokens"]
    assert k == 2 and al < 1.6, acceptance
    (note,) = acceptance["notes"]
    assert note.startswith(f"AL {al:.2f} at K 2 is far below what deepseek-r1 mtp infers "
                           "elsewhere ("), note  # fmt: skip
    assert note.endswith("check the run's speculation settings"), note
    # the figures it states: every other deployment's AL mapped to K 2 by the curve
    others = [e for e in trust.inferred_elsewhere("deepseek-r1", "mtp")
              if (e.chip, e.engine) != ("h200", "sglang")]  # the same scripts left out  # fmt: skip
    mapped = [curve.shipped().predict(e.acceptance_length, e.num_spec_tokens)[1].acceptance_length
              for e in others]  # fmt: skip
    assert f"({min(mapped):.1f} to {max(mapped):.1f} at K 2 from {len(others)} InferenceX " in note
    assert f"note: {note}" in " ".join(console.split())


def test_the_mi355x_mtp_run_is_not_flagged(run_cli, published: Path, tmp_path: Path) -> None:
    console, printed, written = _calibrate(run_cli, published, tmp_path, "mi355x")
    acceptance = written["acceptance"]
    assert acceptance["num_spec_tokens"] == 3 and acceptance["acceptance_length"] > 2
    assert acceptance["notes"] == [] and printed["acceptance"]["notes"] == []
    assert "far below" not in console and "far above" not in console


def test_the_registry_is_held_against_too() -> None:
    """kimi-k3 DSpark's golden curve (2.87 at K 3): an AL of 1.2 at K 3 is far below it; the
    curve's own AL at K 3 is not flagged."""
    from speclens.cli.calibrate_points import odd_al_notes

    def notes(al: float, low: float, high: float) -> list[str]:
        return odd_al_notes({"num_spec_tokens": 3, "method": "dspark", "acceptance_length": al,
                             "range": [low, high]}, {}, "kimi-k3")  # fmt: skip

    (note,) = notes(1.2, 1.15, 1.25)
    assert note.startswith("AL 1.20 at K 3 is far below what the registry holds for kimi-k3 "
                           "dspark ("), note  # fmt: skip
    assert notes(2.87, 2.8, 2.95) == []
