"""The simulator's timing fidelity: a step cost fitted on torch runs predicts other torch runs.

Each of ``--rounds`` rounds fits ``StepCost.fit`` on a fresh torch run (forced AL 2, K 7, a
closed loop at concurrency 1, 2, 4, 8 then 16, so per-request and per-context terms can be told
from the intercept), then measures one fresh torch run of every target (other acceptance
lengths and batch sizes) and predicts it with the ``sim`` executor at that round's fitted cost.
Fit and measurement alternate so that drift in the machine's load reaches both sides alike.
Output tokens/s over compute time (the engine's clock): the median of each side with its range,
predicted / measured as the ratio of the medians, and the range of the per-round ratios.
Goal: predicted / measured within 10%.

The unit suite checks the deterministic half (the fit recovers known coefficients; the sim
replays a recorded torch run at the formula); this is the timing half, which a loaded machine
can move, so it is a benchmark and not a test.

    python benchmarks/fidelity.py [--rounds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import platform
import statistics
from dataclasses import fields

import torch

from speclens.engine import Engine, EngineConfig, SpeculativeConfig, StepCost
from speclens.sim.request import SimRequest
from speclens.sim.simulate import _run_replica

K = 7
INPUT, OUTPUT, REQUESTS = 24, 64, 32
#: The fit run's closed-loop concurrencies (at forced AL 2), twice as many requests as each.
FIT_CONCURRENCY = (1, 2, 4, 8, 16)
#: (forced AL, closed-loop concurrency) of the measured and predicted runs.
TARGETS = ((3.78, 8), (1.5, 2), (6.0, 12))


def engine(length: float, executor: str = "torch", cost: StepCost | None = None) -> Engine:
    spec = SpeculativeConfig(
        method="draft_model", num_speculative_tokens=K, acceptance_length=length
    )
    config = EngineConfig(
        speculative=spec,
        executor=executor,  # type: ignore[arg-type]
        step_cost=cost or StepCost(),
        detokenize=False,
    )
    return Engine(config)


def closed(count: int = REQUESTS, first: int = 0) -> list[SimRequest]:
    return [SimRequest(first + i, 0.0, INPUT, OUTPUT) for i in range(count)]


def rate(run: Engine, requests: list[SimRequest], concurrency: int) -> float:
    """Output tokens per second of the engine's clock (measured for torch, priced for sim)."""
    _run_replica(run, requests, concurrency)
    return sum(r.output_tokens for r in requests) / run.clock


def fit_once() -> StepCost:
    run = engine(2.0)
    for i, concurrency in enumerate(FIT_CONCURRENCY):
        _run_replica(run, closed(2 * concurrency, 1000 * i), concurrency)
    return StepCost.fit(run.steps, K)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="fit runs = measured runs per target")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"{platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} torch thread(s), {args.rounds} rounds"
    )
    rate(engine(2.0), closed(8), 8)  # warm up: the first forwards allocate
    costs: list[StepCost] = []
    measured: dict[tuple[float, int], list[float]] = {t: [] for t in TARGETS}
    predicted: dict[tuple[float, int], list[float]] = {t: [] for t in TARGETS}
    for _ in range(args.rounds):
        costs.append(fit_once())
        for length, concurrency in TARGETS:
            measured[length, concurrency].append(rate(engine(length), closed(), concurrency))
            sim = engine(length, "sim", costs[-1])
            predicted[length, concurrency].append(rate(sim, closed(), concurrency))
    print("\nfitted step cost, median (min-max) over the fit runs:")
    for f in fields(StepCost):
        values = [getattr(c, f.name) for c in costs]
        if all(v is not None for v in values):
            low, mid, high = min(values), statistics.median(values), max(values)
            print(f"  {f.name}: {mid:.3g} ({low:.3g}-{high:.3g})")
    print(
        "\n| AL | concurrency | measured tok/s | predicted tok/s | predicted / measured "
        "| per-round ratios |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for target in TARGETS:
        got, want = measured[target], predicted[target]
        ratio = statistics.median(want) / statistics.median(got)
        rounds = [p / m for p, m in zip(want, got, strict=True)]
        print(
            f"| {target[0]} | {target[1]} | {spread(got)} | {spread(want)} | {ratio:.3f} "
            f"| {min(rounds):.3f}-{max(rounds):.3f} |"
        )


if __name__ == "__main__":
    main()
