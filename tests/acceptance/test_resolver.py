"""The resolver: one acceptance value per run, from the highest layer that states one.

Layers, lowest to highest: registry, workload, scenario, cli. Layers are never merged, every
refusal is its own ``ResolutionRefused`` subclass whose message names what was looked for and what
is missing, and the resolution records where its value came from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from speclens.acceptance import (
    AcceptancePin,
    AcceptanceValue,
    AmbiguousProfile,
    NoCategory,
    NoMatchingProfile,
    NoThinkingMode,
    Registry,
    Resolution,
    ResolutionRefused,
    UnknownProfileSet,
    WorkloadAcceptance,
    WrongNumSpecTokens,
    load_sets,
    minimum_variance_rates,
    resolve,
)

MODEL = "test-model"
METHOD = "eagle3"
K = 3
SOURCE = "https://example.org/curves/test-model.yaml"


# --------------------------------------------------------------------------- helpers
def measured(**over: Any) -> dict[str, Any]:
    """A measured profile for (MODEL, METHOD, K, thinking on, coding), AL 2.5, on b300."""
    profile: dict[str, Any] = {
        "model": MODEL,
        "speculative_method": METHOD,
        "num_spec_tokens": K,
        "thinking": "on",
        "category": "coding",
        "acceptance_length": 2.5,
        "method": "measured",
        "provenance": {
            "source": SOURCE,
            "hardware": "b300",
            "engine_image": "vllm/vllm-openai:test",
            "sampling": {"temperature": 1.0},
        },
    }
    profile.update(over)
    return profile


def assumed(**over: Any) -> dict[str, Any]:
    """An assumed profile without provenance."""
    profile: dict[str, Any] = {
        "model": MODEL,
        "speculative_method": METHOD,
        "num_spec_tokens": K,
        "thinking": "on",
        "category": "coding",
        "acceptance_length": 2.2,
        "method": "assumed",
        "rationale": "A guess for the test.",
    }
    profile.update(over)
    return profile


def write_set(root: Path, name: str, profiles: list[dict[str, Any]]) -> Path:
    """Write ``root/acceptance/<name>.yaml`` and return its path."""
    folder = root / "acceptance"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    document = {"kind": "AcceptanceProfileSet", "name": name, "profiles": profiles}
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def registry_of(tmp_path: Path, **sets: list[dict[str, Any]]) -> Registry:
    """A registry directory holding the given sets (no shipped sets)."""
    root = tmp_path / "registry"
    for name, profiles in sets.items():
        write_set(root, name, profiles)
    return Registry.load(extra=[root], shipped=False)


def value(**fields: Any) -> AcceptanceValue:
    return AcceptanceValue.model_validate({"num_spec_tokens": K, **fields})


def workload(
    thinking: str | None = "on",
    category: str | None = "coding",
    acceptance: AcceptanceValue | None = None,
) -> WorkloadAcceptance:
    return WorkloadAcceptance(thinking=thinking, category=category, acceptance=acceptance)


def pin(**fields: Any) -> AcceptancePin:
    return AcceptancePin.model_validate(fields)


def run(registry: Registry, **kwargs: Any) -> Resolution:
    kwargs.setdefault("workload", workload())
    return resolve(model=MODEL, method=METHOD, num_spec_tokens=K, registry=registry, **kwargs)


@pytest.fixture
def reg(tmp_path: Path) -> Registry:
    """One set, ``team-al``, with a coding profile (AL 2.5, no rates) measured on b300."""
    return registry_of(tmp_path, **{"team-al": [measured()]})


# --------------------------------------------------------------------------- each layer winning
def test_registry_layer_wins_when_only_the_registry_states_acceptance(reg: Registry) -> None:
    r = run(reg, hardware="b300")
    assert r.layer == "registry"
    assert r.acceptance_length == 2.5
    assert r.num_spec_tokens == K
    assert r.per_position_rates == [1.0, 0.5, 0.0]
    assert r.rates_derived is True
    assert r.profile_set == "team-al"
    assert r.profile == f"{MODEL}/{METHOD}/k{K}/thinking-on/coding"
    assert r.method == "measured"
    assert r.source == SOURCE
    assert r.category == "coding"
    assert r.fallback_used is False
    assert r.fallback_category is None
    assert r.measured_on is None


def test_workload_value_beats_the_registry(reg: Registry) -> None:
    stated = value(acceptance_length=3.2, source="workload notes")
    r = run(reg, workload=workload(acceptance=stated))
    assert r.layer == "workload"
    assert r.acceptance_length == 3.2
    assert r.per_position_rates == minimum_variance_rates(3.2, K)
    assert r.source == "workload notes"
    assert r.profile_set is None
    assert r.profile is None
    assert r.method is None


def test_scenario_value_beats_workload_and_registry(reg: Registry) -> None:
    r = run(
        reg,
        workload=workload(acceptance=value(acceptance_length=3.2)),
        scenario=pin(value={"num_spec_tokens": K, "acceptance_length": 2.8, "source": "log"}),
    )
    assert r.layer == "scenario"
    assert r.acceptance_length == 2.8
    assert r.per_position_rates == [1.0, 0.8, 0.0]
    assert r.source == "log"
    assert r.profile_set is None
    assert r.profile is None
    assert r.method is None


def test_scenario_profiles_resolves_from_the_named_set_only(tmp_path: Path) -> None:
    # Both sets match, which would be ambiguous at the registry layer; naming one picks it.
    reg = registry_of(
        tmp_path,
        **{
            "team-al": [measured(acceptance_length=2.5)],
            "other-al": [assumed(acceptance_length=2.2)],
        },
    )
    assert run(reg).profile_set == "team-al"  # the measured set outranks the assumed one
    r = run(reg, scenario=pin(profiles="other-al"))
    assert r.layer == "scenario"
    assert r.profile_set == "other-al"
    assert r.acceptance_length == 2.2
    assert r.method == "assumed"
    assert r.profile == f"{MODEL}/{METHOD}/k{K}/thinking-on/coding"


def test_scenario_profiles_does_not_look_outside_the_named_set(tmp_path: Path) -> None:
    reg = registry_of(
        tmp_path,
        **{"team-al": [measured()], "other-al": [assumed(category="chat")]},
    )
    with pytest.raises(NoMatchingProfile) as exc:
        run(reg, scenario=pin(profiles="other-al"))
    message = str(exc.value)
    assert f"{MODEL}/{METHOD}/k{K}/thinking-on/coding" in message
    assert "other-al" in message


def test_scenario_profiles_beats_a_workload_value(tmp_path: Path) -> None:
    # The scenario layer is above the workload's; a pin naming a set states acceptance through it.
    reg = registry_of(tmp_path, **{"team-al": [measured()], "other-al": [assumed()]})
    r = run(
        reg,
        workload=workload(acceptance=value(acceptance_length=3.2)),
        scenario=pin(profiles="other-al"),
    )
    assert r.layer == "scenario"
    assert r.profile_set == "other-al"
    assert r.acceptance_length == 2.2


def test_an_unknown_set_named_by_the_scenario_is_refused_despite_a_workload_value(
    reg: Registry,
) -> None:
    # The scenario layer outranks the workload's, so its unknown set is not skipped silently.
    with pytest.raises(UnknownProfileSet):
        run(
            reg,
            workload=workload(acceptance=value(acceptance_length=3.2)),
            scenario=pin(profiles="missing-al"),
        )


def test_cli_beats_every_other_layer(reg: Registry) -> None:
    r = run(
        reg,
        workload=workload(acceptance=value(acceptance_length=3.2)),
        scenario=pin(value={"num_spec_tokens": K, "acceptance_length": 2.8}),
        cli=value(acceptance_rate=0.5, source="--speculative-acceptance-rate"),
    )
    assert r.layer == "cli"
    assert r.acceptance_length == 2.5
    assert r.per_position_rates == [1.0, 0.5, 0.0]
    assert r.rates_derived is True
    assert r.source == "--speculative-acceptance-rate"
    assert r.profile_set is None
    assert r.method is None


def test_cli_beats_a_scenario_naming_a_set(reg: Registry) -> None:
    r = run(reg, scenario=pin(profiles="team-al"), cli=value(acceptance_length=1.5))
    assert r.layer == "cli"
    assert r.acceptance_length == 1.5
    assert r.profile_set is None


# --------------------------------------------------------------------------- layers never merge
def test_layers_never_merge_cli_length_with_profile_rates(tmp_path: Path) -> None:
    reg = registry_of(
        tmp_path,
        **{"team-al": [measured(acceptance_length=2.5, per_position_rates=[0.8, 0.5, 0.2])]},
    )
    assert run(reg).per_position_rates == [0.8, 0.5, 0.2]
    r = run(reg, cli=value(acceptance_length=2.5))
    assert r.layer == "cli"
    assert r.per_position_rates == [1.0, 0.5, 0.0]
    assert r.rates_derived is True
    assert r.profile_set is None
    assert r.source is None


def test_layers_never_merge_scenario_length_with_workload_rates(reg: Registry) -> None:
    r = run(
        reg,
        workload=workload(acceptance=value(per_position_rates=[0.9, 0.6, 0.3], source="w")),
        scenario=pin(value={"num_spec_tokens": K, "acceptance_length": 2.8}),
    )
    assert r.layer == "scenario"
    assert r.acceptance_length == 2.8
    assert r.per_position_rates == [1.0, 0.8, 0.0]
    assert r.rates_derived is True
    assert r.source is None  # the workload's source is not carried over


# --------------------------------------------------------------------------- refusals
def test_every_refusal_is_a_resolution_refused() -> None:
    for cls in (
        NoThinkingMode,
        NoCategory,
        NoMatchingProfile,
        AmbiguousProfile,
        UnknownProfileSet,
        WrongNumSpecTokens,
    ):
        assert issubclass(cls, ResolutionRefused)


def test_no_thinking_mode_is_refused(reg: Registry) -> None:
    with pytest.raises(NoThinkingMode) as exc:
        run(reg, workload=workload(thinking=None))
    message = str(exc.value)
    assert f"{MODEL}/{METHOD}/k{K}" in message
    assert "thinking mode" in message


def test_no_category_without_fallback_is_refused(reg: Registry) -> None:
    with pytest.raises(NoCategory) as exc:
        run(reg, workload=workload(category=None))
    message = str(exc.value)
    assert f"{MODEL}/{METHOD}/k{K}/thinking-on" in message
    assert "category" in message
    assert "fallback" in message


def test_no_matching_profile_without_fallback_is_refused(reg: Registry) -> None:
    with pytest.raises(NoMatchingProfile) as exc:
        run(reg, workload=workload(category="chat"))
    message = str(exc.value)
    assert f"{MODEL}/{METHOD}/k{K}/thinking-on/chat" in message
    assert "team-al" in message
    assert "fallback_category" in message


def test_no_matching_profile_when_the_fallback_has_none_either(reg: Registry) -> None:
    with pytest.raises(NoMatchingProfile) as exc:
        run(reg, workload=workload(category="chat"), scenario=pin(fallback_category="math"))
    message = str(exc.value)
    assert f"{MODEL}/{METHOD}/k{K}/thinking-on/chat" in message
    assert f"{MODEL}/{METHOD}/k{K}/thinking-on/math" in message
    assert "team-al" in message


def test_two_matching_registry_sets_of_one_method_are_ambiguous(tmp_path: Path) -> None:
    reg = registry_of(
        tmp_path, **{"team-al": [measured()], "other-al": [measured(acceptance_length=2.4)]}
    )
    with pytest.raises(AmbiguousProfile) as exc:
        run(reg)
    message = str(exc.value)
    assert f"{MODEL}/{METHOD}/k{K}/thinking-on/coding" in message
    assert "team-al" in message
    assert "other-al" in message
    assert "method measured" in message


@pytest.mark.parametrize(
    ("better", "worse"),
    [
        pytest.param("measured", "assumed", id="measured-over-assumed"),
        pytest.param("measured", "copied", id="measured-over-copied"),
        pytest.param("copied", "assumed", id="copied-over-assumed"),
        pytest.param("measured", "inferred", id="measured-over-inferred"),
        pytest.param("inferred", "copied", id="inferred-over-copied"),
        pytest.param("inferred", "assumed", id="inferred-over-assumed"),
    ],
)
def test_a_better_method_outranks_a_worse_one_in_another_set(
    tmp_path: Path, better: str, worse: str
) -> None:
    """A published measurement (the InferenceX golden curves) and an older quote of it
    (assumed) both cover kimi-k3/dspark/k7: the measurement is used, and named."""

    def of(method: str, al: float) -> dict[str, Any]:
        if method == "measured":
            return measured(acceptance_length=al)
        extra = {"copied_from": f"x/y/k{K}/thinking-on/coding"} if method == "copied" else {}
        cited = method in ("copied", "inferred")
        provenance = {"provenance": {"source": SOURCE}} if cited else {}
        return assumed(acceptance_length=al, method=method, **extra, **provenance)

    # the worse set's name sorts first, so a first-found rule would pick it
    reg = registry_of(tmp_path, **{"a-worse": [of(worse, 2.2)], "z-better": [of(better, 2.5)]})
    r = run(reg)
    assert r.profile_set == "z-better"
    assert r.method == better
    assert r.acceptance_length == 2.5


def test_two_inferred_sets_of_one_key_are_ambiguous(tmp_path: Path) -> None:
    """Two runs' inferred curves for one key: neither outranks the other, so both are named."""
    inferred = assumed(method="inferred", provenance={"source": "calibrate --acceptance-from c4"})
    reg = registry_of(tmp_path, **{"run-a": [inferred], "run-b": [inferred]})
    with pytest.raises(AmbiguousProfile) as exc:
        run(reg)
    assert "method inferred" in str(exc.value) and "run-a, run-b" in str(exc.value)


