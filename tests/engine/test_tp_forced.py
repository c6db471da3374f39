"""Forced acceptance at TP 2 on the dummy models (this process is rank 0, one rank process
beside it, gloo): the forced draw in lockstep on every rank, and the lockstep check's negative
control. A process holds one process group at a time, so each test starts and stops its own."""

from __future__ import annotations

from collections import Counter

import pytest

from speclens.engine import Engine, SamplingParams
from speclens.engine.lockstep import UNSEEDED_ENV, LockstepError
from speclens.engine.parallel import launch
from tpkit import PROMPTS, forced_config, per_step_collectives


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
