"""speclens compare on run and sweep directories written by hand (comparekit): each check passes
on runs that did the same work, and fails, with its evidence, on the one difference it guards;
a pair that fails is labelled everywhere; the deltas and their intervals."""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest

from comparekit import write_run, write_sweep
from speclens.runs import compare as cmp
from speclens.runs import compare_deltas
from speclens.runs.compare_checks import CHECKS
from speclens.runs.compare_deltas import (
    CurvePoint,
    Estimate,
    interpolate,
    matched_interactivity,
    pareto,
    ratio,
)
from speclens.runs.compare_inputs import Input, Point, labels_for, read_inputs
from speclens.runs.stats import Interval

#: The labels these tests read (default labels are the directory names).
AB = ("--label", "A", "--label", "B")


def _compare(*paths: Path, differ: tuple[str, ...] = (), gpus: list[int] | None = None) -> dict:
    labels = labels_for(len(paths), [])
    inputs = read_inputs(list(paths), labels, gpus or [1] * len(paths))
    return cmp.compare(inputs, differ, metric="output")


def _checks(result: dict) -> dict[str, dict]:
    return {c["name"]: c for c in result["pairs"][0]["checks"]}


def test_same_work_is_comparable(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", seed=1)
    b = write_run(tmp_path / "b", seed=2, speed=2.0)
    result = _compare(a, b)
    pair = result["pairs"][0]
    assert pair["comparable"], pair["label"]
    assert pair["label"] == "comparable"
    assert [c["name"] for c in pair["checks"]] == list(CHECKS)
    assert result["schema"] == "speclens.compare/1"
    row = next(r for r in pair["deltas"]["matched_concurrency"]
               if r["figure"] == "output_tokens_per_s")  # fmt: skip
    assert row["concurrency"] == 4
    assert row["ratio_low"] < row["ratio"] < row["ratio_high"]
    assert 1.6 < row["ratio"] < 2.0  # TTFT is not sped up
    assert "intervals overlap" in _checks(result)["acceptance"]["detail"]


@pytest.mark.parametrize(
    ("change", "check", "evidence"),
    [
        ({"max_tokens": 32}, "sampling", "temperature 0, stream unknown, endpoint none vs max_tokens 32"),
        ({"prompts": None}, "prompts", "unknown: B records no settings.prompts_sha256"),
        ({"prompts": "0" * 64}, "prompts", "different datasets"),
        ({"requests": 12}, "prompts", "different requests sent"),
        ({"prompt_tokens": (400, 410)}, "lengths", "input tokens KS D 1.000"),
        ({"k": 5, "rates": (1.0, 1.0, 0.78)}, "k", "K 7 vs K 5"),
        ({"rates": (1.0, 0.6)}, "acceptance", "forced at different ALs (3.78 vs 2.6)"),
    ],
)  # fmt: skip
def test_each_check_names_its_difference(
    tmp_path: Path, change: dict, check: str, evidence: str
) -> None:
    a = write_run(tmp_path / "a", seed=1)
    b = write_run(tmp_path / "b", seed=2, **change)
    result = _compare(a, b)
    pair = result["pairs"][0]
    found = _checks(result)[check]
    assert not found["ok"] and evidence in found["detail"], found
    assert not pair["comparable"]
    assert pair["label"].startswith(f"not comparable: {check} (")


def test_forced_histograms_that_differ_fail_chi_square(tmp_path: Path) -> None:
    """Both servers say forced AL 3.78 and both realize it (the AL intervals overlap), but B
    draws 3.78 in another shape: each of its 7 drafts accepted with conditional rate c (sum of
    c^j = 2.78), spread over 0..7 accepted drafts where A accepts 2 or 3. Only the histograms
    tell."""
    a = write_run(tmp_path / "a", seed=1)
    b = write_run(tmp_path / "b", seed=2, rates=(0.7672032358407801,) * 7)
    summary = orjson.loads((b / "summary.json").read_bytes())
    summary["server"]["acceptance"]["acceptance_length"] = 3.78  # what the server reports
    (b / "summary.json").write_bytes(orjson.dumps(summary))
    checks = _checks(_compare(a, b))
    assert checks["acceptance"]["ok"], checks["acceptance"]
    assert checks["acceptance"]["detail"].endswith(": intervals overlap")
    assert not checks["histogram"]["ok"], checks["histogram"]
    assert "the forced histograms differ" in checks["histogram"]["detail"]


def test_a_named_k_difference_passes_and_states_the_al_difference(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", seed=1, k=3, rates=(0.9, 0.8, 0.6))
    b = write_run(tmp_path / "b", seed=2, k=5, rates=(0.9, 0.8, 0.6, 0.5, 0.4))
    result = _compare(a, b, differ=("k",))
    checks = _checks(result)
    assert checks["k"]["ok"] and "a named difference: --differ k" in checks["k"]["detail"]
    assert checks["acceptance"]["ok"] and "B - A +" in checks["acceptance"]["detail"]
    assert result["pairs"][0]["comparable"]


def test_natural_runs_state_the_al_difference_with_its_interval(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", seed=1, forced=False, rates=(0.8, 0.6, 0.4))
    b = write_run(tmp_path / "b", seed=2, forced=False, rates=(0.7, 0.5, 0.3))
    checks = _checks(_compare(a, b))
    detail = checks["acceptance"]["detail"]
    assert checks["acceptance"]["ok"] and detail.startswith("natural acceptance: A AL ")
    assert "B - A -" in detail and "95% CI" in detail
    assert checks["histogram"]["ok"] and "not required" in checks["histogram"]["detail"]


def test_not_comparable_deltas_are_labelled(tmp_path: Path) -> None:
    a = write_sweep(tmp_path / "a", [(c, r, {"seed": 10 * c + r}) for c in (1, 4) for r in (0, 1)])
    b = write_sweep(tmp_path / "b", [(c, r, {"seed": 20 * c + r, "speed": 1.5, "max_tokens": 32})
                                     for c in (1, 4) for r in (0, 1)])  # fmt: skip
    pair = _compare(a, b)["pairs"][0]
    assert not pair["comparable"]
    sentences = [r["sentence"] for r in pair["deltas"]["matched_interactivity"]]
    assert sentences and all(
        s.startswith("NOT COMPARABLE (sampling, lengths): at ") for s in sentences
    )


def test_sweeps_delta_at_matched_interactivity(tmp_path: Path) -> None:
    """Two rounds per point (Student t); B is 1.5 times as fast at every concurrency, so at
    matched tok/s/user it delivers more tok/s/GPU, and the sentence says so InferenceX's way."""
    a = write_sweep(tmp_path / "a", [(c, r, {"seed": 10 * c + r}) for c in (1, 4) for r in (0, 1)])
    b = write_sweep(tmp_path / "b", [(c, r, {"seed": 20 * c + r, "speed": 1.5})
                                     for c in (1, 4) for r in (0, 1)])  # fmt: skip
    result = _compare(a, b)
    pair = result["pairs"][0]
    assert pair["comparable"], pair["label"]
    rows = pair["deltas"]["matched_concurrency"]
    assert {r["concurrency"] for r in rows} == {1, 4}
    for r in rows:
        assert r["a"]["method"] == "t" and r["a"]["n"] == 2
    matched = pair["deltas"]["matched_interactivity"]
    assert matched, pair["deltas"]["interactivity_note"]
    for m in matched:
        assert m["low_pct"] <= m["delta_pct"] <= m["high_pct"]
        assert m["sentence"].startswith(
            f"at {m['tokens_per_s_per_user']:.0f} tok/s/user, B delivers "
        )
        assert "tok/s/GPU (CI " in m["sentence"]


def test_gpus_divide_throughput_per_gpu(tmp_path: Path) -> None:
    a = write_sweep(tmp_path / "a", [(c, r, {"seed": 10 * c + r}) for c in (1, 4) for r in (0, 1)])
    b = write_sweep(tmp_path / "b", [(c, r, {"seed": 10 * c + r}) for c in (1, 4) for r in (0, 1)])
    one = _compare(a, b)["pairs"][0]["deltas"]["matched_interactivity"]
    two = _compare(a, b, gpus=[1, 2])["pairs"][0]["deltas"]["matched_interactivity"]
    assert [m["delta_pct"] for m in one] == pytest.approx([0.0] * len(one), abs=1e-9)
    assert [m["delta_pct"] for m in two] == pytest.approx([-50.0] * len(two), abs=1e-9)


def test_interactivity_outside_either_curve_is_said_not_extrapolated(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", seed=1)
    b = write_run(tmp_path / "b", seed=2, speed=2.0)
    deltas = _compare(a, b)["pairs"][0]["deltas"]
    assert deltas["matched_interactivity"] == []
    assert "no overlap, so no delta at matched interactivity" in deltas["interactivity_note"]


def test_pareto_front_drops_dominated_points_and_interpolates_linearly() -> None:
    def point(x: float, y: float) -> Point:
        p = Point({"concurrency": 1}, None, [])
        p.figures = {"tokens_per_s_per_user": Interval(x, x, x, 2, "t"),
                     "output_tokens_per_s": Interval(y, y - 1, y + 1, 2, "t")}  # fmt: skip
        return p

    item = Input("A", Path("."), "sweep", [point(10, 100), point(20, 50), point(15, 40)])
    curve = pareto(item)
    assert [(c.x, c.y.mean) for c in curve] == [(10, 100), (20, 50)]
    mid = interpolate(curve, 15)
    assert mid is not None and mid.mean == pytest.approx(75)
    # a quarter of the way from 10 to 20: weight 0.75 on the left point, 0.25 on the right
    quarter = interpolate(curve, 12.5)
    se = 1 / 12.706204736174707  # each point's SE: a 2-round t half-width of 1
    assert quarter is not None and quarter.mean == pytest.approx(0.75 * 100 + 0.25 * 50)
    assert quarter.se == pytest.approx(math.hypot(0.75 * se, 0.25 * se), rel=1e-9)
    assert interpolate(curve, 25) is None


def test_ratio_interval_on_the_log_scale() -> None:
    """Two bootstrap figures (normal): the log ratio's SE is the root sum of relative SEs."""
    a, b = Estimate(100.0, 2.0, math.inf), Estimate(200.0, 4.0, math.inf)
    r, low, high = ratio(a, b)
    spread = 1.959964 * math.sqrt(0.02**2 + 0.02**2)
    assert r == 2.0
    assert low == pytest.approx(2 * math.exp(-spread), rel=1e-6)
    assert high == pytest.approx(2 * math.exp(spread), rel=1e-6)
    assert ratio(None, b)[1] != ratio(None, b)[1]  # NaN: no interval without both


def test_estimate_from_a_two_round_t_interval() -> None:
    interval = Interval(10.0, 10.0 - 12.706205, 10.0 + 12.706205, 2, "t")
    estimate = Estimate.of(interval)
    assert estimate is not None and estimate.se == pytest.approx(1.0, rel=1e-6)
    assert estimate.df == 1
    assert Estimate.of(Interval(1.0, math.nan, math.nan, 1, "none")) is None


def test_cli_json_and_output_dir(run_cli, tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", seed=1)
    b = write_run(tmp_path / "b", seed=2, speed=2.0)
    code, out, err = run_cli("compare", a, b, "--json", "--output-dir", tmp_path / "out",
                             "--label", "base", "--label", "fast")  # fmt: skip
    assert code == 0, err
    data = orjson.loads(out)
    assert [i["label"] for i in data["inputs"]] == ["base", "fast"]
    assert data["pairs"][0]["comparable"] is True
    assert orjson.loads((tmp_path / "out" / "compare.json").read_bytes()) == data
    assert (tmp_path / "out" / "report.html").is_file()


def test_cli_console_and_exit_1_when_not_comparable(run_cli, tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", seed=1)
    b = write_run(tmp_path / "b", seed=2, max_tokens=32)
    code, out, _ = run_cli("compare", a, b, *AB)
    assert code == 1
    assert "A vs B: not comparable: sampling (" in out
    assert "FAIL sampling: max_tokens 64" in out
    lines = [line for line in out.splitlines() if "concurrency 4:" in line]
    assert lines and all(line.strip().startswith("NOT COMPARABLE: ") for line in lines)


def test_matched_rows_that_round_alike_read_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """Interactivities 15.6 and 16.1 both round to 16: the sentences then carry a decimal, so
    no two rows seem to state two deltas at one interactivity."""
    from types import SimpleNamespace

    def curve(*xs: float) -> list[CurvePoint]:
        return [CurvePoint(x, Estimate(100.0 / x, 1.0, 5.0)) for x in xs]

    curves = iter([curve(12.0, 15.6, 16.1), curve(12.0, 15.6, 16.1), curve(12.0, 20.0),
                   curve(12.0, 20.0)])  # fmt: skip
    monkeypatch.setattr(compare_deltas, "pareto", lambda item, metric="output": next(curves))
    a, b = SimpleNamespace(label="A"), SimpleNamespace(label="B")
    close, _ = matched_interactivity(a, b, "")  # type: ignore[arg-type]
    assert [m["sentence"].split(" tok/s/user")[0] for m in close] == ["at 12.0", "at 15.6",
                                                                      "at 16.1"]  # fmt: skip
    apart, _ = matched_interactivity(a, b, "")  # type: ignore[arg-type]
    assert [m["sentence"].split(" tok/s/user")[0] for m in apart] == ["at 12", "at 20"]
