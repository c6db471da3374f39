"""The embedded models: seeded dummy weights for the byte tokenizer, a target and its drafter."""

from __future__ import annotations

import torch

from speclens.engine.model import LlamaModel, ModelConfig
from speclens.engine.tokenizer import ByteTokenizer
from speclens.engine.weights_base import empty_model

_BYTES = ByteTokenizer()

DUMMY_TARGET = ModelConfig(
    vocab_size=320,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
    bos_token_id=_BYTES.bos_token_id,
    eos_token_id=_BYTES.eos_token_id,
)
"""The embedded target: a tiny Llama for the byte tokenizer (256 bytes + specials, room to 320)."""

DUMMY_DRAFT = ModelConfig(
    vocab_size=320,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
    bos_token_id=_BYTES.bos_token_id,
    eos_token_id=_BYTES.eos_token_id,
)
"""The embedded drafter: same vocabulary as ``DUMMY_TARGET``, about a quarter of its width."""

DUMMY_STD = 0.02


def dummy_model(
    config: ModelConfig,
    seed: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> LlamaModel:
    """Random weights like vLLM's ``--load-format dummy``: normal(0, 0.02) matrices and
    embeddings, norms at one. Drawn on the CPU in float32 from a private generator, so a seed gives
    bit-identical weights on any device and the global RNG is untouched."""
    model = empty_model(config, dtype, device)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                values = torch.empty(param.shape, dtype=torch.float32)
                values.normal_(0.0, DUMMY_STD, generator=generator)
                param.copy_(values)
    return model.eval()
