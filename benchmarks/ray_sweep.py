"""``speclens sim --sweep ... --ray`` against ``--jobs 2``: what a Ray task costs, and from how
many points Ray pays.

    python benchmarks/ray_sweep.py [--sizes 8,16,32,64] [--jobs 2] [--rounds 1]

The example scenario (``examples/kimi-k3-dspark.yaml``) swept over K 1..8 x the first n/8 of
concurrency 8, 16, ..., 64 (n points, 64 at most), each size run by the command a user types, in
a fresh process (its start-up included):

- ``--jobs 2``: two spawned processes;
- ``--ray``: a local Ray of 2 CPUs started for the run, and stopped after;
- ``--ray 127.0.0.1:PORT``: joining a Ray head of 2 CPUs that this script starts beforehand with
  ``ray start --head`` on loopback (as a cluster runs before anyone submits to it) and stops at
  the end (its own processes, not every Ray on the machine).

Every run's rows are compared with ``--jobs 2``'s (byte for byte, the JSON). On each backend the
wall time over the sizes is fitted as fixed + n x per point; against ``--jobs 2`` the difference
in fixed is Ray's start (local) or joining (cluster) cost. A task's own cost is measured apart,
where a point's work does not hide it: ``--tasks`` empty calls as Ray tasks on the joined head
and on 2 spawned processes, each in one warmed-up session, at two counts (the slope: seconds a
call, on 2 CPUs; twice that is a task's CPU). On one machine Ray never pays (the same 2 cores, plus its cost
per task); on a cluster of C CPUs joined the same way a sweep of n points takes
fixed + n (t + o) / C against ``--jobs 2``'s fixed + n t / 2 (t: a point's CPU seconds, o: a
task's), so Ray pays from n* = (fixed difference) / (t / 2 - (t + o) / C) points: printed for a
few C. ``--jobs 1`` runs beside them: its slope is t.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import platform
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "kimi-k3-dspark.yaml"
CONCURRENCIES = (8, 16, 24, 32, 40, 48, 56, 64)
RAY = Path(sys.executable).parent / "ray"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sweep(n: int) -> list[str]:
    if n % 8 or not 8 <= n <= 64:
        raise SystemExit(f"--sizes: each a multiple of 8 in 8..64, got {n}")
    concurrency = ",".join(str(c) for c in CONCURRENCIES[: n // 8])
    return ["--sweep", "num_spec_tokens=1..8", "--sweep", f"concurrency={concurrency}"]


def _sim(n: int, flags: list[str], env: dict[str, str]) -> tuple[float, str]:
    command = [sys.executable, "-m", "speclens", "sim", str(EXAMPLE), *_sweep(n), "--json", *flags]
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr}")
    return took, done.stdout


def _head(temp: Path, env: dict[str, str]) -> str:
    port = _port()
    command = [str(RAY), "start", "--head", "--num-cpus", "2", "--node-ip-address", "127.0.0.1",
               "--port", str(port), "--dashboard-port", str(_port()),
               "--dashboard-agent-listen-port", str(_port()), "--metrics-export-port",
               str(_port()), "--include-dashboard", "false", "--temp-dir", str(temp),
               "--disable-usage-stats"]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"ray start failed:\n{done.stdout}\n{done.stderr}")
    return f"127.0.0.1:{port}"


def _processes(temp: Path) -> list[int]:
    """The processes of the head this script started: their command lines name ``temp``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(temp).encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _stop(temp: Path) -> None:
    """SIGKILL to the head's processes, as ``ray stop --force`` does, but to this head's only."""
    deadline = time.monotonic() + 10
    while (left := _processes(temp)) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def empty(_: int) -> None:
    """An empty call: what a task costs beyond its work."""


