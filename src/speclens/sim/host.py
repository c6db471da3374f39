"""``speclens calibrate --host``: measure this machine as a chip entry for the roofline.

Memory bandwidth: the best of a few copies of a buffer far larger than the caches (bytes read
plus bytes written over the time). Matmul FLOP/s: a weight matrix of a small model's width
times activations of 1 to 256 tokens, the batch widths decode steps run at; the entry's peak is
the best of them, and the curve is kept beside it (``measured``), since a CPU reaches its peak
only at the widest. torch runs the matmuls where it is installed (bf16 and fp32, as the engine
would); numpy otherwise (fp32 only, which then stands for bf16 too, and the notes say so).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np

#: Bytes copied per bandwidth trial (well past any last-level cache).
COPY_BYTES = 256 * 2**20
#: The weight matrix's shape (a small model's MLP projection) and the token widths tried.
WIDTH, DEPTH = 1024, 4096
TOKENS = (1, 4, 16, 64, 256)
TRIALS = 5


def _best(run: Callable[[], Any], trials: int = TRIALS) -> float:
    """The shortest of ``trials`` timed runs, after one warm-up."""
    run()
    best = float("inf")
    for _ in range(trials):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def memory_bandwidth() -> float:
    """Bytes per second a large copy reaches (read and write counted)."""
    src = np.ones(COPY_BYTES // 8)
    dst = np.empty_like(src)
    return 2 * src.nbytes / _best(lambda: np.copyto(dst, src))


def matmul_flops(dtype: str) -> dict[int, float]:
    """FLOP/s of (tokens x WIDTH) @ (WIDTH x DEPTH) per token width, in ``dtype``."""
    out = {}
    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]
    for tokens in TOKENS:
        if torch is not None:
            kind = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
            a, w = torch.ones(tokens, WIDTH, dtype=kind), torch.ones(WIDTH, DEPTH, dtype=kind)

            def product(a: Any = a, w: Any = w) -> Any:
                return a @ w

            seconds = _best(product)
        else:
            na, nw = np.ones((tokens, WIDTH), np.float32), np.ones((WIDTH, DEPTH), np.float32)
            seconds = _best(lambda na=na, nw=nw: na @ nw)
        out[tokens] = 2 * tokens * WIDTH * DEPTH / seconds
    return out


def _memory_gb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


def measure(name: str = "host") -> dict[str, Any]:
    """A chip entry (``kind: Chip``) for this machine, with what was measured and how."""
    try:
        import torch

        threads = torch.get_num_threads()
        dtypes: tuple[str, ...] = ("bf16", "fp32")
    except ImportError:
        threads, dtypes = 1, ("fp32",)
    curves = {dtype: matmul_flops(dtype) for dtype in dtypes}
    bandwidth = memory_bandwidth()
    tflops = {dtype: max(curve.values()) / 1e12 for dtype, curve in curves.items()}
    notes = ["measured by speclens calibrate --host"]
    if "bf16" not in tflops:
        tflops["bf16"] = tflops["fp32"]
        notes.append("bf16 is the fp32 figure (no torch to run bf16)")
    notes.append("interconnect is half the memory bandwidth (ranks share this machine's memory)")
    return {
        "kind": "Chip",
        "name": name,
        "description": f"{platform.processor() or platform.machine()} ({os.cpu_count()} CPUs)",
        "source": "measured",
        "notes": "; ".join(notes),
        "tflops": {k: round(v, 6) for k, v in tflops.items()},
        "memory_gb": round(_memory_gb(), 3),
        "memory_bandwidth_tbps": round(bandwidth / 1e12, 6),
        "interconnect_gbps": round(bandwidth / 2e9, 3),
        "measured": {
            "matmul_tflops_by_tokens": {
                dtype: {str(t): round(f / 1e12, 6) for t, f in curve.items()}
                for dtype, curve in curves.items()
            },
            "matmul_shape": [WIDTH, DEPTH],
            "copy_bytes": COPY_BYTES,
            "threads": threads,
            "machine": platform.machine(),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    }
