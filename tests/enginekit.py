"""Helpers shared by the engine tests."""

from __future__ import annotations

import torch

from speclens.engine import EngineConfig, SpeculativeConfig
from speclens.engine.model import ForwardBatch, KVPool, LlamaModel


def config(speculative: SpeculativeConfig | None = None, **kwargs: object) -> EngineConfig:
    """A small engine: the embedded dummy models, a modest cache and context."""
    kwargs.setdefault("kv_cache_tokens", 8192)
    kwargs.setdefault("max_model_len", 1024)
    kwargs.setdefault("max_num_batched_tokens", 4096)
    return EngineConfig(speculative=speculative or SpeculativeConfig(), **kwargs)  # type: ignore[arg-type]


def prefill_logits(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    """Logits [n, V] of one sequence, prefilled in one forward."""
    n = len(ids)
    positions = torch.arange(n)[None]
    kv = KVPool(model.config, model.num_layers, -(-n // 16), 16, torch.float32, torch.device("cpu"))
    causal = (torch.arange(n)[None, :] <= torch.arange(n)[:, None])[None, None]
    batch = ForwardBatch(torch.tensor([ids]), positions, positions.clone(), positions, causal)
    with torch.no_grad():
        return model.logits(model(batch, kv))[0]
