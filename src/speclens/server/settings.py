"""What the server is told at start-up, apart from the engine's own configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from speclens.server.protocol import StatsLevel


@dataclass
class ServerSettings:
    served_model_name: str
    api_key: str | None = None
    stats_level: StatsLevel = "none"
    default_max_tokens: int = 16
    max_body_bytes: int = 8 * 1024 * 1024
    max_n: int = 16
    #: Seconds a client may take to send a request's headers, or stall within its body.
    idle_timeout_s: float = 30.0
    #: What /version reports about acceptance (settings, and a resolution's provenance).
    acceptance: dict[str, Any] = field(default_factory=dict)
    #: vLLM's ``--enable-force-include-usage``: every stream ends with the usage chunk (and root
    #: ``metrics``) and every chunk carries usage, whatever the request's ``stream_options``.
    force_include_usage: bool = False
