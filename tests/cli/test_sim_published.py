"""``speclens sim --trace`` on published points: each point's load replayed on a calibrated
roofline, written as published points of the same shape; and what it refuses.

The expected figures are worked out here by hand from DESIGN.md's roofline formula and the
benchmark's closed loop ("Predictions for GPUs"), for a toy dense model on a toy chip whose
entries the cost file holds in full, never from ``Roofline``, ``Shape`` or ``closed_loop``: at
concurrency 1 each request is one prefill step and ⌈(O - 1) / AL⌉ decode steps, alone in the
engine, so every step's price is the formula's at one sequence.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from aggregatekit import write_point, write_sweep
from toyrooflinekit import (
    BANDWIDTH,
    BYTES,
    COMPUTE,
    FRONT,
    HIDDEN,
    INTERCONNECT,
    KV_BYTES,
    KV_HEADS,
    LATENCY,
    LAYER_PARAMS,
    LAYERS,
    LINK,
    LM_HEAD,
    MEMORY,
    OVERHEAD,
    PAIR,
    PARAMS,
    PER_TOKEN,
    TFLOPS,
    cost_file,
    toy_point,
)


def _forward(tokens: float, context: float, chips: int, precision: str) -> float:
    """One forward of ``tokens`` query tokens of one sequence over ``context`` tokens, on
    ``chips`` (TP): the weights read once (or their FLOPs), attention's KV reads (or its FLOPs;
    the KV splits over min(chips, 4 KV heads)), and 2 ring all-reduces a layer of ``tokens``
    bf16 activations past one chip."""
    peak = TFLOPS[precision]
    linear = max(2 * PARAMS * tokens / (peak * COMPUTE * chips),
                 PARAMS * BYTES[precision] / (BANDWIDTH * MEMORY * chips))  # fmt: skip
    attention = max(PAIR * tokens * context / (peak * COMPUTE * chips),
                    KV_BYTES * context / (BANDWIDTH * MEMORY * min(chips, KV_HEADS)))  # fmt: skip
    ring = 0.0
    if chips > 1:
        wire = 2 * (chips - 1) / chips * tokens * HIDDEN * 2 / (LINK * INTERCONNECT)
        ring = 2 * LAYERS * (wire + LATENCY)
    return linear + attention + ring


def _mtp_draft(chips: int, precision: str) -> float:
    """One drafter forward of ``mtp`` on a model without MTP layers, one drafting request: one
    average layer and the LM head (its weights read once), and a layer's share of the
    collectives."""
    flops = 2 * (LAYER_PARAMS + LM_HEAD)
    read = (LAYER_PARAMS + LM_HEAD) * BYTES[precision]
    linear = max(flops / (TFLOPS[precision] * COMPUTE * chips),
                 read / (BANDWIDTH * MEMORY * chips))  # fmt: skip
    if chips > 1:
        wire = 2 * (chips - 1) / chips * HIDDEN * 2 / (LINK * INTERCONNECT)
        linear += (1 / LAYERS) * 2 * LAYERS * (wire + LATENCY)
    return linear


def _expected(isl: int, osl: int, chips: int, gpus: int, precision: str, k: int = 0,
              al: float = 1.0, front: float = FRONT) -> dict[str, float]:  # fmt: skip
    """Median TPOT and TTFT (ms) and throughput per GPU at concurrency 1: each request prefills
    its prompt (p tokens, attending p / 2 on average) in a step of its own, then decodes in
    ⌈(O - 1) / AL⌉ steps of K + 1 positions (plus K drafter forwards), its context starting at
    p + 1 and growing by AL a step."""
    # The benchmark's lengths: uniform on [⌊0.8 L⌋, L], 10 requests a client, seed 0, the
    # prompts drawn before the outputs (the draws, not the prices, come from numpy).
    rng = np.random.default_rng(0)
    inputs, outputs = (rng.integers(max(1, math.floor(0.8 * top)), top + 1, 10)
                       for top in (isl, osl))  # fmt: skip
    clock, ttfts, tpots = 0.0, [], []
    for p, o in zip(inputs.tolist(), outputs.tolist(), strict=True):
        prefill = OVERHEAD + _forward(p, p / 2, chips, precision)
        clock += prefill
        ttfts.append(prefill + front)
        steps = math.ceil((o - 1) / al) if o > 1 else 0
        decode = 0.0
        for s in range(steps):
            decode += (OVERHEAD + PER_TOKEN * (k + 1) + _forward(k + 1, p + 1 + al * s, chips,
                       precision) + k * (_mtp_draft(chips, precision) if k else 0.0))  # fmt: skip
        clock += decode
        if o > 1:
            tpots.append(decode / (o - 1))
    tokens = int(inputs.sum() + outputs.sum())
    return {"tpot_ms": float(np.median(tpots)) * 1e3, "ttft_ms": float(np.median(ttfts)) * 1e3,
            "throughput_per_gpu": tokens / (clock + front * 10) / gpus}  # fmt: skip


def test_the_cost_file_written_here_is_the_one_calibrate_writes(tmp_path: Path) -> None:
    from speclens.sim.calibrate import KIND, read_cost_file

    assert KIND == "StepCostFit"
    roof, meta = read_cost_file(cost_file(tmp_path / "c.yaml"))
    assert roof.model.name == "toy-llm" and roof.efficiency.per_token == PER_TOKEN
    assert meta["front_latency_s"] == FRONT


def _predicted(run_cli: Any, trace: Path, cost: Path, *flags: str | Path) -> dict[str, Any]:
    code, stdout, err = run_cli("sim", "--trace", trace, "--step-cost", cost, "--json", *flags)
    assert code == 0, err
    return json.loads(stdout)


def _assert_figures(row: dict[str, Any], want: dict[str, float]) -> None:
    for key in ("tpot_ms", "ttft_ms", "throughput_per_gpu"):
        assert row[key]["predicted"] == pytest.approx(want[key], rel=1e-6), key


def test_a_point_is_priced_by_the_formula_at_its_precision(run_cli, tmp_path: Path) -> None:
    """FP8 points on a cost file whose model entry says bf16: the point's precision reads each
    weight in one byte at the FP8 peak; the client's front latency lands on every TTFT and on
    each client's cycle."""
    run = write_point(tmp_path / "c1", toy_point(precision="fp8"))
    result = _predicted(run_cli, run, cost_file(tmp_path / "c.yaml"))
    want = _expected(8, 6, chips=1, gpus=1, precision="fp8")
    # Worked out: a decode step at context 10 costs 1 ms + 0.1 ms + 64,225,280 B at 0.5 TB/s
    # (128.45 us) + 40,960 B of KV (81.92 ns): 1.2285324 ms.
    assert OVERHEAD + PER_TOKEN + _forward(1, 10, 1, "fp8") == pytest.approx(1.2285324e-3, rel=1e-7)
    _assert_figures(result["points"][0], want)
    assert result["points"][0]["tpot_ms"]["trace"] == 10.0
    without_front = _expected(8, 6, chips=1, gpus=1, precision="fp8", front=0.0)
    assert want["ttft_ms"] - without_front["ttft_ms"] == pytest.approx(FRONT * 1e3)


