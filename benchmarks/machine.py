"""The machine a benchmark ran on, for its README row: the CPU model (ratios between engines move
with it), the cores and the load average when the run started (a busy machine slows a run), and
the memory bandwidth a step's bound is priced at."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it, else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def describe() -> str:
    """One line: ``2-core AMD EPYC, load average 0.31``."""
    load = f", load average {os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else ""
    return f"{os.cpu_count()}-core {cpu_model()}{load}"


def read_bandwidth() -> float:
    """Bytes per second of a read of a 512 MiB float32 tensor on the calling process's torch
    threads (best of 5): what a decode step reading its weights could at most reach now."""
    import torch

    data = torch.ones(128 << 20)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.numel() * data.element_size() / best


if __name__ == "__main__":
    print(describe())
