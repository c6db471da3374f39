"""Time greedy, probabilistic and synthetic rejection sampling on the same inputs.

Prints, per shape (batch B, draft length K, vocabulary V), the median time of each method and the
ratio synthetic / greedy (goal: <= 1.05; the target argmax both pay dominates). Run:

    python benchmarks/sampling.py [--device cpu|cuda] [--repeats N] [--sync-debug]

``--sync-debug`` (CUDA only) runs the synthetic step under
``torch.cuda.set_sync_debug_mode("error")`` first, so any host synchronisation raises.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import torch

from speclens.sampling import SyntheticAcceptance, rejection_sample

BATCHES = (1, 64, 256)
KS = (1, 3, 7)
VOCABS = (32_000, 128_000)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _interleaved(fns: list[Callable[[], None]], repeats: int, device: torch.device) -> list[float]:
    """Median seconds of each function, timed in turns so drift and noise hit all alike.

    Short calls get more turns (at least ``repeats``, about 0.3 s each in all)."""
    for fn in fns:
        fn()
        fn()
    _sync(device)
    start = time.perf_counter()
    fns[0]()
    _sync(device)
    turns = max(repeats, min(2000, int(0.3 / max(time.perf_counter() - start, 1e-6))))
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(turns):
        for fn, out in zip(fns, samples, strict=True):
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            out.append(time.perf_counter() - t0)
    return [statistics.median(out) for out in samples]


def bench_shape(
    batch: int, k: int, vocab: int, device: torch.device, repeats: int, sync_debug: bool
) -> tuple[float, float, float]:
    """Median seconds of greedy, probabilistic and synthetic on one set of inputs."""
    gen = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(batch, k + 1, vocab, device=device, generator=gen)
    draft_probs = torch.softmax(torch.randn(batch, k, vocab, device=device, generator=gen), -1)
    drafts = torch.randint(0, vocab, (batch, k), device=device, generator=gen)
    num_drafts = torch.full((batch,), k, device=device)
    bonus = torch.randint(0, vocab, (batch,), device=device, generator=gen)
    synthetic = SyntheticAcceptance.from_length(1 + 0.6 * k, k, seed=0)

    def greedy() -> None:
        rejection_sample("greedy", drafts, num_drafts, bonus, target_logits=logits)

    def probabilistic() -> None:
        rejection_sample(
            "probabilistic", drafts, num_drafts, bonus,
            target_logits=logits, draft_probs=draft_probs, generator=gen,
        )  # fmt: skip

    def synth() -> None:
        rejection_sample(
            "synthetic", drafts, num_drafts, bonus, target_logits=logits, synthetic=synthetic
        )

    if sync_debug and device.type == "cuda":
        torch.cuda.set_sync_debug_mode("error")  # any host synchronisation now raises
        synth()
        torch.cuda.set_sync_debug_mode("default")
    greedy_s, synth_s = _interleaved([greedy, synth], repeats, device)
    (prob_s,) = _interleaved([probabilistic], max(5, repeats // 3), device)
    return greedy_s, prob_s, synth_s


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=31)
    parser.add_argument("--sync-debug", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    print(
        f"# torch {torch.__version__} on {device} ({platform.machine()}, "
        f"{torch.get_num_threads()} threads); median of at least {args.repeats} interleaved runs, seconds"
    )
    print("| B | K | V | greedy | probabilistic | synthetic | synthetic / greedy |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for vocab in VOCABS:
        for k in KS:
            for batch in BATCHES:
                greedy, prob, synth = bench_shape(
                    batch, k, vocab, device, args.repeats, args.sync_debug
                )
                print(
                    f"| {batch} | {k} | {vocab} | {greedy:.2e} | {prob:.2e} | {synth:.2e} "
                    f"| {synth / greedy:.3f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