def test_two_sets_matching_the_fallback_are_ambiguous(tmp_path: Path) -> None:
    reg = registry_of(tmp_path, **{"team-al": [measured()], "other-al": [measured()]})
    with pytest.raises(AmbiguousProfile):
        run(reg, workload=workload(category="chat"), scenario=pin(fallback_category="coding"))


def test_unknown_profile_set_is_refused_without_consulting_the_registry(reg: Registry) -> None:
    assert run(reg).layer == "registry"  # the registry has a match for this key
    with pytest.raises(UnknownProfileSet) as exc:
        run(reg, scenario=pin(profiles="missing-al"))
    message = str(exc.value)
    assert "missing-al" in message
    assert "not supplied" in message


@pytest.mark.parametrize("layer", ["cli", "scenario", "workload"])
def test_a_value_stated_for_another_k_is_refused(reg: Registry, layer: str) -> None:
    wrong = {"num_spec_tokens": K + 2, "acceptance_length": 2.0}
    kwargs: dict[str, Any] = {
        "cli": {"cli": AcceptanceValue.model_validate(wrong)},
        "scenario": {"scenario": pin(value=wrong)},
        "workload": {"workload": workload(acceptance=AcceptanceValue.model_validate(wrong))},
    }[layer]
    with pytest.raises(WrongNumSpecTokens) as exc:
        run(reg, **kwargs)
    message = str(exc.value)
    assert layer in message
    assert str(K + 2) in message
    assert str(K) in message


