"""``calibrate --host``: a burst of another process's work must not read as a slow chip.

On the peer tier, a chip entry measured right after a held-out run read bf16 products of 1 and 4
tokens 10x and 20x slow in every trial (0.0011 against 0.027 TFLOP/s), and the roofline fitted on
it was called a misfit of vLLM's runs; a second later the machine measured as usual.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from speclens.sim import host


def test_each_point_keeps_its_best_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst over one pass (or two) is outvoted by the pass it missed, point by point."""
    passes = iter([1.0] * 10 + [0.004] * 5 + [2.0] * 5 + [0.5] * 10)  # dtype-major, per pass
    monkeypatch.setattr(host, "_product", lambda dtype, tokens: (dtype, tokens))
    monkeypatch.setattr(host, "_best", lambda run, min_s=0.0: next(passes))
    curves = host.matmul_flops(("bf16", "fp32"), passes=3)
    flops = {t: 2 * t * host.WIDTH * host.DEPTH for t in host.TOKENS}
    assert curves["bf16"] == {t: pytest.approx(flops[t] / 0.004) for t in host.TOKENS}
    assert curves["fp32"] == {t: pytest.approx(flops[t] / 0.5) for t in host.TOKENS}


def test_a_point_runs_its_trials_and_its_least_time() -> None:
    calls: list[float] = []

    def run() -> None:
        calls.append(time.perf_counter())
        time.sleep(0.002)

    best = host._best(run, trials=3, min_s=0.03)
    assert len(calls) >= 1 + 0.03 / 0.0025  # the warm-up, then at least 30 ms of trials
    assert 0.002 <= best < 0.03
    calls.clear()
    host._best(run, trials=3)
    assert len(calls) == 4


def _cheap(monkeypatch: pytest.MonkeyPatch, ticks: list[tuple[float, float]]) -> None:
    """measure() without its products and copy, the CPU counters read from ``ticks``."""
    monkeypatch.setattr(host, "matmul_flops", lambda dtypes: {d: {1: 1e10, 256: 4e11}
                                                              for d in dtypes})  # fmt: skip
    monkeypatch.setattr(host, "memory_bandwidth", lambda: 2.5e10)
    monkeypatch.setattr(host, "_cpu_ticks", lambda: ticks.pop(0))


@pytest.mark.parametrize(("busy", "noted"), [(3.0, True), (0.6, False)])
def test_what_other_processes_used_is_recorded_and_noted_from_half_a_cpu(
    monkeypatch: pytest.MonkeyPatch, busy: float, noted: bool
) -> None:
    """Over 4 s of wall (all CPUs' seconds over the count), ``busy`` CPU seconds went to other
    processes (this one's process_time is subtracted)."""
    cpus = host.os.cpu_count() or 1
    clock = iter([10.0, 10.0])  # this process used no CPU between the readings
    monkeypatch.setattr(host.time, "process_time", lambda: next(clock))
    _cheap(monkeypatch, [(100.0, 1000.0), (100.0 + busy, 1000.0 + 4.0 * cpus)])
    entry = host.measure()
    assert entry["measured"]["others_cpus"] == pytest.approx(busy / 4.0, abs=1e-3)
    assert ("other processes used" in entry["notes"]) is noted
    assert entry["measured"]["passes"] == host.PASSES


def test_this_processs_own_work_is_not_counted_as_others(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([10.0, 13.0])  # 3 CPU seconds of our own products
    monkeypatch.setattr(host.time, "process_time", lambda: next(clock))
    cpus = host.os.cpu_count() or 1
    _cheap(monkeypatch, [(100.0, 1000.0), (103.0, 1000.0 + 4.0 * cpus)])
    entry = host.measure()
    assert entry["measured"]["others_cpus"] == 0.0
    assert "other processes" not in entry["notes"]


def test_the_cli_warns_of_a_busy_machine(
    monkeypatch: pytest.MonkeyPatch, run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    clock = iter([10.0, 10.0])
    monkeypatch.setattr(host.time, "process_time", lambda: next(clock))
    cpus = host.os.cpu_count() or 1
    _cheap(monkeypatch, [(100.0, 1000.0), (104.0, 1000.0 + 4.0 * cpus)])
    code, out, _ = run_cli("calibrate", "--host", "-o", tmp_path / "host.yaml")
    assert code == 0
    assert "warning: other processes used 1.0 CPUs while this machine was measured" in out
    written = yaml.safe_load((tmp_path / "host.yaml").read_text())
    assert written["measured"]["others_cpus"] == 1.0


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux's /proc/stat")
def test_a_real_spinning_process_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real process spinning a CPU beside a short measurement reads as at least half a CPU."""
    monkeypatch.setattr(host, "PASSES", 1)
    spin = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 20\n"
                             "while time.time() < end: pass"])  # fmt: skip
    try:
        time.sleep(0.3)
        monkeypatch.setattr(host, "matmul_flops", lambda dtypes: (time.sleep(1.0), {
            d: {1: 1e10} for d in dtypes})[1])  # fmt: skip
        monkeypatch.setattr(host, "memory_bandwidth", lambda: 2.5e10)
        entry = host.measure()
    finally:
        spin.kill()
        spin.wait()
    assert entry["measured"]["others_cpus"] >= host.BUSY_CPUS
