"""Published results as their publishers write them, small: InferenceX points (the dashboard
API's shape, metrics in seconds) and a ``vllm bench serve --save-result`` object (the keys
vLLM 0.32's ``vllm/benchmarks/serve.py`` writes). The import tests share them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: Where the published InferenceX data lies, relative to the repository root.
INFERENCEX_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "inferencex"


def metrics(tpot_s: float = 0.01, conc: int = 4, osl: int = 1024, full: bool = True) -> dict[str, Any]:  # fmt: skip
    """A point's metrics: median, p99 (and, ``full``, mean and p90) of each latency."""
    ttft, itl, e2el = 0.1, tpot_s * 0.98, 0.1 + tpot_s * (osl - 1)
    out: dict[str, Any] = {}
    for name, value in (("tpot", tpot_s), ("ttft", ttft), ("itl", itl), ("e2el", e2el)):
        out[f"median_{name}"] = value
        out[f"p99_{name}"] = value * 1.5
        if full:
            out[f"mean_{name}"] = value * 1.05
            out[f"p90_{name}"] = value * 1.3
    per_gpu = conc / (tpot_s * 8)
    out |= {"median_intvty": 1 / tpot_s, "p99_intvty": 0.7 / tpot_s,
            "output_tput_per_gpu": per_gpu, "input_tput_per_gpu": per_gpu,
            "tput_per_gpu": 2 * per_gpu}  # fmt: skip
    if full:
        out |= {"mean_intvty": 0.98 / tpot_s, "std_tpot": 0.0001}
    return out


def point(**over: Any) -> dict[str, Any]:
    """One single-node InferenceX point (mi355x, sglang, fp8, 1024/1024, TP 8, MTP off)."""
    p: dict[str, Any] = {
        "hardware": "mi355x", "framework": "sglang", "model": "dsr1", "precision": "fp8",
        "spec_method": "none", "disagg": False, "is_multinode": False,
        "prefill_tp": 8, "prefill_ep": 1, "prefill_dp_attention": False, "prefill_num_workers": 0,
        "decode_tp": 8, "decode_ep": 1, "decode_dp_attention": False, "decode_num_workers": 0,
        "num_prefill_gpu": 8, "num_decode_gpu": 8, "isl": 1024, "osl": 1024, "conc": 4,
        "image": "lmsysorg/sglang:v0.5.12-rocm700-mi35x", "workers": None, "date": "2026-05-27",
        "run_url": "https://github.com/SemiAnalysisAI/InferenceX/actions/runs/1/attempts/1",
    }  # fmt: skip
    metric_over = over.pop("metrics", None)
    p |= over
    p["metrics"] = metric_over if metric_over is not None else metrics(conc=p["conc"])
    return p


def disagg_point(**over: Any) -> dict[str, Any]:
    """A disaggregated point: 2 prefill workers of TP 8 (16 GPUs), 1 decode worker TP 8 / EP 8."""
    base = dict(
        framework="mori-sglang", disagg=True, is_multinode=True, prefill_num_workers=2,
        num_prefill_gpu=16, decode_ep=8, decode_dp_attention=True, decode_num_workers=1,
        num_decode_gpu=8, conc=256, isl=8192, osl=1024,
    )  # fmt: skip
    return point(**(base | over))


def write_points(path: Path, points: list[Any], nan: bool = False) -> Path:
    """The points as a JSON list (``nan``: Python's json writes NaN as the bare ``NaN`` token)."""
    path.write_text(json.dumps(points, allow_nan=nan), encoding="utf-8")
    return path


def vllm_result(**over: Any) -> dict[str, Any]:
    """A ``vllm bench serve --save-result`` object: 8 random prompts at concurrency 2."""
    out: dict[str, Any] = {
        "date": "20261204-074022", "endpoint_type": "openai", "backend": "openai",
        "label": None, "model_id": "smollm2", "tokenizer_id": "/models/smollm2",
        "num_prompts": 8, "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 2,
        "duration": 4.0, "completed": 8, "failed": 0, "total_input_tokens": 256,
        "total_output_tokens": 128, "request_throughput": 2.0, "request_goodput": None,
        "output_throughput": 32.0, "total_token_throughput": 96.0,
        "max_output_tokens_per_s": 40.0, "max_concurrent_requests": 2, "rtfx": 0.0,
        "latencies": [0.9] * 8, "queue_times": [0.0] * 8,
        "mean_ttft_ms": 120.0, "median_ttft_ms": 110.0, "std_ttft_ms": 5.0, "p99_ttft_ms": 150.0,
        "mean_tpot_ms": 52.0, "median_tpot_ms": 51.0, "std_tpot_ms": 1.0, "p99_tpot_ms": 60.0,
        "mean_itl_ms": 50.0, "median_itl_ms": 49.0, "std_itl_ms": 2.0, "p99_itl_ms": 70.0,
    }  # fmt: skip
    out |= over
    return {k: v for k, v in out.items() if v is not ...}


def write_vllm(path: Path, result: dict[str, Any], nan: bool = False) -> Path:
    path.write_text(json.dumps(result, allow_nan=nan), encoding="utf-8")
    return path


def refused(run_cli: Any, args: list[Any], out: Path) -> str:
    """The one line of a refused import (exit 1), with nothing written."""
    code, stdout, stderr = run_cli(*args, "--output-dir", out)
    assert code == 1, (stdout, stderr)
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert not out.exists()
    return lines[0]