@pytest.mark.parametrize(
    ("wrong_layer", "winner"),
    [("workload", "scenario"), ("workload", "cli"), ("scenario", "cli")],
)
def test_a_lower_layer_at_another_k_is_refused_even_when_a_higher_one_wins(
    reg: Registry, wrong_layer: str, winner: str
) -> None:
    wrong = {"num_spec_tokens": K + 1, "acceptance_length": 2.0}
    right = {"num_spec_tokens": K, "acceptance_length": 2.0}

    def layer_kwargs(name: str, data: dict[str, Any]) -> dict[str, Any]:
        if name == "workload":
            return {"workload": workload(acceptance=AcceptanceValue.model_validate(data))}
        if name == "scenario":
            return {"scenario": pin(value=data)}
        return {"cli": AcceptanceValue.model_validate(data)}

    kwargs = {**layer_kwargs(wrong_layer, wrong), **layer_kwargs(winner, right)}
    with pytest.raises(WrongNumSpecTokens) as exc:
        run(reg, **kwargs)
    assert wrong_layer in str(exc.value)


# --------------------------------------------------------------------------- value layers need no key
def test_a_cli_value_needs_no_thinking_mode_or_category(reg: Registry) -> None:
    for w in (WorkloadAcceptance(), None):
        r = resolve(
            model=MODEL,
            method=METHOD,
            num_spec_tokens=K,
            registry=reg,
            workload=w,
            cli=value(acceptance_length=2.0),
        )
        assert r.layer == "cli"
        assert r.acceptance_length == 2.0