def _per_call(counts: list[int], address: str | None, env: dict[str, str]) -> float:
    """Seconds an empty call takes over 2 workers, beyond their start: the slope of the wall times
    of ``counts`` calls, in one session (2 spawned processes, or a Ray driver joined to
    ``address``) warmed up first."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    def timed(submit: Any, n: int) -> float:
        start = time.perf_counter()
        submit(n)
        return time.perf_counter() - start

    if address is None:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(2, mp_context=context) as pool:

            def submit(n: int) -> None:
                list(pool.map(empty, range(n)))

            submit(counts[0])  # the workers started
            times = [timed(submit, n) for n in counts]
        return _line(counts, times)[1]
    saved = dict(os.environ)
    os.environ.update(env)  # before Ray reads it (at import): loopback, the head's token
    import ray

    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
        task = ray.remote(num_cpus=1)(empty)

        def submit_ray(n: int) -> None:
            ray.get([task.remote(i) for i in range(n)])

        submit_ray(counts[0])  # the workers started
        times = [timed(submit_ray, n) for n in counts]
    finally:
        ray.shutdown()
        os.environ.clear()
        os.environ.update(saved)
    return _line(counts, times)[1]


def _line(sizes: list[int], times: list[float]) -> tuple[float, float]:
    """Least squares fixed + n x per point over the sizes."""
    slope, fixed = np.polyfit(np.array(sizes, dtype=float), np.array(times), 1)
    return float(fixed), float(slope)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="8,16,32,64")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="runs per size and backend (median)")
    parser.add_argument("--tasks", default="1000,5000", help="empty calls, two counts")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    temp = Path(tempfile.mkdtemp(prefix="ray-sweep-"))
    # Loopback only, no usage report, the head's files under temp, and a token of our own.
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}  # fmt: skip
    local_env = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")}
    load = os.getloadavg()[0]
    address = _head(temp, env)
    backends = {f"--jobs {args.jobs}": (["--jobs", str(args.jobs)], local_env),
                "--jobs 1": (["--jobs", "1"], local_env),
                "--ray (local)": (["--ray", "--jobs", str(args.jobs)], local_env),
                "--ray ADDRESS (joined)": (["--ray", address], env)}  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in backends}
    same = True
    try:
        counts = [int(c) for c in args.tasks.split(",")]
        call_jobs = _per_call(counts, None, local_env)
        call_ray = _per_call(counts, address, env)
        for n in sizes:
            outputs = {}
            for name, (flags, run_env) in backends.items():
                runs = []
                for _ in range(args.rounds):
                    took, out = _sim(n, flags, run_env)
                    runs.append(took)
                    outputs[name] = out
                times[name].append(statistics.median(runs))
            same &= len(set(outputs.values())) == 1
    finally:
        _stop(temp)
        shutil.rmtree(temp, ignore_errors=True)
    print(f"machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}, load average {load:.1f} at the start; "
          f"{args.rounds} run(s) per size, each a fresh `speclens sim` (start-up included)")  # fmt: skip
    print()
    print("| points | " + " | ".join(backends) + " | --ray / --jobs |")
    print("|---:|" + "---:|" * (len(backends) + 1))
    base, local = next(iter(backends)), "--ray (local)"
    for i, n in enumerate(sizes):
        cells = " | ".join(f"{times[name][i]:.1f} s" for name in backends)
        print(f"| {n} | {cells} | {times[local][i] / times[base][i]:.2f} |")
    print()
    fits = {name: _line(sizes, t) for name, t in times.items()}
    fixed_jobs, slope_jobs = fits[base]
    point_cpu = fits["--jobs 1"][1]  # one process: the slope is a point's CPU seconds
    print(f"rows identical to {base}'s at every size: {'yes' if same else 'NO'}")
    print(f"{base}: {fixed_jobs:.1f} s fixed + {slope_jobs:.3f} s a point "
          f"(a point: {point_cpu:.2f} CPU s)")  # fmt: skip
    for name in list(backends)[1:]:
        if name == "--jobs 1":
            continue
        fixed, slope = fits[name]
        print(f"{name}: {fixed:.1f} s fixed + {slope:.3f} s a point; against {base}: "
              f"{fixed - fixed_jobs:+.1f} s fixed")  # fmt: skip
    task = max(0.0, 2 * (call_ray - call_jobs))
    print(f"an empty call on 2 CPUs: {call_jobs * 1e3:.2f} ms in processes, {call_ray * 1e3:.2f} "
          f"ms as a Ray task (joined): a task costs {task * 1e3:.1f} ms of CPU more "
          f"({task / point_cpu:.1%} of a point)")  # fmt: skip
    extra = times["--ray ADDRESS (joined)"][0] - times[base][0]
    print(f"on this machine (2 CPUs either way) Ray does not pay: {base} is "
          f"{times[local][-1] / times[base][-1]:.2f}x faster at {sizes[-1]} points")  # fmt: skip
    for cpus in (4, 8, 16, 64):
        gain = point_cpu / 2 - (point_cpu + task) / cpus
        at = "never" if gain <= 0 else f"{max(extra, 0.0) / gain:.0f} points"
        print(f"a joined cluster of {cpus} CPUs pays against {base} from: {at}")


if __name__ == "__main__":
    main()
