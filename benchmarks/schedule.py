"""How fast ``speclens sim --context`` computes a K schedule whose KV cache can preempt:
DeepSeek-R1 with MTP on 8 x H200 (TP 8, EP 8; the KV cache the roofline leaves beside the
weights, 582,025 tokens), K 1..4, concurrency 1, 4, 8, 16, contexts 1k, 8k, 32k (60 points with
K 0), reasoning-length outputs (1,024 to 8,192 tokens). At 32k and concurrency 16 the requests
at their longest hold more than the cache (16 x 40,965 tokens), so the bound that proves no
preemption fails there.

    python benchmarks/schedule.py [--jobs 2] [--rounds 1]

Runs the command a user runs (``speclens sim SCENARIO --sweep ... --context ... --json``) in a
fresh process and prints its wall time, the CPU time of it and its workers, how many points each
loop ran, and the schedule's decisions (best K by concurrency x context), checked against
``EXPECTED``: the decisions the step-exact loop made at those points before the fast path
handled a cache that can preempt. Goal: under 20 s on 2 cores with the same decisions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCENARIO = """\
model: deepseek-r1
hardware: h200
deployment:
  pools:
    - role: mixed
      parallel: 8
      expert_parallel: 8
      engine:
        speculative: {method: mtp, num_spec_tokens: 3}
        max_num_seqs: 256
        max_model_len: 65536
workload:
  category: coding
  thinking: "on"
  input_tokens: {min: 256, max: 1024}
  output_tokens: {min: 1024, max: 8192}
  concurrency: 16
  requests: 64
"""

#: Each K's AL, stated for the benchmark (no published DeepSeek-R1 MTP curve ships): gains that
#: shrink with K, so the best K moves with concurrency and context.
ALS = {1: 1.85, 2: 2.30, 3: 2.55, 4: 2.70}
REGISTRY = "kind: AcceptanceProfileSet\nname: dsr1-mtp\nprofiles:\n" + "".join(
    f"  - {{model: deepseek-r1, speculative_method: mtp, num_spec_tokens: {k}, thinking: 'on', "
    f"category: coding, acceptance_length: {al}, method: assumed, rationale: a stand-in for "
    "the benchmark, provenance: {source: benchmarks/schedule.py}}\n"
    for k, al in ALS.items()
)

ARGS = [
    "--sweep", "num_spec_tokens=1..4", "--sweep", "concurrency=1,4,8,16",
    "--context", "1k,8k,32k",
]  # fmt: skip

#: Best K by (concurrency, context) before the change (every point the step-exact loop's where
#: the cache could preempt): the schedule must not move.
EXPECTED = {
    "c1-1k": 4, "c1-8k": 4, "c1-32k": 4, "c4-1k": 2, "c4-8k": 2, "c4-32k": 3,
    "c8-1k": 2, "c8-8k": 2, "c8-32k": 3, "c16-1k": 3, "c16-8k": 3, "c16-32k": 3,
}  # fmt: skip


def run(jobs: int) -> tuple[float, float, dict[str, Any]]:
    """One run of the command: wall seconds, CPU seconds (it and its workers), its schedule."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "dsr1-h200.yaml"
        path.write_text(SCENARIO)
        (Path(folder) / "acceptance").mkdir()
        (Path(folder) / "acceptance" / "dsr1-mtp.yaml").write_text(REGISTRY)
        command = [sys.executable, "-m", "speclens", "sim", str(path), *ARGS,
                   "--registry", folder, "--jobs", str(jobs), "--json"]  # fmt: skip
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.exit(f"speclens sim exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(done.stdout)["schedule"]


def decisions(sched: dict[str, Any]) -> dict[str, int]:
    return {
        f"c{row['concurrency']}-{cell['context'] // 1024}k": cell["num_spec_tokens"]
        for row in sched["rows"]
        for cell in row["cells"]
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    walls, cpus = [], []
    sched: dict[str, Any] = {}
    for _ in range(args.rounds):
        wall, cpu, sched = run(args.jobs)
        walls.append(wall)
        cpus.append(cpu)
    load = os.getloadavg()[0]
    print(f"# {platform.machine()}, Python {platform.python_version()}, {os.cpu_count()} cores, "
          f"load average {load:.1f}; --jobs {args.jobs}, median of {args.rounds}")  # fmt: skip
    loops: dict[str, int] = {}
    for point in sched["points"]:
        loop = point.get("loop", "?")
        loops[loop] = loops.get(loop, 0) + 1
    print(f"wall {statistics.median(walls):.1f} s, CPU {statistics.median(cpus):.1f} s "
          f"(goal: under 20 s wall on 2 cores); points by loop: {loops}")  # fmt: skip
    got = decisions(sched)
    contexts = sched["contexts"]
    print("| concurrency | " + " | ".join(f"{c // 1024}k" for c in contexts) + " |")
    print("|---:|" + "---:|" * len(contexts))
    for row in sched["rows"]:
        cells = " | ".join(f"K {c['num_spec_tokens']} ({c['gain']:+.1%})" for c in row["cells"])
        print(f"| {row['concurrency']} | {cells} |")
    if EXPECTED:
        moved = {p: (EXPECTED[p], got.get(p)) for p in EXPECTED if got.get(p) != EXPECTED[p]}
        print("same decisions as before: " + ("yes" if not moved else f"NO, {moved}"))
    else:
        print(f"decisions: {json.dumps(got)}")


if __name__ == "__main__":
    main()
