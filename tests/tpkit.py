"""What the tensor-parallel engine tests share: the dummy-model configs, the prompts, and a
per-step count of the collectives rank 0 runs."""

from __future__ import annotations

from collections import Counter
from typing import Any

from speclens.engine import Engine, EngineConfig, SamplingParams, SpeculativeConfig

K, AL = 7, 3.78
PROMPTS = [f"prompt {i}: " + "the cat sat on the mat. " * (i + 1) for i in range(4)]
#: The greedy-equivalence prompts on which a layer subset of the dummy target accepts some drafts.
GREEDY_PROMPTS = ["Hello world", "abcabcabcabcabcabc", "The quick brown fox jumps. The quick", "x"]
GREEDY = SamplingParams(max_tokens=24, temperature=0)


def greedy_config(size: int = 1) -> EngineConfig:
    spec = SpeculativeConfig(method="draft_model", num_speculative_tokens=4, draft_model="layers:2")
    return EngineConfig(speculative=spec, kv_cache_tokens=8192, tensor_parallel_size=size)


def forced_config(size: int = 1, debug: bool = False) -> EngineConfig:
    spec = SpeculativeConfig(
        method="ngram", num_speculative_tokens=K, acceptance_length=AL, seed=11
    )
    return EngineConfig(
        speculative=spec, kv_cache_tokens=8192, tensor_parallel_size=size, debug_lockstep=debug
    )


def per_step_collectives(engine: Engine, run: Any) -> list[tuple[str, Counter[str]]]:
    """Run ``run()`` and return, for each step, its kind and the collectives rank 0 ran."""
    seen: Counter[str] = Counter()
    engine.parallel.comm.listeners.append(lambda kind: seen.update([kind]))  # type: ignore[union-attr]
    steps: list[tuple[str, Counter[str]]] = []
    step = engine.step

    def counted() -> Any:
        seen.clear()
        before = len(engine.steps)
        out = step()
        if len(engine.steps) > before:
            steps.append((engine.steps[-1].kind, Counter(seen)))
        return out

    engine.step = counted  # type: ignore[method-assign]
    try:
        run()
    finally:
        del engine.step
        engine.parallel.comm.listeners.clear()  # type: ignore[union-attr]
    return steps
