"""``draft_coverage``: the share of decode steps that drafted, an optional field of a profile and
of an inline value (AL counts only the steps that drafted). Absent means 1.0; the resolver
reports it, and whether it was stated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from speclens.acceptance import (
    AcceptanceProfileSet,
    AcceptanceValue,
    Registry,
    ValidationError,
    load,
    resolve,
    validate,
)
from speclens.acceptance.schema import AcceptancePin, WorkloadAcceptance

PROFILE: dict[str, Any] = {
    "model": "m",
    "speculative_method": "ngram",
    "num_spec_tokens": 3,
    "thinking": "off",
    "category": "coding",
    "acceptance_length": 1.46,
    "method": "assumed",
    "rationale": "for the test",
}


def _write(tmp_path: Path, **over: Any) -> Path:
    folder = tmp_path / "acceptance"
    folder.mkdir(exist_ok=True)
    path = folder / "cov.yaml"
    document = {"kind": "AcceptanceProfileSet", "name": "cov", "profiles": [{**PROFILE, **over}]}
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


@pytest.mark.parametrize("given", [0.386, 1, 1.0, 1e-9])
def test_a_profile_states_a_coverage_in_the_half_open_unit_interval(
    tmp_path: Path, given: float
) -> None:
    profile = load(AcceptanceProfileSet, _write(tmp_path, draft_coverage=given)).profiles[0]
    assert profile.draft_coverage == given and isinstance(profile.draft_coverage, float)


def test_a_profile_without_coverage_loads_as_before(tmp_path: Path) -> None:
    assert load(AcceptanceProfileSet, _write(tmp_path)).profiles[0].draft_coverage is None


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        (0, "an integer (0)"),
        (0.0, "a number (0.0)"),
        (1.5, "a number (1.5)"),
        (-0.2, "a number (-0.2)"),
        (True, "a boolean (True)"),
        ("0.5", "a string ('0.5')"),
        (".nan", "a number (nan)"),
        ([0.5], "a list"),
    ],
)
def test_a_coverage_outside_the_interval_is_one_line_naming_the_field(
    tmp_path: Path, given: object, shown: str
) -> None:
    path = _write(tmp_path, draft_coverage=given)
    if given == ".nan":  # YAML's spelling of NaN
        path.write_text(path.read_text().replace("'.nan'", ".nan"))
    with pytest.raises(ValidationError) as info:
        load(AcceptanceProfileSet, path)
    assert [str(p) for p in info.value.problems] == [
        f"{path}: profiles[0].draft_coverage: expected a number in (0, 1], got {shown}"
    ]


def test_an_inline_value_states_coverage_but_coverage_alone_states_no_acceptance() -> None:
    value = AcceptanceValue.model_validate(
        {"num_spec_tokens": 3, "acceptance_length": 2.0, "draft_coverage": 0.4}
    )
    assert value.draft_coverage == 0.4
    with pytest.raises(ValidationError) as info:
        validate(AcceptanceValue, {"num_spec_tokens": 3, "draft_coverage": 0.4}, "w.yaml")
    assert [str(p) for p in info.value.problems] == [
        "w.yaml: (document): states no acceptance: give acceptance_length, acceptance_rate or "
        "per_position_rates"
    ]


def test_the_json_schema_shows_the_field_and_its_bounds() -> None:
    schema = AcceptanceProfileSet.model_json_schema()
    field = schema["$defs"]["Profile"]["properties"]["draft_coverage"]
    number = next(b for b in field["anyOf"] if b.get("type") == "number")
    assert number["exclusiveMinimum"] == 0 and number["maximum"] == 1
    assert "draft_coverage" not in schema["$defs"]["Profile"].get("required", [])


def _resolve(registry: Registry, **kwargs: Any) -> Any:
    return resolve(
        model="m",
        method="ngram",
        num_spec_tokens=3,
        registry=registry,
        workload=WorkloadAcceptance(thinking="off", category="coding"),
        **kwargs,
    )


def test_resolve_reports_a_stated_coverage_and_1_when_absent(tmp_path: Path) -> None:
    _write(tmp_path, draft_coverage=0.386)
    stated = _resolve(Registry.load(extra=[tmp_path], shipped=False))
    assert (stated.draft_coverage, stated.draft_coverage_stated) == (0.386, True)
    _write(tmp_path)
    absent = _resolve(Registry.load(extra=[tmp_path], shipped=False))
    assert (absent.draft_coverage, absent.draft_coverage_stated) == (1.0, False)
    assert absent.model_dump()["draft_coverage"] == 1.0


def test_a_winning_layer_brings_its_own_coverage_never_a_lower_ones(tmp_path: Path) -> None:
    """Layers never merge: a scenario value without coverage over a profile with one is 1.0."""
    _write(tmp_path, draft_coverage=0.386)
    registry = Registry.load(extra=[tmp_path], shipped=False)
    plain = AcceptancePin.model_validate(
        {"value": {"num_spec_tokens": 3, "acceptance_length": 2.0}}
    )
    assert _resolve(registry, scenario=plain).draft_coverage == 1.0
    covered = AcceptancePin.model_validate(
        {"value": {"num_spec_tokens": 3, "acceptance_length": 2.0, "draft_coverage": 0.5}}
    )
    result = _resolve(registry, scenario=covered)
    assert (result.layer, result.draft_coverage, result.draft_coverage_stated) == (
        "scenario",
        0.5,
        True,
    )
