"""``speclens calibrate --host``: measure this machine as a chip entry for the roofline.

Memory bandwidth: the best of a few copies of a buffer far larger than the caches (bytes read
plus bytes written over the time). Matmul FLOP/s: a weight matrix of a small model's width
times activations of 1 to 256 tokens, the batch widths decode steps run at; the entry's peak is
the best of them, and the curve is kept beside it (``measured``), since a CPU reaches its peak
only at the widest. torch runs the matmuls where it is installed (bf16 and fp32, as the engine
would); numpy otherwise (fp32 only, which then stands for bf16 too, and the notes say so).

Another process busy for a second reads as a slow chip: two intra-op threads on two cores wait
at each barrier for the one descheduled, and a 1-token bf16 product, a fraction of a
millisecond, came out 10x slow in every trial of a burst (0.0021 against 0.026 TFLOP/s).
So the curve is measured in ``PASSES`` passes, each point the best of ``TRIALS`` runs and at
least ``MIN_POINT_S`` of them, and each point keeps its best pass; and the CPU other processes
used meanwhile is recorded (``measured.others_cpus``), with a note where it was half a CPU or
more.
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
#: Passes over the matmul curve, and the least time a point's trials take in each.
PASSES = 3
MIN_POINT_S = 0.03
#: Other processes' average CPUs during the measurement from which the entry says so.
BUSY_CPUS = 0.5


def _best(run: Callable[[], Any], trials: int = TRIALS, min_s: float = 0.0) -> float:
    """The shortest of at least ``trials`` timed runs lasting ``min_s`` in all, after one
    warm-up."""
    run()
    best, spent, done = float("inf"), 0.0, 0
    while done < trials or spent < min_s:
        start = time.perf_counter()
        run()
        took = time.perf_counter() - start
        best, spent, done = min(best, took), spent + took, done + 1
    return best


def _cpu_ticks() -> tuple[float, float] | None:
    """(busy, all) CPU seconds since boot over every CPU (``/proc/stat``), or None off Linux."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields) - idle) / tick, sum(fields) / tick


def memory_bandwidth() -> float:
    """Bytes per second a large copy reaches (read and write counted)."""
    src = np.ones(COPY_BYTES // 8)
    dst = np.empty_like(src)
    return 2 * src.nbytes / _best(lambda: np.copyto(dst, src))


def _product(dtype: str, tokens: int) -> Callable[[], Any]:
    """(tokens x WIDTH) @ (WIDTH x DEPTH) in ``dtype``: torch's where installed, else numpy's."""
    try:
        import torch
    except ImportError:
        na, nw = np.ones((tokens, WIDTH), np.float32), np.ones((WIDTH, DEPTH), np.float32)
        return lambda: na @ nw
    kind = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    a, w = torch.ones(tokens, WIDTH, dtype=kind), torch.ones(WIDTH, DEPTH, dtype=kind)
    return lambda: a @ w


def matmul_flops(dtypes: tuple[str, ...], passes: int = PASSES) -> dict[str, dict[int, float]]:
    """FLOP/s of (tokens x WIDTH) @ (WIDTH x DEPTH) per dtype and token width, each point the
    best of ``passes`` passes over the whole curve."""
    products = {(d, t): _product(d, t) for d in dtypes for t in TOKENS}
    seconds = dict.fromkeys(products, float("inf"))
    for _ in range(passes):
        for key, run in products.items():
            seconds[key] = min(seconds[key], _best(run, min_s=MIN_POINT_S))
    return {d: {t: 2 * t * WIDTH * DEPTH / seconds[d, t] for t in TOKENS} for d in dtypes}


def _memory_gb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


def busy_note(others: float | None) -> str | None:
    """What a measurement beside ``others`` CPUs of other processes' work says of itself (from
    ``BUSY_CPUS``), or None."""
    if others is None or others < BUSY_CPUS:
        return None
    return (f"other processes used {others:.1f} CPUs while this machine was measured: its "
            f"figures may read low; measure again on an idle machine")  # fmt: skip


def measure(name: str = "host") -> dict[str, Any]:
    """A chip entry (``kind: Chip``) for this machine, with what was measured and how."""
    try:
        import torch

        threads = torch.get_num_threads()
        dtypes: tuple[str, ...] = ("bf16", "fp32")
    except ImportError:
        threads, dtypes = 1, ("fp32",)
    before, own = _cpu_ticks(), time.process_time()
    curves = matmul_flops(dtypes)
    bandwidth = memory_bandwidth()
    after, own = _cpu_ticks(), time.process_time() - own
    others = None
    if before is not None and after is not None and after[1] > before[1]:
        cpus = os.cpu_count() or 1
        others = max(0.0, (after[0] - before[0] - own) / (after[1] - before[1]) * cpus)
    tflops = {dtype: max(curve.values()) / 1e12 for dtype, curve in curves.items()}
    notes = ["measured by speclens calibrate --host"]
    if "bf16" not in tflops:
        tflops["bf16"] = tflops["fp32"]
        notes.append("bf16 is the fp32 figure (no torch to run bf16)")
    notes.append("interconnect is half the memory bandwidth (ranks share this machine's memory)")
    busy = busy_note(others)
    if busy:
        notes.append(busy)
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
            "passes": PASSES,
            "others_cpus": None if others is None else round(others, 3),
            "machine": platform.machine(),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    }
