"""A roofline fitted to published points, and the AL a speculating run's TPOT implies.

Most points are made by the simulator itself from a roofline of known parameters (what a GPU
engine would have published had it run that roofline), written as aggregate-only runs; the fit
starts elsewhere and must find predictions that reproduce them. Points the simulator never made
(worked out by hand, and InferenceX's measured ones) are in ``test_fit_points_fixtures.py``. The
report and the AL range are checked on fits written by hand: predictions a given error off the
measurements."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from publishedkit import point as inferencex_point
from speclens.runs import published_read
from speclens.sim import catalog
from speclens.sim import fit_points as fp
from speclens.sim.closed_loop import Figures, Load, schedule
from speclens.sim.roofline import Efficiency, Roofline

TRUTH = Efficiency(compute=0.3, memory=0.6, overhead=4e-3, per_sequence=0.0, per_token=3e-5)
FRONT = 0.08


def _roof(efficiency: Efficiency | None = None) -> Roofline:
    roof = Roofline(catalog.model("deepseek-v3"), catalog.chip("h200"), 8)
    return replace(roof, efficiency=efficiency) if efficiency is not None else roof


def _settings(c: int, **changes: Any) -> dict[str, Any]:
    base = {"model": "deepseek-v3", "hardware": "h200", "engine": "sglang", "precision": "fp8",
            "tensor_parallel": 8, "expert_parallel": 1, "dp_attention": False, "gpus": 8,
            "disaggregated": False, "input_tokens": {"min": 1024, "max": 1024},
            "output_tokens": {"min": 256, "max": 256}, "concurrency": c, "method": None,
            "num_spec_tokens": None, "date": "2026-05-27"}  # fmt: skip
    return {**base, **changes}


def write_point(path: Path, settings: dict[str, Any], k: int = 0, al: float = 1.0,
                figures: dict[str, Any] | None = None) -> Path:  # fmt: skip
    """An aggregate-only run directory whose figures the truth roofline predicts."""
    roof = _roof(TRUTH)
    if k:
        roof = replace(roof, method="mtp")
    load = Load(settings["concurrency"], settings["input_tokens"]["max"],
                settings["output_tokens"]["max"], k, al)  # fmt: skip
    block = schedule(load).figures(roof, FRONT, settings["gpus"]).summary_figures()
    if figures is not None:
        block = figures
    path.mkdir(parents=True)
    summary = {"aggregate_only": True, "settings": settings, "figures": block}
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def _sweep(root: Path, concurrencies: tuple[int, ...] = (4, 16, 64), **changes: Any) -> Path:
    for c in concurrencies:
        write_point(root / "points" / f"c{c}", _settings(c, **changes))
    return root


def test_the_fit_reproduces_points_a_known_roofline_made(tmp_path: Path) -> None:
    points = fp.read_points([_sweep(tmp_path / "off", (2, 4, 16, 64))])
    assert [p.concurrency for p in points] == [2, 4, 16, 64]
    fit = fp.fit_points(points, _roof())  # from the catalog's defaults, not the truth
    report = fit.report()
    assert report["tpot_error_median"] < 0.02
    assert report["ttft_error_median"] < 0.02
    assert report["throughput_error_median"] < 0.02
    assert fit.front_latency_s == pytest.approx(FRONT, rel=0.1)
    # The pull to the start is weak (2% per e-fold): what the points pin comes out at the truth,
    # memory efficiency from a start of 1.0, the overhead from 6.6 ms.
    assert fit.roofline.efficiency.memory == pytest.approx(TRUTH.memory, rel=0.03)
    assert fit.roofline.efficiency.overhead == pytest.approx(TRUTH.overhead, rel=0.03)
    assert not {"memory", "overhead", "front_latency_s"} & set(fit.not_pinned)
    # Held out: a concurrency the fit never saw.
    unseen = fp.read_point(write_point(tmp_path / "c32", _settings(32)))
    f = schedule(unseen.load()).figures(fit.roofline, fit.front_latency_s, 8)
    assert f.median_tpot_s == pytest.approx(unseen.tpot_s, rel=0.03)


def test_the_acceptance_a_speculating_run_implies(tmp_path: Path) -> None:
    fit = fp.fit_points(fp.read_points([_sweep(tmp_path / "off", (2, 4, 16, 64))]), _roof())
    spec = fp.read_point(write_point(tmp_path / "mtp", _settings(4, method="mtp"), k=3, al=2.6))
    found = fp.infer_acceptance(fit, spec, "mtp", 3)
    assert found.acceptance_length == pytest.approx(2.6, abs=0.08)
    assert found.low <= found.acceptance_length <= found.high
    assert found.low >= 1.0 and found.high <= 4.0
    # TPOT is a step function of AL (whole decode steps a request): equal within a step.
    assert found.predicted_tpot_ms == pytest.approx(found.tpot_ms, rel=0.01)


@pytest.mark.parametrize("scale, side", [(0.2, "faster than the model allows even at AL 4"),
                                         (5.0, "slower than the model predicts at AL 1")])  # fmt: skip
def test_no_acceptance_reproduces_the_run(tmp_path: Path, scale: float, side: str) -> None:
    fit = fp.fit_points(fp.read_points([_sweep(tmp_path / "off")]), _roof())
    path = write_point(tmp_path / "mtp", _settings(4, method="mtp"), k=3, al=2.0)
    summary = json.loads((path / "summary.json").read_text())
    summary["figures"]["latency_ms"]["tpot"]["p50"] *= scale
    (path / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(fp.PointsError, match=side) as caught:
        fp.infer_acceptance(fit, fp.read_point(path), "mtp", 3)
    assert "no AL in [1, 4] reproduces this run" in caught.value.lines[0]


def test_fewer_than_three_points_are_refused(tmp_path: Path) -> None:
    points = fp.read_points([_sweep(tmp_path / "off", (4, 16))])
    with pytest.raises(fp.PointsError, match="2 published point"):
        fp.fit_points(points, _roof())


def test_points_of_two_chips_are_refused(tmp_path: Path) -> None:
    a = _sweep(tmp_path / "a", (4, 16))
    b = _sweep(tmp_path / "b", (64,), hardware="b200")
    with pytest.raises(
        fp.PointsError, match=r"settings.hardware: the points differ \(b200, h200\)"
    ):
        fp.check_points(fp.read_points([a, b]))


def test_a_speculating_point_is_refused(tmp_path: Path) -> None:
    root = _sweep(tmp_path / "off", (4, 16))
    write_point(root / "points" / "c8", _settings(8, method="mtp"))
    with pytest.raises(fp.PointsError) as caught:
        fp.check_points(fp.read_points([root]))
    assert "c8/summary.json: settings.method: is 'mtp'" in "\n".join(caught.value.lines)


def test_a_disaggregated_point_without_its_pools_is_refused(tmp_path: Path) -> None:
    """A disaggregated point is priced at its prefill and decode pools: one that states none
    cannot be priced, and the refusal names the field."""
    path = write_point(tmp_path / "c64", _settings(64, disaggregated=True))
    with pytest.raises(fp.PointsError) as caught:
        fp.deployed(_roof(), fp.read_point(path))
    assert "c64/summary.json: settings.prefill: expected an object" in "\n".join(caught.value.lines)


@pytest.mark.parametrize(
    "change, message",
    [({"aggregate_only": False}, "aggregate_only: expected true"),
     ({"figures.latency_ms.tpot.p50": -1.0}, "figures.latency_ms.tpot.p50: expected a number > 0"),
     ({"figures.latency_ms.tpot.p50": float("nan")}, "figures.latency_ms.tpot.p50: expected"),
     ({"settings.concurrency": 0}, "settings.concurrency: expected an integer >= 1, got 0"),
     ({"settings.concurrency": "4"}, "settings.concurrency: expected an integer >= 1, got '4'"),
     ({"settings.gpus": True}, "settings.gpus: expected an integer >= 1, got True")],
)  # fmt: skip
def test_a_bad_point_is_named_by_file_and_field(tmp_path: Path, change: dict[str, Any],
                                                message: str) -> None:  # fmt: skip
    path = write_point(tmp_path / "p", _settings(4))
    summary = json.loads((path / "summary.json").read_text())
    for dotted, value in change.items():
        *parents, last = dotted.split(".")
        target = summary
        for key in parents:
            target = target[key]
        target[last] = value
    (path / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(fp.PointsError) as caught:
        fp.read_point(path)
    assert caught.value.lines[0].startswith(str(path / "summary.json"))
    assert message in caught.value.lines[0]


def test_a_parameter_the_points_cannot_see_is_named(tmp_path: Path) -> None:
    """At concurrency 1 to 4 and short prompts the steps never reach the compute roof: the
    compute efficiency moves no prediction, and the report says so."""
    points = fp.read_points(
        [_sweep(tmp_path / "off", (1, 2, 4), input_tokens={"min": 64, "max": 64})]
    )
    fit = fp.fit_points(points, _roof())
    assert "compute" in fit.not_pinned
    # The pull to the start keeps it where the fit started (the catalog's 0.323), not at the
    # truth's 0.3 that a fit without the pull drifts to on effects under 2%.
    start = _roof().efficiency.compute
    assert abs(start / TRUTH.compute - 1) > 0.05
    assert fit.roofline.efficiency.compute == pytest.approx(start, rel=0.01)


def test_a_fit_that_does_not_describe_its_points_says_so(tmp_path: Path) -> None:
    """Throughputs no closed loop at these TPOTs can give: the fit's own median error stays
    large, and the report says not to predict from it."""
    root = _sweep(tmp_path / "off", (4, 16, 64))
    for c in (4, 16, 64):
        path = root / "points" / f"c{c}" / "summary.json"
        data = json.loads(path.read_text())
        data["figures"]["throughput"]["total_tokens_per_s_per_gpu"] *= 5
        path.write_text(json.dumps(data))
    report = fp.fit_points(fp.read_points([root]), _roof()).report()
    assert report["misfit"] is not None
    assert "does not describe these points" in report["misfit"]
    clean = fp.fit_points(fp.read_points([_sweep(tmp_path / "ok", (4, 16, 64))]), _roof())
    assert clean.report()["misfit"] is None


@pytest.mark.parametrize(
    "key, other", [("hardware", "b200"), ("model", "deepseek-r1"), ("engine", "vllm"),
                   ("precision", "fp4")],
)  # fmt: skip
def test_points_of_two_chips_engines_or_precisions_are_refused(key: str, other: Any) -> None:
    """One fit prices one chip, model, engine and precision."""
    points = [_point(_settings(c)) for c in (4, 16)] + [_point(_settings(64, **{key: other}))]
    with pytest.raises(fp.PointsError, match=rf"settings\.{key}: the points differ") as caught:
        fp.check_points(points)
    assert len(caught.value.lines) == 1


@pytest.mark.parametrize(
    "key, other", [("tensor_parallel", 4), ("expert_parallel", 8), ("dp_attention", True),
                   ("gpus", 4)],
)  # fmt: skip
def test_points_of_two_layouts_are_one_fit(key: str, other: Any) -> None:
    """Layouts may differ: each point is priced at its own (``deployed``)."""
    fp.check_points(
        [_point(_settings(c)) for c in (4, 16)] + [_point(_settings(64, **{key: other}))]
    )


@pytest.mark.parametrize(
    "engine, scheduler",
    [("trt", "mixed"), ("trtllm", "mixed"), ("tensorrt-llm", "mixed"), ("vllm", "mixed"),
     ("sglang", "separate"), ("atom", "separate"), (None, "separate")],
)  # fmt: skip
def test_each_engine_is_simulated_with_its_scheduler(engine: str | None, scheduler: str) -> None:
    """TensorRT-LLM and vLLM mix prompt chunks into decode steps; SGLang and ATOM prefill apart
    (DESIGN: "Predictions for GPUs")."""
    assert _point(_settings(4, engine=engine)).load().scheduler == scheduler


def test_an_imported_tensorrt_llm_point_mixes_its_prefills(tmp_path: Path) -> None:
    """InferenceX names TensorRT-LLM ``trt``; imported, its point is simulated as ``mixed``."""
    raw = inferencex_point(framework="trt", hardware="h200", decode_ep=8)
    summary = published_read.inferencex_summary(published_read.Published("f", 0, raw))
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    point = fp.read_point(tmp_path)
    assert point.settings["engine"] == "trt"
    assert point.load().scheduler == "mixed"


def _point(settings: dict[str, Any], tpot_s: float = 0.02, ttft_s: float = 0.3,
           tput: float = 500.0) -> fp.Point:  # fmt: skip
    return fp.Point(Path(f"c{settings['concurrency']}"), settings, tpot_s, ttft_s, tput)


def _fit_by_hand(errors: dict[str, list[float]]) -> fp.Fit:
    """A fit on the truth roofline whose predictions miss three points' measurements by the
    given errors (predicted / measured - 1), per figure and point."""
    tpot, ttft, tput = 0.02, 0.3, 500.0  # the predictions
    points, figures = [], []
    for c, e in zip((4, 16, 64), zip(*errors.values(), strict=True), strict=True):
        figures.append(Figures(ttft_s=np.array([ttft]), tpot_s=np.array([tpot]),
                               e2e_s=np.array([ttft + 255 * tpot]), itl_s=np.array([tpot]),
                               itl_weights=np.array([1.0]), duration_s=1280 / tput / 8,
                               input_tokens=1024, output_tokens=256, gpus=8))  # fmt: skip
        points.append(_point(_settings(c), tpot / (1 + e[0]), ttft / (1 + e[1]), tput / (1 + e[2])))
    return fp.Fit(_roof(TRUTH), FRONT, points, figures, [], [_roof(TRUTH)] * len(points))


def _errors(
    tpot: list[float], ttft: list[float], throughput: list[float]
) -> dict[str, list[float]]:
    return {"tpot": tpot, "ttft": ttft, "throughput_per_gpu": throughput}


def test_the_report_gives_each_figures_median_error() -> None:
    """One point far off on every figure: the median of three errors is the second largest, and
    one bad point does not make the fit a misfit (their mean would, on TPOT: 31%)."""
    fit = _fit_by_hand(_errors([0.01, -0.02, 0.9], [0.3, -0.03, 0.04], [-0.05, 0.02, -0.6]))
    report = fit.report()
    assert [p["error"]["tpot"] for p in report["points"]] == pytest.approx([0.01, -0.02, 0.9])
    assert report["tpot_error_median"] == pytest.approx(0.02)
    assert report["ttft_error_median"] == pytest.approx(0.04)
    assert report["throughput_error_median"] == pytest.approx(0.05)
    assert report["misfit"] is None
    # Two points of three over 25% on TPOT alone: a misfit, named by that figure only.
    misfit = _fit_by_hand(
        _errors([0.3, -0.4, 0.01], [0.3, -0.03, 0.04], [0.5, 0.02, -0.1])
    ).report()
    assert misfit["misfit"] is not None
    assert "median error TPOT 30.0%, over 25%" in misfit["misfit"]


def _model_tpot(point: fp.Point, al: float) -> float:
    roof = replace(_roof(TRUTH), method="mtp")
    return schedule(point.load(3, al)).figures(roof, FRONT, point.gpus).median_tpot_s


def test_the_al_range_is_the_fits_largest_tpot_error_either_way(tmp_path: Path) -> None:
    """The range is the AL at the measured TPOT moved by the fit's largest TPOT residual either
    way: none for a fit exact on TPOT, however far off its TTFT and throughput."""
    spec = fp.read_point(write_point(tmp_path / "mtp", _settings(4, method="mtp"), k=3, al=2.6))
    far = {"ttft": [0.5, -0.4, 0.3], "throughput": [0.2, -0.3, 0.1]}
    exact = fp.infer_acceptance(_fit_by_hand(_errors([0.0, 0.0, 0.0], **far)), spec, "mtp", 3)
    assert exact.acceptance_length == pytest.approx(2.6, abs=0.08)
    assert exact.low == pytest.approx(exact.acceptance_length, abs=1e-9)
    assert exact.high == pytest.approx(exact.acceptance_length, abs=1e-9)
    # Largest TPOT error 10% (predicted 0.9 x measured): the model at the range's ends gives
    # the measured TPOT over 0.9 (fewer drafts accepted) and times 0.9 (more), within a
    # decode step's share of TPOT.
    loose = fp.infer_acceptance(_fit_by_hand(_errors([0.05, -0.1, 0.02], **far)), spec, "mtp", 3)
    assert loose.low < loose.acceptance_length < loose.high
    assert loose.predicted_tpot_ms == pytest.approx(loose.tpot_ms, rel=0.01)  # at the AL found
    assert _model_tpot(spec, loose.low) == pytest.approx(spec.tpot_s / 0.9, rel=0.01)
    assert _model_tpot(spec, loose.high) == pytest.approx(spec.tpot_s * 0.9, rel=0.01)


@pytest.mark.parametrize("al", [3.9, 4.0])
def test_the_al_is_searched_up_to_k_plus_one(tmp_path: Path, al: float) -> None:
    """A run that accepted (nearly) every draft: its AL is found between K and K + 1."""
    spec = fp.read_point(write_point(tmp_path / "mtp", _settings(4, method="mtp"), k=3, al=al))
    fit = _fit_by_hand(_errors([0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]))
    found = fp.infer_acceptance(fit, spec, "mtp", 3)
    assert found.acceptance_length == pytest.approx(al, abs=0.08)
    assert 3.0 < found.low <= found.high <= 4.0


def _fitted(fit: fp.Fit) -> dict[str, float]:
    e = fit.roofline.efficiency
    return {"compute": e.compute, "memory": e.memory, "overhead": e.overhead,
            "per_token": e.per_token, "front_latency_s": fit.front_latency_s}  # fmt: skip


def test_not_pinned_down_is_what_a_2x_move_changes_by_under_2_percent(tmp_path: Path) -> None:
    """Each parameter moved 2x (halved where doubling leaves its bounds) and every point's
    three figures priced again: the report names exactly those that change none by 2%. At
    concurrency 1 to 3 and short prompts, compute moves nothing and a decode token's price
    under 2% (a step carries at most 3 of them): both named."""
    points = fp.read_points(
        [_sweep(tmp_path / "off", (1, 2, 3), input_tokens={"min": 64, "max": 64})]
    )
    fit = fp.fit_points(points, _roof())
    values = _fitted(fit)
    loads = [schedule(p.load()) for p in points]

    def figures(v: dict[str, float]) -> np.ndarray:
        update = {k: x for k, x in v.items() if k != "front_latency_s"}
        roof = replace(fit.roofline, efficiency=fit.roofline.efficiency.model_copy(update=update))
        out = [
            s.figures(roof, v["front_latency_s"], p.gpus)
            for s, p in zip(loads, points, strict=True)
        ]
        return np.log([[f.median_tpot_s, f.median_ttft_s, f.throughput_per_gpu] for f in out])

    base, effects = figures(values), {}
    for name, value in values.items():
        factor = 2.0 if 2 * value <= fp.PARAMETERS[name][1] else 0.5
        effects[name] = float(np.max(np.abs(figures({**values, name: value * factor}) - base)))
    unseen = {name for name, effect in effects.items() if effect < np.log1p(0.02)}
    assert set(fit.not_pinned) == unseen
    assert {"compute", "per_token"} <= unseen, effects
    assert effects["per_token"] > np.log1p(0.005)  # seen, a little: under 2%, over 0.5%


def test_a_start_priced_per_sequence_is_fitted_per_token(tmp_path: Path) -> None:
    """A roofline that prices a decode step per sequence starts the fit at that price per token
    (on one-token decode steps the two are one), and the fitted roofline prices per token only.
    At concurrency 1 to 4 the points barely see that price, so the fit keeps it near its start;
    a start with neither price starts at the bound and still fits."""
    points = fp.read_points(
        [_sweep(tmp_path / "off", (1, 2, 4), input_tokens={"min": 64, "max": 64})]
    )
    default = _roof().efficiency
    per_seq = default.model_copy(update={"per_token": 0.0, "per_sequence": default.per_token})
    fit = fp.fit_points(points, _roof(per_seq))
    assert fit.roofline.efficiency.per_sequence == 0.0
    assert fit.roofline.efficiency.per_token == pytest.approx(default.per_token, rel=0.1)
    free = default.model_copy(update={"per_token": 0.0, "per_sequence": 0.0})
    report = fp.fit_points(points, _roof(free)).report()
    assert report["tpot_error_median"] < 0.02 and report["throughput_error_median"] < 0.02


def test_a_points_gpus_are_its_stated_gpus_before_its_tensor_parallelism() -> None:
    """Throughput per GPU divides by the GPUs the point states; without them, by its TP."""
    assert _point(_settings(4, gpus=16, tensor_parallel=8)).gpus == 16
    assert _point(_settings(4, gpus=None, tensor_parallel=4)).gpus == 4
    assert _point(_settings(4, gpus=None, tensor_parallel=None)).gpus == 1


@pytest.mark.parametrize("al, end", [(1.05, "low"), (3.95, "high")])
def test_the_al_range_stops_at_1_and_k_plus_1(tmp_path: Path, al: float, end: str) -> None:
    """Near an end of [1, K + 1], a TPOT 10% off that no AL reaches bounds the range at that
    end (AL 1: no draft accepted; K + 1: every one)."""
    spec = fp.read_point(write_point(tmp_path / "mtp", _settings(4, method="mtp"), k=3, al=al))
    fit = _fit_by_hand(_errors([0.05, -0.1, 0.02], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]))
    found = fp.infer_acceptance(fit, spec, "mtp", 3)
    assert found.acceptance_length == pytest.approx(al, abs=0.08)
    if end == "low":
        assert found.low == 1.0 and found.acceptance_length < found.high < 4.0
    else:
        assert found.high == 4.0 and 1.0 < found.low < found.acceptance_length


def test_a_point_is_simulated_at_its_benchmarks_longest_lengths() -> None:
    """A summary states the drawn lengths' range; the loop draws on [0.8 L, L] from its top."""
    lengths = {"input_tokens": {"min": 819, "max": 1024}, "output_tokens": {"min": 204, "max": 256}}
    load = _point(_settings(4, **lengths)).load()
    assert (load.input_tokens, load.output_tokens) == (1024, 256)
