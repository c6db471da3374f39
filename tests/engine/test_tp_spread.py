"""Forced acceptance with a spread at TP 2 on the dummy models (this process is rank 0, one rank
process beside it, gloo): every rank draws each request's own AL from the request id it shares
with rank 0, so the ranks' accepted counts agree step by step (``--debug-lockstep`` checks each
step) and match TP 1's for the same ids."""

from __future__ import annotations

from dataclasses import replace

from speclens.acceptance import AcceptanceSpread
from speclens.acceptance.spread import LEVEL_NAMES
from speclens.engine import Engine, EngineConfig, SamplingParams
from speclens.engine.parallel import launch
from tpkit import PROMPTS, forced_config

QUANTILES = [1.6, 1.9, 2.2, 2.9, 3.8, 4.6, 5.4, 5.9, 6.8]  # K 7, implied mean 3.81 (AL 3.78)


def spread_config(size: int) -> EngineConfig:
    config = forced_config(size, debug=size > 1)
    spread = AcceptanceSpread(
        num_spec_tokens=7, quantiles=dict(zip(LEVEL_NAMES, QUANTILES, strict=True)), requests=64
    )
    spec = replace(config.speculative, acceptance_spread=spread)
    return replace(config, speculative=spec)


def per_request(engine: Engine) -> dict[str, list[int]]:
    """Every prompt at once, under fixed ids: each request's accepted count per verify step."""
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS * 2):
        engine.add_request(prompt, params, request_id=f"r{i}")
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].acceptance.per_step_accepted
    return done


def test_tp2_ranks_draw_each_request_s_own_al_in_lockstep() -> None:
    tp = launch(spread_config(2))
    try:
        two = per_request(tp)  # --debug-lockstep: a step the ranks disagree on raises here
        logs = tp.parallel.gather_logs()  # type: ignore[union-attr]
    finally:
        tp.close()
    assert len(logs) == 2 and logs[0] == logs[1] and len(logs[0]) > 10
    one = per_request(Engine(spread_config(1)))
    assert two == one
    # the requests do spread: their realized ALs are not one schedule's 2-or-3 per step
    means = sorted(sum(steps) / len(steps) for steps in one.values())
    assert means[-1] - means[0] > 1.0, means
