"""Helpers shared by the engine tests."""

from __future__ import annotations

from speclens.engine import EngineConfig, SpeculativeConfig


def config(speculative: SpeculativeConfig | None = None, **kwargs: object) -> EngineConfig:
    """A small engine: the embedded dummy models, a modest cache and context."""
    kwargs.setdefault("kv_cache_tokens", 8192)
    kwargs.setdefault("max_model_len", 1024)
    kwargs.setdefault("max_num_batched_tokens", 4096)
    return EngineConfig(speculative=speculative or SpeculativeConfig(), **kwargs)  # type: ignore[arg-type]
