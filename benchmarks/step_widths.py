"""What the engine's decode steps cost by batch width, and how wide their verify forward is.

SmolLM2 with n-gram drafting at K 4 (prompt lookup 2..4), greedy, 64 tokens, ignore-eos, the
first turns of Spec-Bench prompts with the chat template; the engine in this process, default
torch threads. For each concurrency, two rounds of that many requests submitted together; every
decode step is grouped by its batch width (requests in the step), with its median seconds and
median query positions (the verify forward's padded layout, every request as wide as the widest
draft in the batch, which only attention runs on; the weights see the real rows alone), and each
prefill step is listed with its prompts, tokens and seconds.

    python benchmarks/step_widths.py [--concurrency 1,2,4,8]
"""

from __future__ import annotations

import argparse
import platform
import statistics
from collections import defaultdict
from typing import Any

import torch
from bench_tp import prompts

from speclens.engine import Engine, EngineConfig, SamplingParams, SpeculativeConfig


def smollm2_ngram() -> tuple[Engine, SamplingParams, list[Any]]:
    """The engine these benchmarks time (SmolLM2, n-gram K 4, lookup 2..4) after a warm-up, its
    sampling (greedy, 64 tokens, ignore-eos) and 16 Spec-Bench prompts; the machine printed."""
    print(f"machine: {platform.processor() or platform.machine()}, torch threads "
          f"{torch.get_num_threads()}")  # fmt: skip
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=4, ngram_min=2, ngram_max=4)
    engine = Engine(EngineConfig(model="smollm2", kv_cache_tokens=16384, max_model_len=2048,
                                 speculative=spec))  # fmt: skip
    texts = prompts(engine, 16, "smollm2")
    engine.generate(texts[:1], SamplingParams(max_tokens=4, temperature=0))  # warm-up
    return engine, SamplingParams(max_tokens=64, temperature=0, ignore_eos=True), texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="1,2,4,8")
    args = parser.parse_args()
    engine, params, texts = smollm2_ngram()
    decode: dict[int, list[tuple[float, int]]] = defaultdict(list)
    prefill = []
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        for round_ in range(2):
            first = len(engine.steps)
            start = round_ * concurrency % len(texts)
            engine.generate((texts[start:] + texts)[:concurrency], params)
            for s in engine.steps[first:]:
                if s.kind == "decode":
                    decode[s.num_requests].append((s.seconds, s.query_tokens))
                else:
                    prefill.append((s.num_requests, s.query_tokens, s.seconds))
    print("| batch width | decode steps | median seconds | median query rows | rows a request |")
    print("|---:|---:|---:|---:|---:|")
    for width in sorted(decode):
        seconds = statistics.median(s for s, _ in decode[width])
        rows = statistics.median(q for _, q in decode[width])
        print(f"| {width} | {len(decode[width])} | {seconds * 1e3:.1f} ms | {rows:g} "
              f"| {rows / width:.2g} |")  # fmt: skip
    print("\n| prefill: prompts | tokens | seconds |\n|---:|---:|---:|")
    for count, tokens, seconds in prefill:
        print(f"| {count} | {tokens} | {seconds * 1e3:.0f} ms |")


if __name__ == "__main__":
    main()
