"""Continuous batching driven by hand (add_request / step / abort): late requests join the running
batch, outputs stream incrementally and add up to the final ones, max_num_seqs bounds the running
batch, and abort frees the KV cache at once with statistics kept only for the steps that ran."""

from __future__ import annotations

from collections import defaultdict

import pytest

from enginekit import config
from speclens.engine import Engine, RequestOutput, SamplingParams, SpeculativeConfig

GREEDY = SamplingParams(max_tokens=30, temperature=0.0)
PROMPTS: list[str | list[int]] = [
    "Hello world",
    "abcabcabcabcabcabc",
    list(range(1, 13)),
    "The quick brown fox",
    "zzzzzzzz",
]


def draft(k: int = 3) -> SpeculativeConfig:
    return SpeculativeConfig(method="draft_model", num_speculative_tokens=k)


def ngram(k: int = 3) -> SpeculativeConfig:
    return SpeculativeConfig(method="ngram", num_speculative_tokens=k)


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    """Plain greedy output of each prompt, decoded alone."""
    engine = Engine(config())
    return [engine.generate([p], GREEDY)[0].outputs[0].token_ids for p in PROMPTS]


def drain(engine: Engine) -> dict[str, list[RequestOutput]]:
    """Step until idle; every output per request id, in order."""
    streamed: dict[str, list[RequestOutput]] = defaultdict(list)
    while engine.has_unfinished():
        for out in engine.step():
            streamed[out.request_id].append(out)
    return streamed


# --------------------------------------------------------------------------- continuous batching


@pytest.mark.parametrize("speculative", [None, "draft", "ngram"])
def test_late_request_joins_the_running_batch(
    reference: list[list[int]], speculative: str | None
) -> None:
    spec = {None: None, "draft": draft(), "ngram": ngram()}[speculative]
    engine = Engine(config(spec))
    a = engine.add_request(PROMPTS[0], GREEDY, request_id="a")
    outs = engine.step()  # prefill a
    assert [o.request_id for o in outs] == ["a"] and engine.steps[-1].kind == "prefill"
    for _ in range(2):  # decode a alone
        assert [o.request_id for o in engine.step()] == ["a"]
        assert engine.steps[-1].kind == "decode" and engine.steps[-1].num_requests == 1
    b = engine.add_request(PROMPTS[1], GREEDY, request_id="b")
    assert engine.num_waiting == 1 and engine.num_running == 1
    assert [o.request_id for o in engine.step()] == ["b"]  # prefill b
    assert engine.num_running == 2 and engine.num_waiting == 0
    outs = engine.step()  # one decode step for both
    assert sorted(o.request_id for o in outs) == ["a", "b"]
    assert engine.steps[-1].kind == "decode" and engine.steps[-1].num_requests == 2
    final = {rid: outs[-1] for rid, outs in drain(engine).items()}
    assert final[a].finished and final[b].finished
    assert final[a].outputs[0].token_ids == reference[0]
    assert final[b].outputs[0].token_ids == reference[1]
    assert engine.blocks.num_free == engine.blocks.num_blocks
    assert engine.step() == []  # idle


def test_idle_engine_steps_return_nothing() -> None:
    engine = Engine(config(ngram()))
    assert not engine.has_unfinished()
    assert engine.step() == []
    assert engine.steps == [] and engine.clock == 0.0


# --------------------------------------------------------------------------- streaming


@pytest.mark.parametrize("speculative", [None, "draft", "ngram"])
def test_outputs_stream_incrementally(speculative: str | None) -> None:
    spec = {None: None, "draft": draft(), "ngram": ngram(7)}[speculative]
    engine = Engine(config(spec))
    params = [
        SamplingParams(max_tokens=30, temperature=0.0),
        SamplingParams(max_tokens=30, temperature=0.0, stop=["}X"]),  # stops mid-stream
        SamplingParams(max_tokens=25, temperature=0.8, seed=1, n=2),
        SamplingParams(max_tokens=30, temperature=0.0, stop=["zzz", "KKK"]),
    ]
    prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[2]]
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    streamed = drain(engine)
    assert sorted(streamed) == sorted(ids)
    for rid, sp in zip(ids, params, strict=True):
        outs = streamed[rid]
        final = outs[-1]
        assert final.finished and not any(o.finished for o in outs[:-1])
        assert len(outs) > 1  # more than one chunk
        for index in range(sp.n):
            completion = final.outputs[index]
            tokens = [t for o in outs for t in o.new_token_ids[index]]
            assert tokens == completion.token_ids
            text = "".join(o.new_text[index] for o in outs)
            assert text == completion.text
            for o in outs:  # cumulative views are prefixes of the final one
                assert completion.token_ids[: len(o.outputs[index].token_ids)] == (
                    o.outputs[index].token_ids
                )
                assert completion.text.startswith(o.outputs[index].text)
            for stop in sp.stop:
                assert all(stop not in o.outputs[index].text for o in outs)
                assert stop not in text
    # the '}X' request really stopped on its stop string
    assert streamed[ids[1]][-1].outputs[0].finish_reason == "stop"


