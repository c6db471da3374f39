"""The fit held to figures the closed loop under test never computed.

- By hand: one client (concurrency 1) runs each request alone, so its figures have a closed form
  in the roofline's own step prices (a prompt's prefill step, then one decode step per output
  token less one, at a context one longer each step); points made so must be reproduced.
- Published: InferenceX's measured MI355X points (SGLang, FP8, 1024 / 1024, TP 8, MTP off, one
  date at concurrency 4, 8, 16 and 64); calibrated on three of them, the fit must predict the
  fourth within the held-out goals of ``benchmarks/inferencex.py`` (10% TPOT and throughput per
  GPU, 25% TTFT)."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from publishedkit import INFERENCEX_DIR
from speclens.runs import published_read
from speclens.sim import catalog
from speclens.sim import fit_points as fp
from speclens.sim.closed_loop import Load, schedule
from speclens.sim.roofline import Efficiency, Roofline

TRUTH = Efficiency(compute=0.3, memory=0.6, overhead=4e-3, per_sequence=0.0, per_token=3e-5)
FRONT = 0.08
GPUS = 8


def _roof(efficiency: Efficiency | None = None) -> Roofline:
    roof = Roofline(catalog.model("deepseek-v3"), catalog.chip("h200"), GPUS)
    return replace(roof, efficiency=efficiency) if efficiency is not None else roof


def _one_client(roof: Roofline, inputs: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
    """Median TTFT and TPOT (s) and throughput per GPU of requests run one after another, each
    priced step by step: its prompt in one prefill step (a prompt token attends over half the
    prompt on average, causal), then ``output - 1`` decode steps of one token, the first at
    context ``prompt + 1``; the client adds ``FRONT`` to each TTFT and to each request's cycle."""
    ttft, tpot, busy = [], [], 0.0
    for prompt, output in zip(inputs.tolist(), outputs.tolist(), strict=True):
        prefill = float(roof.prefill(prompt, 1, prompt / 2))
        steps = output - 1
        context = prompt + 1 + np.arange(steps)
        decode = float(np.sum(roof.decode(np.ones(steps, dtype=np.int64),
                                          np.ones(steps, dtype=np.int64), context,
                                          np.zeros(steps, dtype=np.int64), 0)))  # fmt: skip
        ttft.append(prefill + FRONT)
        tpot.append(decode / steps)
        busy += prefill + decode + FRONT
    tokens = int(inputs.sum() + outputs.sum())
    return {"ttft": statistics.median(ttft), "tpot": statistics.median(tpot),
            "throughput": tokens / busy / GPUS}  # fmt: skip


def _summary(settings: dict[str, Any], tpot_s: float, ttft_s: float, tput: float) -> dict[str, Any]:
    return {"aggregate_only": True, "settings": settings,
            "figures": {"latency_ms": {"tpot": {"p50": tpot_s * 1e3}, "ttft": {"p50": ttft_s * 1e3}},
                        "throughput": {"total_tokens_per_s_per_gpu": tput}}}  # fmt: skip


def _settings(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {"model": "deepseek-v3", "hardware": "h200", "engine": "sglang", "precision": "fp8",
            "tensor_parallel": GPUS, "expert_parallel": 1, "dp_attention": False, "gpus": GPUS,
            "disaggregated": False, "input_tokens": {"min": input_tokens, "max": input_tokens},
            "output_tokens": {"min": output_tokens, "max": output_tokens}, "concurrency": 1,
            "method": None}  # fmt: skip


def test_the_fit_reproduces_one_clients_points_worked_out_by_hand(tmp_path: Path) -> None:
    truth = _roof(TRUTH)
    points = []
    for prompt, output in ((128, 96), (1024, 192), (6144, 64)):
        # The lengths the benchmark drew for this point (the loop's input, never its result).
        drawn = schedule(Load(1, prompt, output))
        hand = _one_client(truth, drawn.inputs, drawn.outputs)
        # The loop under test agrees with the hand's figures at the truth...
        f = drawn.figures(truth, FRONT, GPUS)
        assert f.median_ttft_s == pytest.approx(hand["ttft"], rel=1e-9)
        assert f.median_tpot_s == pytest.approx(hand["tpot"], rel=1e-9)
        assert f.throughput_per_gpu == pytest.approx(hand["throughput"], rel=1e-9)
        path = tmp_path / f"p{prompt}"
        path.mkdir()
        summary = _summary(
            _settings(prompt, output), hand["tpot"], hand["ttft"], hand["throughput"]
        )
        (path / "summary.json").write_text(json.dumps(summary))
        points.append(fp.read_point(path))
    # ...and the fit, from the catalog's defaults, finds predictions that reproduce them.
    fit = fp.fit_points(points, _roof())
    report = fit.report()
    for figure in ("tpot", "ttft", "throughput"):
        assert report[f"{figure}_error_median"] < 0.02, report
    assert fit.front_latency_s == pytest.approx(FRONT, rel=0.1)


WHERE = [("hardware", "mi355x"), ("framework", "sglang"), ("precision", "fp8"), ("isl", "1024"),
         ("osl", "1024"), ("decode_tp", "8"), ("spec_method", "none"), ("date", "2026-05-27")]  # fmt: skip


def _published(root: Path) -> list[fp.Point]:
    """The deployment's measured points, imported as ``speclens import inferencex`` writes them."""
    found = []
    for name in ("benchmarks.json", "benchmarks-history.json"):
        found += published_read.read_inferencex(INFERENCEX_DIR / name)
    unique, _ = published_read.dedupe(found)
    # The filter leaves one deployment on one date: one configuration.
    [summaries] = published_read.configurations(published_read.select(unique, WHERE)).values()
    for summary in summaries:
        path = root / f"c{summary['settings']['concurrency']}"
        path.mkdir(parents=True)
        (path / "summary.json").write_text(json.dumps(summary))
    return fp.read_points([root / f"c{s['settings']['concurrency']}" for s in summaries])


def _published_roof(settings: dict[str, Any]) -> Roofline:
    model = catalog.with_precision(catalog.model("deepseek-r1"), settings["precision"])
    return Roofline(model, catalog.chip(settings["hardware"]), settings["tensor_parallel"])


@pytest.mark.skipif(
    not (INFERENCEX_DIR / "benchmarks.json").is_file(),
    reason="InferenceX's published data (../shared/data/inferencex/) is not present",
)
def test_published_points_are_the_referee(tmp_path: Path) -> None:
    points = _published(tmp_path / "published")
    assert [p.concurrency for p in points] == [4, 8, 16, 64]
    roof = _published_roof(points[0].settings)
    # On its own points the fit describes the measurements.
    report = fp.fit_points(points, roof).report()
    assert report["misfit"] is None
    for figure in ("tpot", "ttft", "throughput"):
        assert report[f"{figure}_error_median"] < 0.10, report
    # Held out: calibrated on concurrency 4, 16 and 64, concurrency 8 predicted.
    unseen = points[1]
    fit = fp.fit_points([p for p in points if p is not unseen], roof)
    f = schedule(unseen.load()).figures(fit.roofline, fit.front_latency_s, unseen.gpus)
    assert f.median_tpot_s == pytest.approx(unseen.tpot_s, rel=0.10)
    assert f.throughput_per_gpu == pytest.approx(unseen.throughput_per_gpu, rel=0.10)
    assert f.median_ttft_s == pytest.approx(unseen.ttft_s, rel=0.25)
