"""The machine a benchmark ran on, for its README row: the CPU model (ratios between engines move
with it), the cores and the load average when the run started (a busy machine slows a run)."""

from __future__ import annotations

import os
import platform
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


if __name__ == "__main__":
    print(describe())
