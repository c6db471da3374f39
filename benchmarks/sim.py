"""How fast ``speclens sim`` runs the example scenario (``examples/kimi-k3-dspark.yaml``, AL 3.78
at K 7), on the event-level fast path against the step-exact loop, in one run on one core.

    taskset -c 0 python benchmarks/sim.py [--requests 100000] [--exact-requests 10000] [--rounds 3]

Goals: ``--requests`` (100,000) in under 10 s on the fast path, and 1,000,000 in under 30 s of
one core, with the same results as the step-exact loop within 1%. Each run's CPU seconds (the
process's) are printed beside its wall time: on a shared machine they are the steadier figure. The step-exact loop takes minutes at 100,000, so both paths run
``--exact-requests`` of the same scenario (same seed: the same arrivals and lengths), alternating
over ``--rounds`` (medians); their results are compared there, and request-steps per second of
wall time (decode request-steps, each a request's share of a decode step) are the speed ratio.

The example prices its steps with a roofline (kimi-k3 on 8 x b300). Goal: the roofline costs at
most 1.2x what a linear step cost does (``LINEAR``, the example's cost before it moved to the
roofline) on the same ``--requests``: the two alternate in each round, on the same core, and the
last table gives their medians and the ratio.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from speclens.acceptance import minimum_variance_rates
from speclens.cost import StepCost
from speclens.sim.scenario import load_scenario
from speclens.sim.simulate import simulate

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "kimi-k3-dspark.yaml"
#: The example's step cost before it moved to the roofline: a linear cost, the speed baseline.
LINEAR = StepCost(base=0.012, per_token=2e-5, per_seq=5e-5, per_context_token=1e-8,
                  draft_base=8e-4, draft_per_token=4e-6)  # fmt: skip
#: Each ``run``'s CPU seconds, in order.
CPU: list[float] = []
FIGURES = [("makespan_s",), ("realized_acceptance_length",)] + [
    ("latency_ms", m, q) for m in ("ttft", "tpot", "itl", "e2e") for q in ("mean", "p50", "p99")
]


def run(requests: int, fast: bool, linear: bool = False) -> tuple[float, dict[str, Any]]:
    """Wall seconds and the result of ``simulate`` on the example at ``requests``; its CPU
    seconds in ``CPU[-1]``."""
    scenario = load_scenario(EXAMPLE)
    workload = scenario.workload.model_copy(update={"requests": requests})
    scenario = scenario.model_copy(update={"workload": workload})
    if linear:  # the same scenario, its pool priced by the linear cost instead of the roofline
        pools = [p.model_copy(update={"step_cost": LINEAR}) for p in scenario.deployment.pools]
        deployment = scenario.deployment.model_copy(update={"pools": pools})
        scenario = scenario.model_copy(update={"deployment": deployment})
    start, cpu = time.perf_counter(), time.process_time()
    result = simulate(
        scenario, EXAMPLE.parent, minimum_variance_rates(3.78, 7), seed=0,
        max_request_steps=10**12, fast=fast,
    )  # fmt: skip
    CPU.append(time.process_time() - cpu)
    return time.perf_counter() - start, result


def request_steps(result: dict[str, Any]) -> float:
    return float(sum(result["histogram"].values()) / result["draft_coverage"])


def figure(result: dict[str, Any], path: tuple[str, ...]) -> float:
    value: Any = result
    for key in path:
        value = value[key]
    return float(value)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--exact-requests", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    walls: dict[str, list[float]] = {"exact": [], "fast": [], "full": [], "linear": []}
    cpus: dict[str, list[float]] = {label: [] for label in walls}
    results: dict[str, dict[str, Any]] = {}
    for _ in range(args.rounds):  # alternate, so load drift reaches both paths
        for label, n, fast, linear in (
            ("exact", args.exact_requests, False, False),
            ("fast", args.exact_requests, True, False),
            ("full", args.requests, True, False),
            ("linear", args.requests, True, True),
        ):
            wall, results[label] = run(n, fast, linear)
            walls[label].append(wall)
            cpus[label].append(CPU[-1])
    load = os.getloadavg()[0]
    print(f"# {platform.machine()}, Python {platform.python_version()}, load average {load:.1f}; "
          f"{EXAMPLE.name}, median of {args.rounds} alternating rounds")  # fmt: skip
    print("| run | requests | wall s | CPU s | request-steps / s | ratio to step-exact |")
    print("|---|---:|---:|---:|---:|---:|")
    base = request_steps(results["exact"]) / statistics.median(walls["exact"])
    for label, name, n in (
        ("exact", "step-exact loop (baseline)", args.exact_requests),
        ("fast", "fast path", args.exact_requests),
        ("full", "fast path", args.requests),
    ):
        wall = statistics.median(walls[label])
        rate = request_steps(results[label]) / wall
        cpu = statistics.median(cpus[label])
        print(f"| {name} | {n:,} | {wall:.2f} | {cpu:.2f} | {rate:,.0f} | {rate / base:.1f} |")
    print()
    print(f"| figure ({args.exact_requests:,} requests) | step-exact | fast | fast / exact - 1 |")
    print("|---|---:|---:|---:|")
    for path in FIGURES:
        want, got = figure(results["exact"], path), figure(results["fast"], path)
        print(f"| {'.'.join(path)} | {want:.4g} | {got:.4g} | {got / want - 1:+.2%} |")
    print()
    roofline, plain = statistics.median(walls["full"]), statistics.median(walls["linear"])
    print(f"| fast path, {args.requests:,} requests | wall s | request-steps / s |")
    print("|---|---:|---:|")
    for label, name, wall in (("linear", "linear step cost", plain),
                              ("full", "roofline", roofline)):  # fmt: skip
        print(f"| {name} | {wall:.2f} | {request_steps(results[label]) / wall:,.0f} |")
    print(f"| **roofline / linear** | **{roofline / plain:.2f}x** (goal <= 1.2x) | |")


if __name__ == "__main__":
    main()
