"""compare of a prediction against the measurement it predicts (a simulator's aggregate-only
output against a published run or sweep): per point the predicted and measured median TPOT,
median TTFT and total tokens/s per GPU with the signed error predicted / measured - 1, and the
median absolute error of each over the points, in the fidelity block (one concept, one place)."""

from __future__ import annotations

from pathlib import Path
from statistics import median

import orjson
import pytest

from aggregatekit import summary, write_point, write_sweep
from speclens.runs import compare as cmp
from speclens.runs.compare_inputs import labels_for, read_inputs

#: The labels these tests read (default labels are the directory names).
AB = ("--label", "A", "--label", "B")

#: (concurrency, median TPOT ms, median TTFT ms, total tok/s/GPU): measured, then predicted.
MEASURED = [(4, 10.0, 90.0, 400.0), (16, 17.0, 150.0, 1100.0), (64, 36.0, 280.0, 2500.0)]
PREDICTED = [(4, 5.5, 120.0, 800.0), (16, 12.2, 400.0, 1300.0), (64, 25.3, 1045.0, 2300.0)]
FIGURES = ("tpot_p50_ms", "ttft_p50_ms", "total_tokens_per_s_per_gpu")


def _sweep(path: Path, points: list[tuple[int, float, float, float]], **kw: object) -> Path:
    return write_sweep(path, [summary(concurrency=c, tpot_p50=t, ttft_p50=f, total_per_gpu=y,
                                      **kw) for c, t, f, y in points])  # type: ignore[arg-type]  # fmt: skip


def _pair(*paths: Path) -> dict:
    inputs = read_inputs(list(paths), labels_for(len(paths), []), [None] * len(paths))
    return cmp.compare(inputs)["pairs"][0]


@pytest.fixture
def sweeps(tmp_path: Path) -> tuple[Path, Path]:
    measured = _sweep(tmp_path / "measured", MEASURED)
    predicted = _sweep(tmp_path / "predicted", PREDICTED, executor="sim", source="speclens-sim")
    return measured, predicted


def _expected() -> tuple[list[dict[str, float]], dict[str, float]]:
    errors = [{name: p / m - 1 for name, p, m in zip(FIGURES, pp[1:], mm[1:], strict=True)}
              for mm, pp in zip(MEASURED, PREDICTED, strict=True)]  # fmt: skip
    return errors, {name: median(abs(e[name]) for e in errors) for name in FIGURES}


def test_each_point_and_the_median_error(sweeps: tuple[Path, Path]) -> None:
    pair = _pair(*sweeps)
    assert pair["verdict"] == "prediction" and pair["comparable"] is True
    fid = pair["fidelity"]
    assert (fid["kind"], fid["measured"], fid["predicted"]) == ("aggregate", "A", "B")
    errors, medians = _expected()
    assert [p["concurrency"] for p in fid["points"]] == [4, 16, 64]
    for point, want, mm, pp in zip(fid["points"], errors, MEASURED, PREDICTED, strict=True):
        for i, name in enumerate(FIGURES, 1):
            got = point["figures"][name]
            assert (got["predicted"], got["measured"]) == (pp[i], mm[i])
            assert got["error"] == pytest.approx(want[name], rel=1e-12)
    assert fid["median_abs_error"] == pytest.approx(medians, rel=1e-12)
    # TPOT: 5.5/10 - 1 = -45%, 12.2/17 - 1 = -28.2%, 25.3/36 - 1 = -29.7%: median |e| 29.7%
    assert fid["median_abs_error"]["tpot_p50_ms"] == pytest.approx(1 - 25.3 / 36)


def test_the_prediction_is_found_whichever_side_it_is(sweeps: tuple[Path, Path]) -> None:
    forward, backward = _pair(*sweeps)["fidelity"], _pair(*sweeps[::-1])["fidelity"]
    assert (backward["measured"], backward["predicted"]) == ("B", "A")
    assert backward["points"] == forward["points"]
    assert backward["median_abs_error"] == forward["median_abs_error"]


@pytest.mark.parametrize("mark", [{"executor": "sim"}, {"source": "speclens-sim"}])
def test_single_runs_and_either_mark_of_a_prediction(tmp_path: Path, mark: dict) -> None:
    measured = write_point(tmp_path / "m", summary(tpot_p50=10.0, ttft_p50=90.0))
    predicted = write_point(tmp_path / "p", summary(tpot_p50=11.0, ttft_p50=99.0, **mark))
    fid = _pair(measured, predicted)["fidelity"]
    tpot = fid["points"][0]["figures"]["tpot_p50_ms"]
    assert tpot["error"] == pytest.approx(0.1) and fid["median_abs_error"]["ttft_p50_ms"] == pytest.approx(0.1)  # fmt: skip


def test_two_measurements_have_no_prediction_block(tmp_path: Path) -> None:
    a = _sweep(tmp_path / "a", MEASURED)
    b = _sweep(tmp_path / "b", PREDICTED)
    pair = _pair(a, b)
    assert pair["fidelity"] is None and pair["verdict"] == "published figures only"


def test_a_prediction_of_another_chip_is_not_comparable(tmp_path: Path) -> None:
    a = _sweep(tmp_path / "a", MEASURED)
    b = _sweep(tmp_path / "b", PREDICTED, executor="sim", hardware="h200")
    pair = _pair(a, b)
    assert pair["verdict"] == "not comparable" and "hardware mi355x vs h200" in pair["label"]


def test_cli_prints_the_table_and_writes_it(run_cli, sweeps: tuple[Path, Path], tmp_path: Path) -> None:  # fmt: skip
    out_dir = tmp_path / "cmp"
    code, out, err = run_cli("compare", *sweeps, *AB, "--output-dir", out_dir)
    assert code == 0, err
    assert "comparable as a prediction against a measurement: B predicts A" in out
    assert ("concurrency 4: median TPOT ms 5.50/10.00 (-45.0%); median TTFT ms 120.00/90.00 "
            "(+33.3%); total tok/s/GPU 800.00/400.00 (+100.0%)") in out  # fmt: skip
    assert "median |error| over the points: median TPOT ms 29.7%; median TTFT ms 166.7%" in out
    saved = orjson.loads((out_dir / "compare.json").read_bytes())
    assert saved["pairs"][0]["fidelity"]["median_abs_error"]["tpot_p50_ms"] == pytest.approx(1 - 25.3 / 36)  # fmt: skip
    page = (out_dir / "report.html").read_text()
    assert "Prediction B against measurement A" in page
    assert 'data-field="pairs[0].fidelity.points[2].figures.ttft_p50_ms.error"' in page


def test_a_prediction_of_speculation_against_a_measurement_without_it(tmp_path: Path) -> None:
    measured = write_point(tmp_path / "m", summary(tpot_p50=10.0))
    predicted = write_point(tmp_path / "p", summary(tpot_p50=6.0, method="mtp", k=3,
                                                    executor="sim"))  # fmt: skip
    pair = _pair(measured, predicted)
    assert pair["verdict"] == "speculation A/B" and pair["fidelity"] is None
    assert pair["label"] == "comparable as a speculation A/B (B predicted)"
    assert pair["speculation"]["speedup"][0]["sentence"] == "MTP speedup 1.67x at concurrency 4"
