"""``resolve``: pick exactly one acceptance value for a run and record where it came from.

Layers, lowest to highest: registry, workload, scenario, cli. The highest layer that states
acceptance wins; layers are never merged. Every refusal is its own ``ResolutionRefused`` subclass.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from speclens.acceptance.errors import (
    AmbiguousProfile,
    NoCategory,
    NoMatchingProfile,
    NoThinkingMode,
    UnknownProfileSet,
    WrongNumSpecTokens,
)
from speclens.acceptance.quantity import (
    acceptance_rate,
    check_num_spec_tokens,
    minimum_variance_rates,
)
from speclens.acceptance.registry import Registry
from speclens.acceptance.schema import (
    AcceptancePin,
    AcceptanceSpread,
    AcceptanceValue,
    Profile,
    ProfileKey,
    WorkloadAcceptance,
)

Layer = Literal["registry", "workload", "scenario", "cli"]
LAYERS: tuple[Layer, ...] = ("registry", "workload", "scenario", "cli")
#: Coverage when none is stated: every decode step drafts (forced and model-based drafters).
FULL_COVERAGE = 1.0


class Resolution(BaseModel):
    """The one acceptance value a run uses, and where it came from."""

    model_config = ConfigDict(frozen=True)

    acceptance_length: float
    per_position_rates: list[float]
    num_spec_tokens: int
    layer: Layer
    #: The set and profile key that supplied it (profile layers only).
    profile_set: str | None = None
    profile: str | None = None
    #: The profile's method (measured, inferred, copied, assumed); None for inline values.
    method: str | None = None
    #: The cited source: the profile's provenance.source, or the inline value's source.
    source: str | None = None
    #: The category of the profile used, and the workload's category a fallback replaced.
    category: str | None = None
    fallback_used: bool = False
    fallback_category: str | None = None
    #: The hardware the profile was measured on, when it differs from the run's (or that is unknown).
    measured_on: str | None = None
    #: True when the rates were derived with the minimum-variance schedule, not stated.
    rates_derived: bool
    #: The share of decode steps that draft (AL counts only those); 1.0 unless stated.
    draft_coverage: float = FULL_COVERAGE
    draft_coverage_stated: bool = False
    #: The per-request AL's spread the winning layer states with its value (never merged from
    #: another layer); None: unknown, so every request gets the mean's schedule.
    spread: AcceptanceSpread | None = None

    @property
    def acceptance_rate(self) -> float:
        """(AL - 1) / K."""
        return acceptance_rate(self.acceptance_length, self.num_spec_tokens)


def _check_k(layer: str, value: AcceptanceValue | None, k: int) -> None:
    if value is not None and value.num_spec_tokens != k:
        raise WrongNumSpecTokens(
            f"the {layer} value was stated for num_spec_tokens {value.num_spec_tokens}, but the "
            f"deployment speculates {k}; a value is refused at another K, never rescaled"
        )


def _from_value(layer: Layer, value: AcceptanceValue) -> Resolution:
    length = value.length
    stated = value.per_position_rates
    rates = (
        list(stated)
        if stated is not None
        else minimum_variance_rates(length, value.num_spec_tokens)
    )
    return Resolution(
        acceptance_length=length,
        per_position_rates=rates,
        num_spec_tokens=value.num_spec_tokens,
        layer=layer,
        source=value.source,
        rates_derived=stated is None,
        draft_coverage=FULL_COVERAGE if value.draft_coverage is None else value.draft_coverage,
        draft_coverage_stated=value.draft_coverage is not None,
        spread=value.spread,
    )


def _from_profile(
    layer: Layer,
    set_name: str,
    profile: Profile,
    hardware: str | None,
    replaced: str | None,
    fallback_used: bool,
) -> Resolution:
    stated = profile.per_position_rates
    rates = (
        list(stated)
        if stated is not None
        else minimum_variance_rates(profile.acceptance_length, profile.num_spec_tokens)
    )
    measured_on = profile.provenance.hardware if profile.provenance else None
    if measured_on and hardware and measured_on.lower() == hardware.lower():
        measured_on = None
    return Resolution(
        acceptance_length=profile.acceptance_length,
        per_position_rates=rates,
        num_spec_tokens=profile.num_spec_tokens,
        layer=layer,
        profile_set=set_name,
        profile=str(profile.key),
        method=profile.method,
        source=profile.provenance.source if profile.provenance else None,
        category=profile.category,
        fallback_used=fallback_used,
        fallback_category=replaced,
        measured_on=measured_on,
        rates_derived=stated is None,
        draft_coverage=FULL_COVERAGE if profile.draft_coverage is None else profile.draft_coverage,
        draft_coverage_stated=profile.draft_coverage is not None,
        spread=profile.spread,
    )


#: A measured value outranks one inferred from a run (its TPOT, a model of the curve), which
#: outranks one copied from another key, which outranks an assumed one.
METHOD_RANK = {"measured": 0, "inferred": 1, "copied": 2, "assumed": 3}


def _best(hits: list[tuple[str, Profile]]) -> list[tuple[str, Profile]]:
    """The hits of the best method: a set that measured a key outranks one that quotes or
    assumes it. Two of the best method are both returned (and refused as ambiguous)."""
    if not hits:
        return hits
    best = min(METHOD_RANK[p.method] for _, p in hits)
    return [(name, p) for name, p in hits if METHOD_RANK[p.method] == best]


def _lookup(
    layer: Layer,
    registry: Registry,
    names: list[str] | None,
    key: ProfileKey,
    fallback: str | None,
    hardware: str | None,
    workload_category: str | None,
) -> Resolution:
    where = (
        f"the set {names[0]!r}"
        if names
        else f"the registry sets ({', '.join(registry.names) or 'none'})"
    )
    tried: list[str] = []
    for category, is_fallback in ((workload_category, False), (fallback, True)):
        if category is None:
            continue
        candidate = key.model_copy(update={"category": category})
        hits = _best(registry.find(candidate, names))
        if len(hits) > 1:
            sets = ", ".join(name for name, _ in hits)
            method = hits[0][1].method
            raise AmbiguousProfile(
                f"two registry sets both match {candidate} with method {method}: {sets}; remove one"
            )
        if hits:
            name, profile = hits[0]
            return _from_profile(
                layer,
                name,
                profile,
                hardware,
                workload_category if is_fallback else None,
                is_fallback,
            )
        tried.append(str(candidate))
    hint = (
        ""
        if fallback
        else "; request a fallback_category in the scenario's acceptance pin, or state a value"
    )
    raise NoMatchingProfile(f"no acceptance profile for {' nor '.join(tried)} in {where}{hint}")


def resolve(
    *,
    model: str,
    method: str,
    num_spec_tokens: int,
    registry: Registry,
    hardware: str | None = None,
    workload: WorkloadAcceptance | None = None,
    scenario: AcceptancePin | None = None,
    cli: AcceptanceValue | None = None,
) -> Resolution:
    """Resolve the run's acceptance: the highest layer that states one wins.

    ``model``, ``method`` and ``num_spec_tokens`` are the deployment's; ``hardware`` the run's chip
    (recorded against a profile's); ``workload`` its thinking mode, category and inline value;
    ``scenario`` the scenario's pin; ``cli`` the command line's value at the deployment's K.
    """
    k = check_num_spec_tokens(num_spec_tokens)
    workload = workload or WorkloadAcceptance()
    for name, value in (
        ("workload", workload.acceptance),
        ("scenario", scenario.value if scenario else None),
        ("cli", cli),
    ):
        _check_k(name, value, k)

    if cli is not None:
        return _from_value("cli", cli)
    named = scenario.profiles if scenario else None
    if scenario is not None and scenario.value is not None:
        return _from_value("scenario", scenario.value)
    if named is not None and named not in registry:
        raise UnknownProfileSet(
            f"the scenario names the profile set {named!r}, which was not supplied "
            f"(supplied: {', '.join(registry.names) or 'none'}); the registry is not consulted in its place"
        )
    if named is None and workload.acceptance is not None:
        return _from_value("workload", workload.acceptance)

    # A profile lookup: in the set the scenario names (scenario layer), else every registry set.
    layer: Layer = "scenario" if named else "registry"
    fallback = scenario.fallback_category if scenario else None
    looking_for = f"{model}/{method}/k{k}"
    if workload.thinking is None:
        raise NoThinkingMode(
            f"cannot look up {looking_for}: the workload states no thinking mode (on or off)"
        )
    if workload.category is None and fallback is None:
        raise NoCategory(
            f"cannot look up {looking_for}/thinking-{workload.thinking}: the workload states no "
            "category and no fallback_category was requested"
        )
    key = ProfileKey(
        model=model,
        speculative_method=method,
        num_spec_tokens=k,
        thinking=workload.thinking,
        category=workload.category or fallback or "",
    )
    return _lookup(
        layer, registry, [named] if named else None, key, fallback, hardware, workload.category
    )
