"""``speclens compare --at-interactivity X`` answers at X on every kind of input, in one named
throughput, with intervals that mean something.

The reproductions: InferenceX's published DeepSeek-R1 FP8 SGLang runs on 8 x H200 (MTP off
2026-05-17 against MTP on 2026-05-20, 1k/1k) and on 8 x MI355X (8k/1k, 2026-05-19 against
2026-05-21), asked "does MTP pay at 50 tok/s/user?". compare once said no input reaches 50 (the
curves span 32 to 103) and put a green box at the curves' edge. The expected figures are read
here from the published points themselves, interpolated by numpy linearly in log throughput.
Then: two-round intervals that went negative, a lead from two rounds called a winner, "best of
K 2..4" when K 3 never ran, a predicted input's band, and a --metric that is neither."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from publishedkit import INFERENCEX_DIR
from speclens.runs import compare_decide as cd
from speclens.runs.compare_deltas import log_interval
from speclens.runs.compare_inputs import Input, Point
from speclens.runs.decision import k_span
from speclens.runs.stats import Interval

H200 = ("dsr1-h200-sglang-fp8-1024x1024-tp8-nomtp-2026-05-17",
        "dsr1-h200-sglang-fp8-1024x1024-tp8-mtp-2026-05-20")  # fmt: skip
MI355X = ("dsr1-mi355x-sglang-fp8-8192x1024-tp8-nomtp-2026-05-19",
          "dsr1-mi355x-sglang-fp8-8192x1024-tp8-mtp-2026-05-21")  # fmt: skip
#: Only the points those four configurations hold (the import stays fast).
WHERE = ("framework=sglang", "precision=fp8", "decode_tp=8", "osl=1024", "hardware=h200",
         "hardware=mi355x", "isl=1024", "isl=8192", "date=2026-05-17", "date=2026-05-20",
         "date=2026-05-19", "date=2026-05-21")  # fmt: skip

published = pytest.mark.skipif(
    not (INFERENCEX_DIR / "benchmarks.json").is_file(),
    reason="InferenceX's published data (../shared/data/inferencex/) is not present",
)


def _published_at(name: str, x: float, metric: str = "tput_per_gpu") -> float:
    """The configuration's ``metric`` at ``x`` tok/s/user from the published points: numpy's
    linear interpolation of log throughput against median interactivity."""
    _model, hw, engine, precision, lengths, _tp, spec, *date = name.split("-")
    isl, osl = (int(v) for v in lengths.split("x"))
    points = {}
    for f in ("benchmarks.json", "benchmarks-history.json"):
        for p in json.loads((INFERENCEX_DIR / f).read_text()):
            if (p["hardware"], p["framework"], p["precision"], p["isl"], p["osl"],
                    p["spec_method"], p["date"], p["decode_tp"], p["disagg"]) == (
                    hw, engine, precision, isl, osl, "none" if spec == "nomtp" else spec,
                    "-".join(date), 8, False):  # fmt: skip
                points[p["conc"]] = (p["metrics"]["median_intvty"], p["metrics"][metric])
    xs, ys = zip(*sorted(points.values()), strict=True)
    assert xs[0] < x < xs[-1]
    return float(np.exp(np.interp(x, xs, np.log(ys))))


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from typer.testing import CliRunner

    from speclens.cli import app

    out = tmp_path_factory.mktemp("ix") / "ix"
    args = ["import", "inferencex", str(INFERENCEX_DIR / "benchmarks.json"),
            str(INFERENCEX_DIR / "benchmarks-history.json"), "--output-dir", str(out)]  # fmt: skip
    for w in WHERE:
        args += ["--where", w]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.stderr
    return out


@published
@pytest.mark.parametrize(("pair", "sign"), [(H200, -1), (MI355X, +1)])
def test_does_mtp_pay_at_50_is_answered_in_the_first_line(
    run_cli: Any, imported: Path, tmp_path: Path, pair: tuple[str, str], sign: int
) -> None:
    off, on = (_published_at(name, 50.0) for name in pair)
    change = on / off - 1
    assert sign * change > 0.05  # H200: about -12%, MI355X: about +83%
    out_dir = tmp_path / "cmp"
    code, out, err = run_cli("compare", *(imported / name for name in pair), "--at-interactivity",
                             "50", "--output-dir", out_dir)  # fmt: skip
    assert code == 0, err
    first = out.splitlines()[0]
    assert first.startswith("at 50 tok/s/user, "), first
    assert "no input reaches" not in out
    # the change of B (MTP) against A at 50, labelled aggregate-only, in total tok/s/GPU
    assert f"{change:+.1%}" in first, (first, change)
    assert "aggregate-only" in first and "total tok/s/GPU" in first
    assert "not resolved" in first  # published points have no interval: no winner is declared
    saved = json.loads((out_dir / "compare.json").read_text())
    decision = saved["decision"]
    assert [e["kind"] for e in decision["choices"]] == ["aggregate-only"] * 2
    assert [e["tok_s_gpu"] for e in decision["choices"]] == pytest.approx([off / 1, on], rel=1e-9)
    # the speculation A/B's box reads at the user's target too, and a loss is not green
    head = saved["pairs"][0]["speculation"]["headline"]
    assert head["tokens_per_s_per_user"] == 50.0
    assert head["delta_pct"] == pytest.approx(change * 100, rel=1e-9)
    page = (out_dir / "report.html").read_text()
    box = page[page.index('role="alert">at 50 tok/s/user, MTP delivers') - 40 :][:60]
    assert ("banner pass" in box) is (sign > 0), box


@published
def test_one_throughput_a_page_named_and_chosen_by_metric(
    run_cli: Any, imported: Path, tmp_path: Path
) -> None:
    """The default is InferenceX's throughput per GPU (input + output); --metric output gives
    output tokens/s per GPU on every table, sentence and plot instead, never both."""
    inputs = [imported / name for name in MI355X]
    for metric, published_name, other in (("total", "tput_per_gpu", "output"),
                                          ("output", "output_tput_per_gpu", "total")):  # fmt: skip
        out_dir = tmp_path / metric
        args = ["--metric", metric] if metric == "output" else []
        code, out, err = run_cli("compare", *inputs, "--at-interactivity", "50", *args,
                                 "--output-dir", out_dir)  # fmt: skip
        assert code == 0, err
        saved = json.loads((out_dir / "compare.json").read_text())
        assert saved["metric"] == metric and saved["decision"]["metric"] == metric
        expected = [_published_at(name, 50.0, published_name) for name in MI355X]
        assert [e["tok_s_gpu"] for e in saved["decision"]["choices"]] == pytest.approx(
            expected, rel=1e-9
        )
        figures = {r["figure"] for r in saved["pairs"][0]["deltas"]["matched_concurrency"]}
        assert f"{metric}_tokens_per_s_per_gpu" in figures
        assert f"{other}_tokens_per_s_per_gpu" not in figures
        page = (out_dir / "report.html").read_text()
        assert f"{metric} tok/s/GPU" in page and f"{other} tok/s/GPU" not in page
        assert f"{other} tok/s/GPU" not in out and f"{metric} tok/s/GPU" in out


def test_a_metric_that_is_neither_is_refused_in_one_line(run_cli: Any, tmp_path: Path) -> None:
    for bad in ("input", "Total", ""):
        code, out, err = run_cli("compare", tmp_path / "a", tmp_path / "b", "--metric", bad,
                                 "--output-dir", tmp_path / "cmp")  # fmt: skip
        assert code == 2, (bad, out, err)
        assert err.strip() == (
            f"command line: --metric: expected one of total, output, got {bad!r}"
        ), err
        assert not (tmp_path / "cmp").exists()


# --- intervals that mean something -------------------------------------------------------------


def _point(x: float, y: float, half: float, rounds: int) -> Point:
    figures = {
        "tokens_per_s_per_user": Interval(x, x, x, rounds, "t"),
        "output_tokens_per_s": Interval(y, y - half, y + half, rounds, "t"),
    }
    return Point({"concurrency": 1}, None, [], figures)


def _flat(label: str, y: float, half: float, rounds: int) -> Input:
    return Input(label, Path(label), "sweep",
                 [_point(10, 1.1 * y, half, rounds), _point(30, 0.9 * y, half, rounds)])  # fmt: skip


def test_a_two_round_throughput_interval_never_goes_below_zero() -> None:
    # '19.5 (-7.7 to 46.8)': two rounds, t with 1 df (12.7) on a large spread
    shown = log_interval(Interval(19.5, -7.7, 46.8, 2, "t"))
    se = 27.25 / 12.706204736174705
    assert shown.mean == 19.5
    assert shown.low == pytest.approx(19.5 * math.exp(-12.706204736174705 * se / 19.5), rel=1e-6)
    assert 0 < shown.low < 19.5 < shown.high
    entry = cd.decide([_flat("a", 19.5, 27.25, 2)], 20)["choices"][0]
    assert entry["low"] > 0 and entry["low"] < entry["tok_s_gpu"] < entry["high"]


def test_a_lead_from_two_rounds_is_not_resolved_even_when_its_interval_clears_1() -> None:
    # b leads c by +59% with a narrow interval, but on two rounds a side: no winner
    decision = cd.decide([_flat("a", 50, 1, 3), _flat("b", 159, 1, 2), _flat("c", 100, 1, 2)], 20)
    assert decision["best"] == "b" and decision["resolved"] is False
    assert decision["lead"].startswith("b's lead over c, +59.0% (95% CI +")
    assert decision["lead"].endswith(": not resolved, fewer than 3 rounds a side (b: 2, c: 2)")
    assert "(highest of a, b, c; not resolved: fewer than 3 rounds" in decision["headline"]
    assert "best of" not in decision["headline"]
    three = cd.decide([_flat("a", 50, 1, 3), _flat("b", 159, 1, 3), _flat("c", 100, 1, 3)], 20)
    assert three["resolved"] is True and three["headline"].endswith("(best of a, b, c)")


def test_best_of_lists_the_ks_that_ran() -> None:
    assert k_span([2, 4]) == "K 2, 4"
    assert k_span([0, 1, 2, 3, 8]) == "no speculation, K 1..3, 8"
    assert k_span([1, 2, 3, 4]) == "K 1..4"


def test_a_first_input_that_reads_highest_states_the_loss_of_the_other() -> None:
    decision = cd.decide([_flat("nomtp", 100, 1, 3), _flat("mtp", 88, 1, 3)], 20)
    assert decision["best"] == "nomtp"
    assert "nomtp delivers 100 output tok/s/GPU" in decision["headline"]
    assert ", mtp -12.0% (95% CI " in decision["headline"]


def _predicted(label: str, y: float, error: float | None) -> Input:
    from speclens.runs.rundir import Run

    run = Run(Path(label), {"settings": {"model": "m", "executor": "sim"}}, [])
    item = _flat(label, y, 5, 1)
    item.points[0].runs.append(run)
    item.points[1].runs.append(run)
    item.expected_error = error
    return item


def test_a_predicted_input_is_labelled_and_banded_by_its_expected_error() -> None:
    measured = _flat("measured", 100, 1, 3)
    bare = cd.decide([measured, _predicted("sim", 150, None)], 20)
    sim = bare["choices"][1]
    assert sim["kind"] == "predicted" and sim["tok_s_gpu"] == pytest.approx(150)
    assert sim["low"] is None  # a simulator's spread over its requests is no prediction error
    assert "not resolved: sim predicted with no expected error, no interval" in bare["headline"]
    banded = cd.decide([measured, _predicted("sim", 150, 0.2)], 20)["choices"][1]
    assert (banded["low"], banded["high"]) == pytest.approx((150 / 1.2, 150 * 1.2), rel=1e-9)
    assert banded["expected_error"] == 0.2
    lines = cd.decision_lines(cd.decide([measured, _predicted("sim", 150, 0.2)], 20))
    assert lines[3].startswith("  sim: 150 output tok/s/GPU (predicted, band 125 to 180), 1.000x ")