def test_the_precision_flag_prices_the_weights_at_it(run_cli, tmp_path: Path) -> None:
    run = write_point(tmp_path / "c1", toy_point(precision="fp8"))
    result = _predicted(run_cli, run, cost_file(tmp_path / "c.yaml"), "--precision", "fp4")
    _assert_figures(result["points"][0], _expected(8, 6, chips=1, gpus=1, precision="fp4"))


def test_each_point_is_replayed_at_the_given_acceptance(run_cli, tmp_path: Path) -> None:
    """MTP at K 3 and AL 2.5 (the toy model has no MTP layer: one average layer and the LM
    head draft): a point's outputs of 4 to 6 tokens take 2 verify steps of 4 positions."""
    trace = write_sweep(tmp_path / "mtp", [toy_point(1, method="mtp", k=3, precision="fp8")])
    out = tmp_path / "pred"
    code, _, err = run_cli("sim", "--trace", trace, "--step-cost", cost_file(tmp_path / "c.yaml"),
                           "--method", "mtp", "--num-speculative-tokens", "3",
                           "--acceptance-length", "2.5", "--output-dir", out)  # fmt: skip
    assert code == 0, err
    got = json.loads((out / "points" / "c1" / "summary.json").read_text())
    assert got["aggregate_only"] is True and got["settings"]["executor"] == "sim"
    assert got["settings"]["method"] == "mtp" and got["settings"]["num_spec_tokens"] == 3
    assert got["figures"]["acceptance"] == {"acceptance_length": 2.5, "num_spec_tokens": 3}
    want = _expected(8, 6, chips=1, gpus=1, precision="fp8", k=3, al=2.5)
    figures = got["figures"]
    assert figures["latency_ms"]["tpot"]["p50"] == pytest.approx(want["tpot_ms"], rel=1e-6)
    assert figures["latency_ms"]["ttft"]["p50"] == pytest.approx(want["ttft_ms"], rel=1e-6)
    assert figures["throughput"]["total_tokens_per_s_per_gpu"] == pytest.approx(
        want["throughput_per_gpu"], rel=1e-6)  # fmt: skip
    assert (out / "sweep.json").is_file()


