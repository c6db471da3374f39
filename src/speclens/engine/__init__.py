"""A reference speculative-decoding engine: continuous batching, a Llama-family model against a
paged KV cache, draft-model and n-gram drafters, real (torch) or priced (sim) forward passes,
and forced acceptance. Needs the ``engine`` extra."""

from speclens.engine.config import (
    ConfigError,
    EngineConfig,
    SpeculativeConfig,
    StepCost,
)
from speclens.engine.engine import Engine, StepRecord
from speclens.engine.request import (
    CompletionOutput,
    RequestAcceptance,
    RequestOutput,
    SamplingError,
    SamplingParams,
)

__all__ = [
    "CompletionOutput",
    "ConfigError",
    "Engine",
    "EngineConfig",
    "RequestAcceptance",
    "RequestOutput",
    "SamplingError",
    "SamplingParams",
    "SpeculativeConfig",
    "StepCost",
    "StepRecord",
]
