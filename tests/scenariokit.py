"""The small Kimi-K3 DSpark scenario the simulator's tests run (b300 x 8, K 7, coding, thinking
on, 256 input tokens): one definition, each test choosing its own request count and lengths."""

from __future__ import annotations

from typing import Any


def kimi_k3(*, requests: int, output_tokens: int = 128, hardware: str = "b300",
            parallel: int = 8) -> dict[str, Any]:  # fmt: skip
    """A fresh scenario dict (callers may change it)."""
    return {
        "model": "kimi-k3",
        "hardware": hardware,
        "deployment": {"pools": [{"parallel": parallel, "engine": {
            "speculative": {"method": "dspark", "num_spec_tokens": 7}, "max_num_seqs": 64}}]},
        "workload": {"category": "coding", "thinking": "on", "input_tokens": 256,
                     "output_tokens": output_tokens, "concurrency": 8, "requests": requests},
    }  # fmt: skip
