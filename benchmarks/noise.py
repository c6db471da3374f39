"""Where a held-out run's noise comes from: the same run repeated against one server, with what
the operating system says about each repeat.

``benchmarks/replay.py`` judges a replay beside the machine's own noise: a second identical
held-out run (SmolLM2, n-gram K 4, 32 Spec-Bench requests at concurrency 8) compared with the
first. This repeats that run ``--runs`` times against one ``speclens serve`` and prints, per run:

- its median E2E and throughput, and its fidelity against the first run (``compare``);
- the server's page faults (minor, major), context switches (voluntary, involuntary) and CPU
  seconds, all threads, from ``/proc/PID/stat`` and ``/proc/PID/status``;
- the machine's CPU steal over the run, from ``/proc/stat``;
- the first 8 requests' median E2E against the rest's (a cold start shows there);
- the machine's own speed just before the run, in this process, measured as ``calibrate --host``
  does (``speclens.sim.host``): single-threaded fp32 matmul GFLOP/s at 256 tokens and a 256 MiB
  copy's GB/s, which the server's CPU seconds should follow if the machine, not the server,
  changed.

    python benchmarks/noise.py [--runs 4] [--threads N] [--pin] [--requests 32] [--concurrency 8]

``--threads N`` runs the server with N intra-op threads (``OMP_NUM_THREADS``); ``--pin`` puts
the server on CPU 1 and the client on CPU 0 (with ``--threads 1``: nothing shares a core).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

from replay import SPEC_BENCH, command, fidelity

from peers import free_port, launch


def proc_counters(pid: int) -> dict[str, float]:
    """A process's page faults, context switches and CPU seconds, summed over its threads."""
    fields = (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1]).split()
    tick = os.sysconf("SC_CLK_TCK")
    out = {"minflt": float(fields[7]), "majflt": float(fields[9]),
           "cpu_s": (int(fields[11]) + int(fields[12])) / tick}  # fmt: skip
    voluntary = involuntary = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                voluntary += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                involuntary += int(line.split()[1])
    out.update(voluntary=float(voluntary), involuntary=float(involuntary))
    return out


def steal_share() -> tuple[float, float]:
    """(steal ticks, all ticks) of the machine since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return float(values[7]), float(sum(values))


def machine_speed() -> tuple[float, float]:
    """This machine's speed now, as ``calibrate --host`` measures it: single-threaded fp32
    matmul GFLOP/s at 256 tokens, and a 256 MiB copy's GB/s (read plus written). The server's
    steps stream the model's weights from memory, so they slow with the copy."""
    import torch

    from speclens.sim import host

    torch.set_num_threads(1)
    return host.matmul_flops(("fp32",))["fp32"][256] / 1e9, host.memory_bandwidth() / 1e9


def server_pid(port: int) -> int:
    """The pid of the process whose command line serves ``--port PORT``."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                words = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"serve" in words and b"--port" in words and str(port).encode() in words:
                return int(entry.name)
    raise RuntimeError(f"no server process on port {port}")


def run_figures(run: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    rows = sorted(
        (r for r in rows if not r.get("warmup") and r["success"]), key=lambda r: r["start_s"]
    )
    e2e = [r["latency_s"] for r in rows]
    figures = json.loads((run / "summary.json").read_text())["figures"]
    return {"e2e_median": median(e2e), "first8": median(e2e[:8]), "rest": median(e2e[8:]),
            "throughput": figures["throughput"]["output_tokens_per_s"]}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--threads", type=int, help="the server's intra-op threads")
    parser.add_argument("--pin", action="store_true", help="server on CPU 1, client on CPU 0")
    parser.add_argument("--keep", type=Path)
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="speclens-noise-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"threads {args.threads or 'default'}, pin {args.pin}", flush=True)  # fmt: skip
    port = free_port()
    cmd, env = command("speclens", "smollm2", port, work)
    if args.threads:
        env = {**env, "OMP_NUM_THREADS": str(args.threads)}
    if args.pin:
        cmd = ["taskset", "-c", "1", *cmd]
    client = ["taskset", "-c", "0"] if args.pin else []
    load = ["--model", "smollm2", "--max-tokens", "64", "--ignore-eos", "--stream", "--warmup", "1",
            "--dataset", "jsonl", "--dataset-path", str(SPEC_BENCH), "--concurrency",
            str(args.concurrency), "--num-requests", str(args.requests)]  # fmt: skip
    print(
        "| run | E2E median | first 8 / rest | tok/s | E2E error vs run 0 | throughput vs run 0 "
        "| minor faults | major | invol. switches | vol. switches | server CPU s | steal "
        "| machine GFLOP/s | machine GB/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with launch.running("speclens", cmd, port, work / "server.log", 600, env) as url:
        pid = server_pid(port)
        for i in range(args.runs):
            speed, bandwidth = machine_speed()
            before, steal0 = proc_counters(pid), steal_share()
            out = work / f"run{i}"
            done = subprocess.run([*client, sys.executable, "-m", "speclens", "bench", "--url", url,
                                   *load, "--output-dir", str(out)], capture_output=True, text=True)  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(done.stderr[-2000:])
            after, steal1 = proc_counters(pid), steal_share()
            delta = {k: after[k] - before[k] for k in after}
            steal = (steal1[0] - steal0[0]) / max(steal1[1] - steal0[1], 1.0)
            f = run_figures(out)
            vs: dict[str, Any] = fidelity(work / "run0", out) if i else {}
            error = f"{vs['figures']['e2e']['median_ape']:.1%}" if vs else "-"
            through = f"{vs['throughput_error']:+.1%}" if vs else "-"
            print(f"| {i} | {f['e2e_median']:.2f} s | {f['first8']:.2f} / {f['rest']:.2f} s "
                  f"| {f['throughput']:.1f} | {error} | {through} | {delta['minflt']:.0f} "
                  f"| {delta['majflt']:.0f} | {delta['involuntary']:.0f} | {delta['voluntary']:.0f} "
                  f"| {delta['cpu_s']:.1f} | {steal:.2%} | {speed:.1f} | {bandwidth:.1f} |", flush=True)  # fmt: skip
            time.sleep(1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
