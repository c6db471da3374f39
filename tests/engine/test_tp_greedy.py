"""Greedy decoding at TP 2 on the dummy models (this process is rank 0, one rank process beside
it, gloo, shared by the module): the same tokens as TP 1, the collectives a step runs, and no
host sync in the step's sampling and sharing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from speclens.engine import Engine
from speclens.engine import engine as engine_module
from speclens.engine.parallel import launch
from tpkit import GREEDY, GREEDY_PROMPTS, greedy_config, per_step_collectives


@pytest.fixture(scope="module")
def greedy_tp() -> Iterator[Engine]:
    engine = launch(greedy_config(2))
    yield engine
    engine.close()


def test_greedy_tp2_gives_tp1_tokens(greedy_tp: Engine) -> None:
    one = Engine(greedy_config()).generate(GREEDY_PROMPTS, GREEDY)
    two = greedy_tp.generate(GREEDY_PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in two] == [o.outputs[0].token_ids for o in one]
    stats = greedy_tp.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # accepts some, rejects some


def test_a_step_adds_no_collective_without_the_check(greedy_tp: Engine) -> None:
    """Decode at TP 2, check off: the plan (2 broadcasts), the proposal and the sampled tokens
    (one each), 2 all-reduces per target layer and per layer of each of the K draft forwards;
    no lockstep all-reduce."""
    steps = per_step_collectives(greedy_tp, lambda: greedy_tp.generate(GREEDY_PROMPTS[:2], GREEDY))
    target_layers, draft_layers, k = 4, 2, 4
    decode = [calls for kind, calls in steps if kind == "decode"]
    assert decode
    expected = {"plan": 2, "proposal": 1, "tokens": 1,
                "all_reduce": 2 * target_layers + k * 2 * draft_layers}  # fmt: skip
    assert all(calls == expected for calls in decode), decode[0]


def test_the_tp_step_samples_and_shares_without_a_host_sync(
    greedy_tp: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sampler and the broadcast of its tokens run under the no-host-sync guard; a counting
    hook on the collectives shows the broadcast ran inside it, once per decode step."""
    from sampling.syncguard import no_host_sync

    guarded: Counter[str] = Counter()
    inside = [False]
    greedy_tp.parallel.comm.listeners.append(  # type: ignore[union-attr]
        lambda kind: guarded.update([kind]) if inside[0] else None
    )
    sample, share = engine_module.rejection_sample, Engine._share_sampled

    def sample_guarded(*args: Any, **kwargs: Any) -> Any:
        with no_host_sync():
            return sample(*args, **kwargs)

    def share_guarded(self: Engine, out: Any, forced: bool) -> Any:
        inside[0] = True
        try:
            with no_host_sync():
                return share(self, out, forced)
        finally:
            inside[0] = False

    monkeypatch.setattr(engine_module, "rejection_sample", sample_guarded)
    monkeypatch.setattr(Engine, "_share_sampled", share_guarded)
    try:
        before = sum(1 for s in greedy_tp.steps if s.kind == "decode")
        greedy_tp.generate(GREEDY_PROMPTS[:2], GREEDY)
        decodes = sum(1 for s in greedy_tp.steps if s.kind == "decode") - before
    finally:
        greedy_tp.parallel.comm.listeners.clear()  # type: ignore[union-attr]
    assert decodes > 0 and guarded == {"tokens": decodes}
