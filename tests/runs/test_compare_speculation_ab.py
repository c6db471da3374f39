"""compare of a speculation A/B (the same deployment and load, speculation off in one input and
on in the other, both aggregate-only): its own verdict, InferenceX's sentence "at X tok/s/user,
MTP delivers +Y% tok/s/GPU", the table it rests on and the TPOT speedup per concurrency, each
number computed here independently (the interpolation by numpy, in log throughput)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from aggregatekit import summary, write_point, write_sweep
from speclens.runs import compare as cmp
from speclens.runs.compare_deltas import log_interpolate
from speclens.runs.compare_inputs import labels_for, read_inputs

#: The labels these tests read (default labels are the directory names).
AB = ("--label", "A", "--label", "B")

#: (concurrency, interactivity, total tok/s/GPU, median TPOT ms) of each side's points.
OFF = [(4, 250.0, 300.0, 4.0), (8, 120.0, 700.0, 8.0), (16, 70.0, 1100.0, 14.0),
       (32, 30.0, 1800.0, 33.0)]  # fmt: skip
ON = [(4, 200.0, 600.0, 5.0), (8, 150.0, 900.0, 6.5), (16, 90.0, 1500.0, 11.0),
      (32, 50.0, 2400.0, 20.0)]  # fmt: skip


def _sweep(path: Path, points: list[tuple[int, float, float, float]], **kw: object) -> Path:
    return write_sweep(path, [summary(concurrency=c, interactivity=x, total_per_gpu=y,
                                      tpot_p50=t, **kw) for c, x, y, t in points])  # type: ignore[arg-type]  # fmt: skip


def _pair(*paths: Path) -> dict:
    inputs = read_inputs(list(paths), labels_for(len(paths), []), [None] * len(paths))
    return cmp.compare(inputs)["pairs"][0]


def _at(points: list[tuple[int, float, float, float]], x: float) -> float:
    """Throughput per GPU at interactivity x: linear in log throughput, by numpy."""
    ordered = sorted(points, key=lambda p: p[1])
    xs = [p[1] for p in ordered]
    assert xs[0] <= x <= xs[-1]
    return float(np.exp(np.interp(x, xs, np.log([p[2] for p in ordered]))))


@pytest.fixture
def sweeps(tmp_path: Path) -> tuple[Path, Path]:
    off = _sweep(tmp_path / "off", OFF)
    on = _sweep(tmp_path / "on", ON, method="mtp", k=3)
    return off, on


def test_sweeps_read_as_inferencex_does(sweeps: tuple[Path, Path]) -> None:
    pair = _pair(*sweeps)
    assert pair["verdict"] == "speculation A/B" and pair["comparable"] is True
    assert pair["label"] == "comparable as a speculation A/B"
    ab = pair["speculation"]
    assert (ab["off"], ab["on"], ab["method"], ab["num_spec_tokens"]) == ("A", "B", "MTP", 3)
    # overlap: off spans 30 to 250 tok/s/user, on 50 to 200: the headline at 200, the highest
    high = 200.0
    off_at = _at(OFF, high)
    delta = (600.0 / off_at - 1) * 100
    assert ab["headline"]["tokens_per_s_per_user"] == high
    assert ab["headline"]["off_tok_s_gpu"] == pytest.approx(off_at, rel=1e-12)
    assert ab["headline"]["delta_pct"] == pytest.approx(delta, rel=1e-12)
    # no target given: the line says which interactivity it chose, and why
    why = "the highest interactivity both curves reach; --at-interactivity X reads it at yours"
    assert ab["headline"]["chosen"] == why
    assert ab["headline"]["sentence"] == (
        f"at 200 tok/s/user ({why}), MTP delivers {delta:+.0f}% total tok/s/GPU"
    )
    assert f"({why}), MTP delivers +44% total tok/s/GPU" in ab["headline"]["sentence"]
    # a row at each of the speculating side's points inside the overlap
    assert [r["tokens_per_s_per_user"] for r in ab["table"]] == [50.0, 90.0, 150.0, 200.0]
    for row, (_, x, y, _) in zip(ab["table"], sorted(ON, key=lambda p: p[1]), strict=True):
        assert row["on_tok_s_gpu"] == y
        assert row["off_tok_s_gpu"] == pytest.approx(_at(OFF, x), rel=1e-12)
        assert row["delta_pct"] == pytest.approx((y / _at(OFF, x) - 1) * 100, rel=1e-12)


def test_tpot_speedup_is_off_over_on_at_each_concurrency(sweeps: tuple[Path, Path]) -> None:
    speedup = _pair(*sweeps)["speculation"]["speedup"]
    expected = {c: t_off / t_on for (c, _, _, t_off), (_, _, _, t_on) in zip(OFF, ON, strict=True)}
    assert {r["concurrency"]: r["speedup"] for r in speedup} == pytest.approx(expected)
    assert [r["sentence"] for r in speedup] == [
        "MTP speedup 0.80x at concurrency 4", "MTP speedup 1.23x at concurrency 8",
        "MTP speedup 1.27x at concurrency 16", "MTP speedup 1.65x at concurrency 32"]  # fmt: skip


def test_the_order_of_the_inputs_does_not_change_the_reading(sweeps: tuple[Path, Path]) -> None:
    forward, backward = _pair(*sweeps)["speculation"], _pair(*sweeps[::-1])["speculation"]
    assert (backward["off"], backward["on"]) == ("B", "A")
    assert backward["headline"] == forward["headline"]
    assert backward["table"] == forward["table"] and backward["speedup"] == forward["speedup"]


def test_single_runs_at_one_concurrency(tmp_path: Path) -> None:
    off = write_point(tmp_path / "off", summary(tpot_p50=20.0, total_per_gpu=1000.0))
    on = write_point(tmp_path / "on", summary(tpot_p50=10.87, total_per_gpu=850.0,
                                               interactivity=92.0, method="eagle", k=2))  # fmt: skip
    ab = _pair(off, on)["speculation"]
    assert ab["headline"]["sentence"] == (
        "at 92 tok/s/user (the speculating run's, at the concurrency both ran), EAGLE delivers "
        "-15% total tok/s/GPU"
    )
    assert ab["speedup"][0]["sentence"] == f"EAGLE speedup {20.0 / 10.87:.2f}x at concurrency 4"
    assert _pair(on, off)["speculation"]["headline"] == ab["headline"]


def test_partly_overlapping_axes_are_one_load(tmp_path: Path) -> None:
    off = _sweep(tmp_path / "off", OFF[:3])
    on = _sweep(tmp_path / "on", ON[1:], method="mtp", k=3)
    pair = _pair(off, on)
    assert pair["verdict"] == "speculation A/B"
    assert [r["concurrency"] for r in pair["speculation"]["speedup"]] == [8, 16]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"hardware": "h200"}, "deployment (hardware mi355x vs h200)"),
        ({"engine": "atom"}, "deployment (engine sglang vs atom)"),
        ({"isl": 8192}, "lengths (published input / output tokens 1024 / 1024 vs 8192 / 1024)"),
        ({"tp": 4, "gpus": 4}, "tensor_parallel 8 vs 4"),
    ],
)
def test_other_differences_are_not_a_speculation_ab(
    tmp_path: Path, change: dict, reason: str
) -> None:
    off = write_point(tmp_path / "off", summary())
    on = write_point(tmp_path / "on", summary(method="mtp", k=3, **change))
    pair = _pair(off, on)
    assert pair["verdict"] == "not comparable" and pair["speculation"] is None
    assert reason in pair["label"]


def test_different_concurrency_is_not_a_speculation_ab(tmp_path: Path) -> None:
    off = write_point(tmp_path / "off", summary(concurrency=4))
    on = write_point(tmp_path / "on", summary(concurrency=8, method="mtp", k=3))
    assert _pair(off, on)["label"] == "not comparable: load (concurrency 4 vs 8)"
    a = _sweep(tmp_path / "a", OFF[:2])
    b = _sweep(tmp_path / "b", ON[2:], method="mtp", k=3)
    assert "no load in common" in _pair(a, b)["label"]


def test_cli_prints_the_sentence_and_writes_it(run_cli, sweeps: tuple[Path, Path], tmp_path: Path) -> None:  # fmt: skip
    out_dir = tmp_path / "cmp"
    code, out, err = run_cli("compare", *sweeps, *AB, "--output-dir", out_dir)
    assert code == 0, err
    assert "A vs B: comparable as a speculation A/B" in out
    assert "MTP delivers +44% total tok/s/GPU (no interval: aggregate-only)" in " ".join(
        out.split()
    )
    assert "MTP speedup 1.65x at concurrency 32 (median TPOT 33.00 ms off, 20.00 ms on)" in out
    saved = orjson.loads((out_dir / "compare.json").read_bytes())
    ab = saved["pairs"][0]["speculation"]
    assert ab["headline"]["sentence"].endswith("MTP delivers +44% total tok/s/GPU")
    page = (out_dir / "report.html").read_text()
    assert "MTP delivers +44% total tok/s/GPU" in page
    assert '<div class="banner pass" role="alert">at 200 tok/s/user' in page  # a gain
    assert "MTP speedup 1.65x at concurrency 32" in page
    assert 'data-field="pairs[0].speculation.headline.delta_pct"' in page


def test_log_interpolation_by_hand() -> None:
    curve = [(50.0, 1000.0), (80.0, 650.0)]
    w = (62.5 - 50.0) / 30.0
    assert log_interpolate(curve, 62.5) == pytest.approx(1000.0 ** (1 - w) * 650.0**w)
    assert log_interpolate(curve, 49.9) is None and log_interpolate(curve, 80.1) is None
