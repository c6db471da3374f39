"""A toy dense model on a toy chip, written out in full in a cost file as calibrate writes it
for published points, and published points of that deployment: the predictions' tests work
their expected figures out by hand from these numbers (tests/cli/test_sim_published.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from aggregatekit import summary

# --- The toy model: 2 layers, hidden 1024, 8 heads and 4 KV heads of 128, MLP 4096, vocab 32000.
#   attention a layer   2 * 1024 * 8 * 128 + 2 * 1024 * 4 * 128 = 3,145,728 parameters
#   MLP a layer         3 * 1024 * 4096                          = 12,582,912
#   LM head             32000 * 1024                             = 32,768,000
#   weights a step      2 * (3,145,728 + 12,582,912) + 32,768,000 = 64,225,280 parameters read
#   KV a token          2 layers * 2 (K, V) * 4 heads * 128 * 2 bytes (bf16) = 4,096 bytes
#   attention FLOPs     2 layers * 4 * 8 heads * 128 = 8,192 per query and context token
MODEL = {"kind": "Model", "name": "toy-llm", "source": "written by hand", "num_hidden_layers": 2,
         "hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 4,
         "head_dim": 128, "intermediate_size": 4096, "vocab_size": 32000, "dtype": "bf16",
         "kv_dtype": "bf16"}  # fmt: skip
LAYERS, HIDDEN, KV_HEADS = 2, 1024, 4
LAYER_PARAMS = 3_145_728 + 12_582_912
LM_HEAD = 32_768_000
PARAMS = LAYERS * LAYER_PARAMS + LM_HEAD
KV_BYTES, PAIR = 4096, 8192
BYTES = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5}
# --- The toy chip: 100 / 200 / 400 TFLOP/s at bf16 / fp8 / fp4, 1 TB/s, 100 GB/s of link.
TFLOPS = {"bf16": 100e12, "fp8": 200e12, "fp4": 400e12}
BANDWIDTH, LINK = 1e12, 100e9
CHIP = {"kind": "Chip", "name": "toy-gpu", "source": "written by hand",
        "tflops": {"bf16": 100, "fp8": 200, "fp4": 400}, "memory_gb": 80,
        "memory_bandwidth_tbps": 1.0, "interconnect_gbps": 100}  # fmt: skip
# --- The fitted efficiencies, and the front latency the fit found.
COMPUTE, MEMORY, INTERCONNECT, LATENCY = 0.5, 0.5, 0.5, 1e-5
OVERHEAD, PER_TOKEN, FRONT = 1e-3, 1e-4, 0.05
EFFICIENCY = {"compute": COMPUTE, "memory": MEMORY, "interconnect": INTERCONNECT,
              "overhead": OVERHEAD, "per_sequence": 0.0, "per_token": PER_TOKEN,
              "all_reduce_latency": LATENCY}  # fmt: skip


def cost_file(path: Path, *, parallel: int = 1, fit: dict[str, Any] | None = None,
              chip: dict[str, Any] | None = None, model: str = "toy-llm",
              hardware: str = "toy-gpu") -> Path:  # fmt: skip
    """A cost file as calibrate writes it for published points, written out by hand."""
    document = {
        "kind": "StepCostFit",
        "roofline": {"model": MODEL, "chip": chip or CHIP, "parallel": parallel,
                     "efficiency": EFFICIENCY},
        "fit": {"front_latency_s": FRONT, "batch_widths": [1, 4], "misfit": None,
                **(fit or {})},
        "provenance": {"model": model, "hardware": hardware},
    }  # fmt: skip
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def toy_point(concurrency: int = 1, **over: Any) -> dict[str, Any]:
    base = dict(concurrency=concurrency, model="toy-llm", hardware="toy-gpu", tp=1, gpus=1,
                isl=8, osl=6)  # fmt: skip
    return summary(**(base | over))
