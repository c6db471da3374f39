"""``build_engine``: the engine is loaded on a thread that has ended before serving starts.

PyTorch's OpenMP runtime keeps a worker pool per thread that has run a parallel region; one left
on the main thread by loading the weights slowed every forward on the engine thread by about 40%
(measured in ``benchmarks/peers.py``). These tests hold the contract that avoids it: the build
runs on another thread, that thread is gone, and a failure reaches the caller unchanged.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

import speclens.server.runner as runner_module
from speclens.engine import Engine, EngineConfig
from speclens.engine.config import ConfigError
from speclens.server import build_engine


def test_the_engine_is_built_on_a_thread_that_has_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    builders: list[threading.Thread] = []

    def recording(config: EngineConfig) -> Engine:
        builders.append(threading.current_thread())
        return Engine(config)

    monkeypatch.setattr(runner_module, "Engine", recording)
    engine = build_engine(EngineConfig(max_model_len=256, kv_cache_tokens=1024))

    assert isinstance(engine, Engine)
    assert len(builders) == 1
    assert builders[0] is not threading.current_thread()
    assert not builders[0].is_alive()
    # The engine works from the caller's side too.
    from speclens.engine import SamplingParams

    out = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=3, temperature=0))
    assert len(out[0].outputs[0].token_ids) == 3


def test_a_failed_build_raises_the_engines_error_on_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def failing(config: Any) -> Engine:
        raise ConfigError("max_model_len: expected at least 16, got 1")

    monkeypatch.setattr(runner_module, "Engine", failing)
    with pytest.raises(ConfigError, match="max_model_len: expected at least 16, got 1"):
        build_engine(EngineConfig())
