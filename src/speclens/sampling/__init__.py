"""Rejection sampling for speculative decoding (greedy, probabilistic, forced) and the
engine-side statistics of what it did. Needs the ``engine`` extra (torch)."""

from speclens.sampling.rejection import (
    METHODS,
    PLACEHOLDER,
    Method,
    SamplerOutput,
    rejection_sample,
)
from speclens.sampling.stats import SpecDecodeStats
from speclens.sampling.synthetic import SyntheticAcceptance

__all__ = [
    "METHODS",
    "PLACEHOLDER",
    "Method",
    "SamplerOutput",
    "SpecDecodeStats",
    "SyntheticAcceptance",
    "rejection_sample",
]