# --------------------------------------------------------------------------- max_num_seqs


@pytest.mark.parametrize("max_num_seqs", [1, 2])
def test_max_num_seqs_limits_the_running_batch(
    reference: list[list[int]], max_num_seqs: int
) -> None:
    engine = Engine(config(ngram(), max_num_seqs=max_num_seqs))
    ids = [engine.add_request(p, GREEDY) for p in PROMPTS]
    final = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
        assert engine.num_running <= max_num_seqs
        assert engine.steps[-1].num_requests <= max_num_seqs
    assert max(s.num_requests for s in engine.steps) == max_num_seqs
    for rid, expected in zip(ids, reference, strict=True):
        assert final[rid].outputs[0].token_ids == expected


# --------------------------------------------------------------------------- abort


def test_abort_frees_kv_and_stops_output() -> None:
    engine = Engine(config(draft()))
    blocks = engine.blocks
    rid = engine.add_request(PROMPTS[3], SamplingParams(max_tokens=100, temperature=0.0))
    last = None
    for _ in range(3):  # prefill + 2 verify steps
        (last,) = engine.step()
    assert last is not None and not last.finished
    assert blocks.num_free < blocks.num_blocks
    assert engine.stats.num_drafts == 2  # the dummy drafter always proposes K
    acceptance = last.outputs[0].acceptance
    tokens_before = list(last.outputs[0].token_ids)
    assert engine.abort(rid) is True
    assert blocks.num_free == blocks.num_blocks
    assert not engine.has_unfinished()
    assert engine.abort(rid) is False  # already gone
    assert engine.step() == []
    # other requests run on; the aborted one never reappears and its counts stay put
    other = engine.add_request(PROMPTS[0], GREEDY)
    streamed = drain(engine)
    assert set(streamed) == {other}
    assert acceptance.num_spec_steps == 2
    assert last.outputs[0].token_ids == tokens_before
    other_steps = streamed[other][-1].outputs[0].acceptance.num_spec_steps
    assert engine.stats.num_drafts == 2 + other_steps
    assert engine.stats.num_draft_tokens == 3 * (2 + other_steps)
    assert blocks.num_free == blocks.num_blocks


def test_abort_waiting_and_n_requests() -> None:
    engine = Engine(config(ngram(), max_num_seqs=2))
    running = engine.add_request(PROMPTS[0], SamplingParams(max_tokens=30, n=2, temperature=0.8))
    waiting = engine.add_request(PROMPTS[1], GREEDY)
    engine.step()  # prefill the two sequences of 'running'; 'waiting' waits (max_num_seqs)
    assert engine.num_running == 2 and engine.num_waiting == 1
    assert engine.abort(waiting)
    assert engine.num_waiting == 0
    engine.step()
    assert engine.abort(running)
    assert engine.num_running == 0
    assert engine.blocks.num_free == engine.blocks.num_blocks
    assert not engine.has_unfinished()
    assert engine.step() == []
    assert engine.abort("never-added") is False


# --------------------------------------------------------------------------- preemption


def test_preemptions_are_counted_once_each(reference: list[list[int]]) -> None:
    """A cache that holds about one request forces preemption (recompute). Every request that
    drops from running back to the front of the queue during a step is one preemption:
    ``Scheduler.num_preemptions`` counts exactly those, as do the requests' own counts."""
    engine = Engine(config(draft(), kv_cache_tokens=80, max_model_len=64))
    ids = [engine.add_request(p, GREEDY) for p in PROMPTS]
    requests = [r for rid in ids for r in engine._groups[rid]]
    seen, final = 0, {}
    while engine.has_unfinished():
        running = list(engine.scheduler.running)
        before = engine.scheduler.num_preemptions
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
        victims = [r for r in running if r in engine.scheduler.waiting]
        assert engine.scheduler.num_preemptions - before == len(victims)
        front = list(engine.scheduler.waiting)[: len(victims)]
        assert all(any(v is r for r in front) for v in victims)  # back at the front
        seen += len(victims)
    assert seen > 0, "the small cache never preempted"
    assert engine.scheduler.num_preemptions == seen == sum(r.num_preemptions for r in requests)
    for rid, expected in zip(ids, reference, strict=True):
        assert final[rid].outputs[0].token_ids == expected


def test_the_step_history_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server's engine steps for as long as it runs: its step records keep the most recent
    ones only, the last of them the step just run."""
    import speclens.engine.engine as engine_module

    monkeypatch.setattr(engine_module, "STEP_HISTORY", 4)
    engine = Engine(config())
    engine.generate([PROMPTS[0]], GREEDY)  # a prefill and 29 decode steps
    assert 4 <= len(engine.steps) < 8, len(engine.steps)
    assert engine.steps[-1].kind == "decode" and engine.steps[0].kind == "decode"
