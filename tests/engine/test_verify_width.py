"""The verify forward feeds only each request's real drafts.

A request that drafted n tokens feeds 1 + n (not K + 1); the forward is as wide as the widest
request, and the LM head runs only at real positions. The logits at every real position must be
those of the full-width forward (same model, same cache), the padding positions must be 0, and
the step record must state the width actually computed.
"""

from __future__ import annotations

import torch

from enginekit import config
from speclens.engine import Engine, SamplingParams, SpeculativeConfig
from speclens.engine.executor import TorchExecutor
from speclens.engine.model import ForwardBatch
from speclens.engine.request import Request

K = 4


def _engine() -> Engine:
    spec = SpeculativeConfig(num_speculative_tokens=K, method="ngram", ngram_min=2, ngram_max=3)
    return Engine(config(spec, max_model_len=256))


def _prefilled(engine: Engine, prompts: list[list[int]]) -> list[Request]:
    """Admit and prefill ``prompts``; returns the running requests (each has one output)."""
    for p in prompts:
        engine.add_request(p, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    engine.step()
    requests = list(engine.scheduler.running)
    for r in requests:  # room for K + 1 verify slots, as the scheduler gives a decode step
        engine.blocks.reserve(r, r.num_tokens + K)
    return requests


def test_narrow_verify_equals_full_width_at_real_positions() -> None:
    engine = _engine()
    executor = engine.executor
    assert isinstance(executor, TorchExecutor)
    requests = _prefilled(engine, [[65, 66, 67, 68] * 4, list(range(70, 90)), [80, 81] * 7])
    drafts = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]])
    counts = [2, 0, 4]
    with torch.inference_mode():
        full = executor.verify(requests, drafts).logits
        assert executor.last_query_width == K + 1
        narrow = executor.verify(requests, drafts, counts).logits
        assert executor.last_query_width == max(counts) + 1
        # all requests without drafts: a plain one-token decode forward
        plain = executor.verify(requests, drafts, [0, 0, 0]).logits
        assert executor.last_query_width == 1
    assert full is not None and narrow is not None and plain is not None
    assert narrow.shape == full.shape == plain.shape == (3, K + 1, engine.vocab_size)
    for b, n in enumerate(counts):
        torch.testing.assert_close(narrow[b, : n + 1], full[b, : n + 1])
        assert torch.equal(narrow[b, : n + 1].argmax(-1), full[b, : n + 1].argmax(-1))
        assert not narrow[b, n + 1 :].any()  # padding: zeros, never read
        torch.testing.assert_close(plain[b, 0], full[b, 0])
    assert not plain[:, 1:].any()
    assert full.any(dim=-1).all()  # the full-width forward fills every position


def test_weights_multiply_only_the_real_rows(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Padding rows never reach a weight matrix: requests drafting 2, 0 and 4 tokens feed
    3 + 1 + 5 = 9 rows to every projection and MLP matrix (the padded layout is 3 x 5 = 15);
    only the LM head sees fewer (the real positions, the same 9)."""
    import speclens.engine.model as model_module

    engine = _engine()
    executor = engine.executor
    assert isinstance(executor, TorchExecutor)
    requests = _prefilled(engine, [[65, 66, 67, 68] * 4, list(range(70, 90)), [80, 81] * 7])
    rows: list[int] = []
    original = model_module.linear

    def counting(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        rows.append(x.numel() // x.shape[-1])
        return original(x, weight)

    monkeypatch.setattr(model_module, "linear", counting)
    with torch.inference_mode():
        executor.verify(requests, torch.tensor([[5, 6, 7, 8]] * 3), [2, 0, 4])
    assert rows and set(rows) == {3 + 1 + 5}, sorted(set(rows))


def test_step_records_state_the_width_computed() -> None:
    """Decode steps record batch x (1 + the most drafts any request proposed) query tokens, and
    each request's context through that width; at least one step drafted nothing (width 1) and
    one drafted (width > 1), so both cases are checked."""
    engine = _engine()
    widths: list[int] = []
    original = engine.executor.verify

    def recording(requests, draft_ids, num_drafts=None):  # type: ignore[no-untyped-def]
        assert num_drafts is not None  # the torch executor is always told the real counts
        widths.append(1 + max(num_drafts))
        return original(requests, draft_ids, num_drafts)  # type: ignore[call-arg]

    engine.executor.verify = recording  # type: ignore[method-assign]
    contexts: list[int] = []
    prompts = [[65, 66, 67, 68] * 6, list(range(70, 94))]
    for p in prompts:
        engine.add_request(p, SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    while engine.has_unfinished():
        running = [r.num_tokens for r in engine.scheduler.running]
        before = len(engine.steps)
        engine.step()
        if engine.steps[before:] and engine.steps[-1].kind == "decode":
            contexts.append(sum(running))
    decodes = [s for s in engine.steps if s.kind == "decode"]
    assert len(decodes) == len(widths) == len(contexts)
    assert 1 in widths and any(w > 1 for w in widths)
    for record, width, context in zip(decodes, widths, contexts, strict=True):
        assert record.query_tokens == record.num_requests * width
        assert record.context_tokens == context + record.num_requests * (width - 1)


def test_unequal_prompts_prefill_in_one_forward_attending_on_their_own() -> None:
    """Prompts of 3 and 80 tokens prefill in one forward whose weights see their 83 rows and
    whose attention runs per request (padding to 80 would compute 160 rows), and give the same
    tokens as each prompt run alone."""
    from speclens.engine.batch import MAX_ATTENTION_PADDING

    prompts = [[65, 66, 67], list(range(40, 120))]
    assert MAX_ATTENTION_PADDING * (3 + 80) < 2 * 80
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    engine = Engine(config())
    batches: list[ForwardBatch] = []
    assert isinstance(engine.executor, TorchExecutor)
    model = engine.executor.model
    original = model.forward

    def recording(batch, kv, num_layers=None):  # type: ignore[no-untyped-def]
        batches.append(batch)
        return original(batch, kv, num_layers)

    model.forward = recording  # type: ignore[method-assign]
    together = [o.outputs[0].token_ids for o in engine.generate(prompts, params)]
    prefill = batches[0]
    assert prefill.input_ids.shape == (2, 80) and prefill.real is not None
    assert prefill.real.numel() == 83 and prefill.segments is not None
    assert [s.rows for s in prefill.segments] == [(0, 3), (3, 83)]
    assert engine.steps[0].kind == "prefill" and engine.steps[0].query_tokens == 83
    alone = [Engine(config()).generate([p], params)[0].outputs[0].token_ids for p in prompts]
    assert together == alone
