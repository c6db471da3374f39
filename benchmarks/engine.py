"""Engine throughput under forced acceptance, against no speculation and against a peer.

1. Output tokens/s of decode steps with forced AL in {1, 2, 3.78, 8} at K = 7 and batch sizes
   {1, 8, 32} (the embedded dummy target and drafter), against no speculation at the same batch
   size; the measured speedup beside the one the step costs predict,
   AL x T(no-spec step) / T(spec step), and their ratio (goal: within 10%).
2. The same models under Hugging Face transformers' assisted generation at batch 1 (greedy,
   natural acceptance), against this engine on the same models and prompt: ratio ours / theirs
   (goal: >= 1). Skipped when transformers is not installed.

    python benchmarks/engine.py [--max-tokens 128] [--skip-peer]
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

import torch

from speclens.engine import Engine, EngineConfig, SamplingParams, SpeculativeConfig
from speclens.engine.weights import load_model, save_hf_dir

K = 7
LENGTHS = (1.0, 2.0, 3.78, 8.0)
BATCHES = (1, 8, 32)
PROMPT = "The quick brown fox jumps over the lazy dog. " * 2


def decode_rate(spec: SpeculativeConfig, batch: int, max_tokens: int) -> tuple[float, float, float]:
    """(output tokens/s over decode steps, mean seconds per decode step, realized AL)."""
    engine = Engine(EngineConfig(speculative=spec, max_num_seqs=max(batch, 1)))
    engine.generate([PROMPT], SamplingParams(max_tokens=8, temperature=0))  # warm up
    engine.steps.clear()
    engine.stats = type(engine.stats)(engine.k, enabled=engine.stats.enabled)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    outputs = engine.generate([PROMPT] * batch, params)
    decode = [s for s in engine.steps if s.kind == "decode"]
    seconds = sum(s.seconds for s in decode)
    # Tokens emitted by decode steps: all but the one each prefill produced.
    tokens = sum(o.completion_tokens for o in outputs) - batch
    return tokens / seconds, seconds / len(decode), engine.stats.acceptance_length


def forced_table(max_tokens: int) -> None:
    print(
        "| batch | AL (forced) | AL (realized) | tok/s | no-spec tok/s | speedup | predicted | measured / predicted |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for batch in BATCHES:
        base_rate, base_step, _ = decode_rate(SpeculativeConfig(), batch, max_tokens)
        for length in LENGTHS:
            spec = SpeculativeConfig(
                method="draft_model", num_speculative_tokens=K, acceptance_length=length
            )
            rate, step, realized = decode_rate(spec, batch, max_tokens)
            speedup = rate / base_rate
            # Per request, a spec step emits `realized` tokens where a plain step emits one.
            predicted = realized * base_step / step
            print(
                f"| {batch} | {length:g} | {realized:.3f} | {rate:,.0f} | {base_rate:,.0f} "
                f"| {speedup:.3f} | {predicted:.3f} | {speedup / predicted:.3f} |",
                flush=True,
            )


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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--skip-peer", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(
        f"# torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} threads; "
        f"dummy target + dummy-draft, max_tokens {args.max_tokens}"
    )
    forced_table(args.max_tokens)
    if not args.skip_peer:
        print()
        peer_table(args.max_tokens)


if __name__ == "__main__":
    main()
