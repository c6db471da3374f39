"""The acceptance quantity, its schedules and histogram, profile sets, the registry and the
resolver. Pure Python (no torch): every other part of speclens reads acceptance through here."""

from speclens.acceptance.errors import (
    AmbiguousProfile,
    NoCategory,
    NoMatchingProfile,
    NoThinkingMode,
    Problem,
    ResolutionRefused,
    UnknownProfileSet,
    ValidationError,
    WrongNumSpecTokens,
)
from speclens.acceptance.files import load, read_yaml, validate
from speclens.acceptance.histogram import AcceptanceHistogram
from speclens.acceptance.quantity import (
    RATES_SUM_TOLERANCE,
    acceptance_rate,
    accepted_count_distribution,
    check_length,
    check_num_spec_tokens,
    check_rates,
    conditional_rates,
    length_from_rate,
    length_from_rates,
    minimum_variance_rates,
)
from speclens.acceptance.registry import RegisteredSet, Registry, load_sets, shipped_registry
from speclens.acceptance.resolver import LAYERS, Layer, Resolution, resolve
from speclens.acceptance.schema import (
    AcceptancePin,
    AcceptanceProfileSet,
    AcceptanceValue,
    Profile,
    ProfileKey,
    Provenance,
    Sampling,
    WorkloadAcceptance,
)

__all__ = [
    "LAYERS",
    "RATES_SUM_TOLERANCE",
    "AcceptanceHistogram",
    "AcceptancePin",
    "AcceptanceProfileSet",
    "AcceptanceValue",
    "AmbiguousProfile",
    "Layer",
    "NoCategory",
    "NoMatchingProfile",
    "NoThinkingMode",
    "Problem",
    "Profile",
    "ProfileKey",
    "Provenance",
    "RegisteredSet",
    "Registry",
    "Resolution",
    "ResolutionRefused",
    "Sampling",
    "UnknownProfileSet",
    "ValidationError",
    "WorkloadAcceptance",
    "WrongNumSpecTokens",
    "acceptance_rate",
    "accepted_count_distribution",
    "check_length",
    "check_num_spec_tokens",
    "check_rates",
    "conditional_rates",
    "length_from_rate",
    "length_from_rates",
    "load",
    "load_sets",
    "minimum_variance_rates",
    "read_yaml",
    "resolve",
    "shipped_registry",
    "validate",
]
