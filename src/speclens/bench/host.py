"""The load on the machine the client runs on, recorded with every bench run: two runs of one
configuration measured 10 minutes apart on a loaded 2-core machine differed by 5% to 24%, for
reasons neither run's requests show. compare prints it beside the runs it compares."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: Where Linux keeps the CPU time counters (steal: time a hypervisor gave another guest).
PROC_STAT = Path("/proc/stat")


def host_load() -> dict[str, Any]:
    """Load average (1, 5, 15 min), CPU count, and the share of CPU time stolen by the
    hypervisor since boot (percent; None where the system does not say)."""
    try:
        load: list[float] | None = [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        load = None
    return {"load_average": load, "cpus": os.cpu_count(), "steal_percent": steal_percent()}


def steal_percent(path: Path = PROC_STAT) -> float | None:
    """Stolen CPU time over all CPU time since boot, from the first line of ``/proc/stat``
    (user nice system idle iowait irq softirq steal ...), in percent."""
    try:
        with path.open("rb") as fh:
            first = fh.readline(4096).split()
        counts = [int(v) for v in first[1:9]]
    except (OSError, ValueError):
        return None
    if len(counts) < 8 or first[0] != b"cpu" or sum(counts) <= 0:
        return None
    return round(100.0 * counts[7] / sum(counts), 3)