def test_a_point_of_another_tp_is_priced_at_its_own(run_cli, tmp_path: Path) -> None:
    """A roofline calibrated at TP 8 replays a TP 4 point of 4 GPUs at TP 4: its weights over 4
    chips, its KV over its 4 KV heads, its all-reduces among 4, its throughput over 4 GPUs,
    and says that the efficiencies were fitted at another deployment."""
    run = write_point(tmp_path / "c1", toy_point(tp=4, gpus=4, precision="fp8"))
    cost = cost_file(tmp_path / "c.yaml", parallel=8)
    code, stdout, err = run_cli("sim", "--trace", run, "--step-cost", cost, "--json")
    assert code == 0, err
    row = json.loads(stdout)["points"][0]
    want = _expected(8, 6, chips=4, gpus=4, precision="fp8")
    at_tp8 = _expected(8, 6, chips=8, gpus=4, precision="fp8")
    assert abs(want["tpot_ms"] / at_tp8["tpot_ms"] - 1) > 0.01  # the two prices differ
    _assert_figures(row, want)
    said = " ".join(err.split())
    assert "fitted at TP 8, EP 1; the points at TP 4, EP 1 are priced at their own" in said


def test_a_replay_past_the_fitted_concurrencies_says_it_extrapolates(
    run_cli, tmp_path: Path
) -> None:  # fmt: skip
    trace = write_sweep(tmp_path / "s", [toy_point(c) for c in (2, 64)])
    out = tmp_path / "pred"
    code, _, err = run_cli("sim", "--trace", trace, "--step-cost", cost_file(tmp_path / "c.yaml"),
                           "--output-dir", out)  # fmt: skip
    assert code == 0, err
    said = " ".join(err.split())
    assert ("note: the step cost was fitted on batches of 1 to 4 requests and this run reaches "
            "2 to 64: outside them it extrapolates") in said  # fmt: skip
    got = json.loads((out / "points" / "c64" / "summary.json").read_text())
    assert any("outside them it extrapolates" in n for n in got["provenance"]["notes"])
    code, _, err = run_cli("sim", "--trace", write_point(tmp_path / "c4", toy_point(4)),
                           "--step-cost", tmp_path / "c.yaml")  # fmt: skip
    assert code == 0 and "extrapolates" not in err  # inside the fitted widths: no note