def test_scenario_and_workload_values_need_no_thinking_mode_or_category(reg: Registry) -> None:
    r = run(
        reg,
        workload=WorkloadAcceptance(),
        scenario=pin(value={"num_spec_tokens": K, "acceptance_length": 2.0}),
    )
    assert r.layer == "scenario"
    r = run(reg, workload=WorkloadAcceptance(acceptance=value(acceptance_length=2.0)))
    assert r.layer == "workload"


def test_an_empty_registry_is_fine_when_a_value_is_stated() -> None:
    empty = Registry([])
    r = run(empty, cli=value(acceptance_length=2.0))
    assert r.layer == "cli"
    with pytest.raises(NoMatchingProfile):
        run(empty)


# --------------------------------------------------------------------------- fallback recording
def test_fallback_replaces_a_category_without_a_curve(reg: Registry) -> None:
    r = run(reg, workload=workload(category="chat"), scenario=pin(fallback_category="coding"))
    assert r.layer == "registry"
    assert r.acceptance_length == 2.5
    assert r.category == "coding"
    assert r.fallback_used is True
    assert r.fallback_category == "chat"
    assert r.profile == f"{MODEL}/{METHOD}/k{K}/thinking-on/coding"


def test_fallback_serves_a_workload_without_a_category(reg: Registry) -> None:
    r = run(reg, workload=workload(category=None), scenario=pin(fallback_category="coding"))
    assert r.acceptance_length == 2.5
    assert r.category == "coding"
    assert r.fallback_used is True


