"""What the server is told at start-up, apart from the engine's own configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from speclens.acceptance.spread import LEVEL_NAMES, SPREAD_UNKNOWN, fitted
from speclens.engine.config import SpeculativeConfig
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


def acceptance_settings(spec: SpeculativeConfig, resolution: Any = None) -> dict[str, Any]:
    """``/version``'s ``acceptance``: the speculative settings, the forced target, the spread
    forced with it (``spread``: null when none; a forced server without one also says its tails
    are the minimum-variance schedule's, ``spread_note``), and a profile's resolution."""
    acceptance: dict[str, Any] = {
        "method": spec.method,
        "num_speculative_tokens": spec.num_speculative_tokens,
        "forced": spec.forced,
        "acceptance_length": spec.forced_acceptance_length,
        "per_position_rates": spec.per_position_rates,
    }
    if spec.method == "ngram":  # so measure's provenance says which lookup was measured
        acceptance |= {"prompt_lookup_min": spec.ngram_min, "prompt_lookup_max": spec.ngram_max}
    if spec.draft_coverage < 1:
        acceptance["draft_coverage"] = spec.draft_coverage
    spread, length = spec.acceptance_spread, spec.forced_acceptance_length
    if spread is None or length is None:
        acceptance["spread"] = None
        if spec.forced:
            acceptance["spread_note"] = SPREAD_UNKNOWN
    else:
        knots = fitted(spread.values, length, spec.num_speculative_tokens)
        acceptance["spread"] = spread.model_dump(mode="json") | {
            "fitted_quantiles": dict(zip(LEVEL_NAMES, knots, strict=True)),
            "rates_derived": spec.rates_derived,
            "from": "--acceptance-profile"
            if resolution is not None
            else "--spec-decode-acceptance-spread",
        }
    if resolution is not None:
        acceptance["resolution"] = resolution.model_dump()
    return acceptance