def test_a_fit_that_said_do_not_predict_from_it_is_repeated(run_cli, tmp_path: Path) -> None:
    misfit = ("the fitted roofline does not describe these points (median error TPOT 40.0%, "
              "over 25%): do not predict from it")  # fmt: skip
    cost = cost_file(tmp_path / "c.yaml", fit={"misfit": misfit})
    run = write_point(tmp_path / "c1", toy_point())
    code, stdout, err = run_cli("sim", "--trace", run, "--step-cost", cost, "--json")
    assert code == 0, err
    assert f"note: {cost}: {misfit}" in " ".join(err.split())
    assert json.loads(stdout)["notes"] == [f"{cost}: {misfit}"]


@pytest.mark.parametrize(
    "flags, code, message",
    [(["--method", "mtp", "--acceptance-length", "2"], 2, "--method: goes with"),
     (["--num-speculative-tokens", "3"], 2, "go with --method"),
     (["--method", "mtp", "--num-speculative-tokens", "3", "--acceptance-length", "4.5"], 2,
      "--acceptance-length"),
     (["--precision", "fp3"], 2, "--precision: expected one of fp8, fp4"),
     ([], 2, "roofline: published points are replayed on a roofline")],
)  # fmt: skip
def test_usage_errors(run_cli, tmp_path: Path, flags: list[str], code: int, message: str) -> None:
    cost = cost_file(tmp_path / "c.yaml")
    if not flags:
        cost.write_text(yaml.safe_dump({"kind": "StepCostFit",
                                        "step_cost": {"base": 0.01}}))  # fmt: skip
    trace = write_sweep(tmp_path / "s", [toy_point(c) for c in (1, 4)])
    got, _, err = run_cli("sim", "--trace", trace, "--step-cost", cost, *flags,
                          "--output-dir", tmp_path / "out")  # fmt: skip
    assert got == code and message in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("key, ran", [("hardware", "h200"), ("model", "llama-3.1-8b")])
def test_a_cost_fitted_on_another_chip_or_model_is_refused(run_cli, tmp_path: Path, key: str,
                                                           ran: str) -> None:  # fmt: skip
    trace = write_sweep(tmp_path / "s", [toy_point(1, **{key: ran})])
    code, _, err = run_cli("sim", "--trace", trace, "--step-cost", cost_file(tmp_path / "c.yaml"),
                           "--output-dir", tmp_path / "out")  # fmt: skip
    fitted = "toy-gpu" if key == "hardware" else "toy-llm"
    assert code == 1 and f"provenance.{key}: fitted on {fitted!r}" in err and repr(ran) in err
    assert not (tmp_path / "out").exists()


def test_a_published_trace_without_a_step_cost_is_priced_at_the_catalogs_defaults(
    run_cli, tmp_path: Path
) -> None:
    """No cost file: the catalog's entries for the points' model and chip price them, and the
    output and each summary say so; a chip the catalog lacks is refused naming the field."""
    point = toy_point(1)
    point["settings"].update(model="deepseek-r1", hardware="h200")
    out = tmp_path / "out"
    code, stdout, err = run_cli("sim", "--trace", write_sweep(tmp_path / "s", [point]),
                                "--output-dir", out)  # fmt: skip
    assert code == 0, err
    said = " ".join((stdout + err).split())
    assert "the catalog's roofline of deepseek-r1 on h200 at its defaults" in said
    assert "no calibration" in said
    assert ("h200's catalog defaults were fitted on single-node points at concurrency 4 to 64 "
            f"and this run reaches {point['settings']['concurrency']}") in said  # fmt: skip
    (summary,) = [json.loads(p.read_text()) for p in out.glob("points/*/summary.json")]
    assert summary["provenance"]["step_cost"] is None
    assert any("no calibration" in n for n in summary["provenance"]["notes"])
    point["settings"]["hardware"] = "tpu9"
    code, _, err = run_cli("sim", "--trace", write_sweep(tmp_path / "t", [point]))
    assert code == 1 and "settings.hardware: 'tpu9' is not in the catalog" in " ".join(err.split())
