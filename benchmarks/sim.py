"""How many simulated requests ``speclens sim`` gets through per second of wall time, one core.

    python benchmarks/sim.py [--requests 100000] [--output-tokens 64] [--concurrency 256]

Goal: at least 100,000 simulated requests in under a minute on one core. The baseline printed
beside it is the same loop with speculation off (one token per step), measured in the same run.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import torch

from speclens.acceptance import minimum_variance_rates
from speclens.sim.scenario import Scenario
from speclens.sim.simulate import simulate


def scenario(requests: int, output_tokens: int, concurrency: int, speculate: bool) -> Scenario:
    engine = {"max_num_seqs": concurrency}
    if speculate:
        engine["speculative"] = {"method": "dspark", "num_spec_tokens": 7}  # type: ignore[assignment]
    return Scenario.model_validate(
        {
            "model": "kimi-k3",
            "deployment": {"pools": [{"engine": engine}]},
            "workload": {
                "input_tokens": 128,
                "output_tokens": output_tokens,
                "concurrency": concurrency,
                "requests": requests,
            },
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for label, speculate in (("no speculation (baseline)", False), ("forced AL 3.78, K 7", True)):
        sc = scenario(args.requests, args.output_tokens, args.concurrency, speculate)
        start = time.perf_counter()
        result = simulate(sc, Path("."), minimum_variance_rates(3.78, 7) if speculate else None)
        wall = time.perf_counter() - start
        rows.append((label, wall, result))
    print(f"# {platform.machine()}, 1 torch thread, Python {platform.python_version()}; "
          f"{args.requests:,} requests of {args.output_tokens} output tokens at concurrency {args.concurrency}")  # fmt: skip
    print(
        "| run | wall s | simulated requests / s of wall time | realized AL | ratio to baseline |"
    )
    print("|---|---:|---:|---:|---:|")
    base = rows[0][1]
    for label, wall, result in rows:
        al = result["realized_acceptance_length"]
        print(
            f"| {label} | {wall:.1f} | {args.requests / wall:,.0f} | {al if al is None else round(al, 4)} | {base / wall:.2f} |"
        )


if __name__ == "__main__":
    main()
