"""Forced acceptance at TP 2 on the dummy models (this process is rank 0, one rank process
beside it, gloo): the forced draw in lockstep on every rank, and the lockstep check's negative
control. A process holds one process group at a time, so each test starts and stops its own."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from speclens.engine import Engine, EngineConfig, SamplingParams, SpeculativeConfig
from speclens.engine.parallel import UNSEEDED_ENV, LockstepError, launch

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


def test_forced_tp2_distribution_and_rank_draws_equal_tp1() -> None:
    """Same seed, same requests one at a time: TP 2's accepted-count distribution is TP 1's, and
    every rank's per-step accepted counts are identical (drawn on each rank, never broadcast)."""
    forced_tp = launch(forced_config(2, debug=True))  # one process group per process at a time
    try:
        check_forced(forced_tp, Engine(forced_config()))
    finally:
        forced_tp.close()


def check_forced(forced_tp: Engine, one: Engine) -> None:
    params = SamplingParams(max_tokens=40, temperature=0)
    steps: list[tuple[str, Counter[str]]] = []
    for prompt in PROMPTS:
        one.generate([prompt], params)
        steps += per_step_collectives(forced_tp, lambda p=prompt: forced_tp.generate([p], params))
    assert forced_tp.stats.mtp_stats() == one.stats.mtp_stats()
    assert set(forced_tp.stats.mtp_stats()["distribution"]) == {"2", "3"}
    logs = forced_tp.parallel.gather_logs()  # type: ignore[union-attr]
    assert len(logs) == 2 and logs[0] == logs[1] and len(logs[0]) > 20
    # --debug-lockstep adds exactly one all-reduce per decode step (there are no layers' here:
    # the n-gram drafter runs on rank 0 and its proposals are broadcast)
    decode = [calls for kind, calls in steps if kind == "decode"]
    assert all(calls["lockstep"] == 1 for calls in decode)


def test_unseeded_rank_draws_fail_loudly_within_a_few_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Negative control: with each rank drawing an unseeded torch.rand (the test-only switch),
    --debug-lockstep stops the run within a few decode steps."""
    monkeypatch.setenv(UNSEEDED_ENV, "1")
    engine = launch(forced_config(2, debug=True))
    try:
        many = [f"{i} " + p for i, p in enumerate(PROMPTS * 2)]
        with pytest.raises(LockstepError, match="accepted counts differ"):
            engine.generate(many, SamplingParams(max_tokens=200, temperature=0))
        assert engine.parallel.steps <= 5  # type: ignore[union-attr]
    finally:
        engine.close()