def test_an_unused_fallback_is_not_recorded(tmp_path: Path) -> None:
    reg = registry_of(
        tmp_path,
        **{"team-al": [measured(), measured(category="chat", acceptance_length=1.8)]},
    )
    r = run(reg, workload=workload(category="chat"), scenario=pin(fallback_category="coding"))
    assert r.acceptance_length == 1.8
    assert r.category == "chat"
    assert r.fallback_used is False
    assert r.fallback_category is None
    r = run(reg)
    assert r.fallback_used is False
    assert r.fallback_category is None


def test_fallback_applies_within_a_scenario_named_set(tmp_path: Path) -> None:
    reg = registry_of(
        tmp_path,
        **{
            "team-al": [measured(category="chat", acceptance_length=1.8)],
            "other-al": [assumed(category="coding", acceptance_length=2.2)],
        },
    )
    r = run(
        reg,
        workload=workload(category="chat"),
        scenario=pin(profiles="other-al", fallback_category="coding"),
    )
    assert r.layer == "scenario"
    assert r.profile_set == "other-al"
    assert r.acceptance_length == 2.2
    assert r.category == "coding"
    assert r.fallback_used is True
    assert r.fallback_category == "chat"


# --------------------------------------------------------------------------- hardware recording
@pytest.mark.parametrize(
    ("hardware", "measured_on"),
    [("h200", "b300"), ("B300", None), ("b300", None), (None, "b300")],
)
def test_hardware_a_profile_was_measured_on_is_recorded_when_it_differs(
    reg: Registry, hardware: str | None, measured_on: str | None
) -> None:
    assert run(reg, hardware=hardware).measured_on == measured_on


@pytest.mark.parametrize("hardware", ["h200", None])
def test_an_assumed_profile_without_provenance_records_no_hardware(
    tmp_path: Path, hardware: str | None
) -> None:
    reg = registry_of(tmp_path, **{"guess-al": [assumed()]})
    r = run(reg, hardware=hardware)
    assert r.measured_on is None
    assert r.source is None
    assert r.method == "assumed"


def test_an_inline_value_records_no_hardware(reg: Registry) -> None:
    assert run(reg, hardware="h200", cli=value(acceptance_length=2.0)).measured_on is None


# --------------------------------------------------------------------------- derived vs stated rates
def test_a_profile_without_rates_derives_the_minimum_variance_schedule(reg: Registry) -> None:
    r = run(reg)
    assert r.rates_derived is True
    assert r.per_position_rates == minimum_variance_rates(2.5, K)


def test_a_profile_with_rates_keeps_them(tmp_path: Path) -> None:
    reg = registry_of(
        tmp_path,
        **{"team-al": [measured(acceptance_length=2.5, per_position_rates=[0.8, 0.5, 0.2])]},
    )
    r = run(reg)
    assert r.rates_derived is False
    assert r.per_position_rates == [0.8, 0.5, 0.2]
    assert r.acceptance_length == 2.5


def test_an_inline_value_with_rates_only_states_al_as_one_plus_their_sum(reg: Registry) -> None:
    r = run(reg, cli=value(per_position_rates=[0.9, 0.6, 0.3]))
    assert r.acceptance_length == pytest.approx(2.8)
    assert r.per_position_rates == [0.9, 0.6, 0.3]
    assert r.rates_derived is False


def test_an_inline_value_with_length_and_rates_keeps_both(reg: Registry) -> None:
    r = run(
        reg,
        workload=workload(
            acceptance=value(acceptance_length=2.8, per_position_rates=[0.9, 0.6, 0.3])
        ),
    )
    assert r.acceptance_length == 2.8
    assert r.per_position_rates == [0.9, 0.6, 0.3]
    assert r.rates_derived is False


def test_an_inline_acceptance_rate_states_al_as_one_plus_k_times_it(reg: Registry) -> None:
    r = run(reg, scenario=pin(value={"num_spec_tokens": K, "acceptance_rate": 0.6}))
    assert r.acceptance_length == pytest.approx(1 + K * 0.6)
    assert r.per_position_rates == minimum_variance_rates(r.acceptance_length, K)
    assert r.rates_derived is True
    assert r.acceptance_rate == pytest.approx(0.6)


# --------------------------------------------------------------------------- registries from files
def test_a_registry_built_from_set_files(tmp_path: Path) -> None:
    path = write_set(tmp_path, "team-al", [measured(acceptance_length=3.0)])
    reg = Registry(load_sets([path]))
    r = run(reg)
    assert r.profile_set == "team-al"
    assert r.acceptance_length == 3.0
    assert r.per_position_rates == [1.0, 1.0, 0.0]


# --------------------------------------------------------------------------- the shipped registry
def test_done_criterion_deepseek_dspark_k5_thinking_on_coding() -> None:
    r = resolve(
        model="deepseek-v4.1-flash",
        method="dspark",
        num_spec_tokens=5,
        registry=Registry.load(),
        workload=WorkloadAcceptance(thinking="on", category="coding"),
    )
    assert r.acceptance_length == 3.51
    assert r.layer == "registry"
    assert r.per_position_rates == [1.0, 1.0, 0.51, 0.0, 0.0]
    assert r.rates_derived is True
    assert r.profile_set == "inferencex-golden-al"
    assert r.profile == "deepseek-v4.1-flash/dspark/k5/thinking-on/coding"
    assert r.method == "measured"
    assert r.source is not None and "dsv41flash_dspark" in r.source
    assert r.measured_on == "b300"  # the run's hardware is unknown


def test_done_criterion_kimi_k3_dspark_k7_thinking_on_coding() -> None:
    r = resolve(
        model="kimi-k3",
        method="dspark",
        num_spec_tokens=7,
        registry=Registry.load(),
        workload=WorkloadAcceptance(thinking="on", category="coding"),
        hardware="b300",
    )
    assert r.acceptance_length == 3.78
    assert r.layer == "registry"
    # the published golden curve (measured) outranks the older quote of it (assumed)
    assert r.profile_set == "inferencex-golden-al-2026-08"
    assert r.per_position_rates == [1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0]
    assert r.rates_derived is True
    assert r.method == "measured"
    assert r.source is not None and r.source.endswith("/golden_al_distribution/kimik3_dspark.yaml")
    assert r.measured_on is None


# --------------------------------------------------------------------------- acceptance rate
@pytest.mark.parametrize("length", [1.0, 1.75, 2.5, 4.0])
def test_resolution_acceptance_rate_is_al_minus_one_over_k(reg: Registry, length: float) -> None:
    r = run(reg, cli=value(acceptance_length=length))
    assert r.acceptance_rate == pytest.approx((length - 1) / K)
    assert run(reg).acceptance_rate == pytest.approx((2.5 - 1) / K)
