"""Every check of a profile set, an inline value and a scenario pin (spec 001, "Checks").

Each case starts from a valid profile set, breaks exactly one thing, writes it to a YAML file and
asserts the field path the problem names, a key phrase of its message and the file it was in.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speclens.acceptance import (
    AcceptancePin,
    AcceptanceProfileSet,
    AcceptanceValue,
    Problem,
    ValidationError,
)
from speclens.acceptance.files import load, parse_yaml, validate

FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

# A valid set: one profile for each method. The measured one carries per-position rates and every
# provenance key; the assumed one has neither provenance nor copied_from.
VALID_TEXT = """\
kind: AcceptanceProfileSet
name: test-set
caveats:
  - Coding only.
  - Measured on B300.
profiles:
  - model: model-a
    speculative_method: dspark
    num_spec_tokens: 3
    thinking: "off"
    category: coding
    acceptance_length: 2.5
    per_position_rates: [0.8, 0.5, 0.2]
    method: measured
    provenance:
      source: https://example.com/curves/model-a.yaml
      run: https://example.com/runs/1
      benchmark: SPEED-Bench Qualitative
      prompts: 80
      hardware: b300
      engine_image: vllm/vllm-openai:v1
      tp: 4
      sampling: {temperature: 1.0, top_p: 0.95, top_k: 20, max_tokens: 4096}
      settings:
        rejection_sample_method: block
  - model: model-b
    speculative_method: mtp
    num_spec_tokens: 3
    thinking: "on"
    category: coding
    acceptance_length: 2.99
    method: copied
    copied_from: model-b-fp8/mtp/k3/thinking-on/coding
    rationale: Shares the base of model-b-fp8.
    provenance:
      source: https://example.com/curves/model-b.yaml
      hardware: b300
  - model: model-c
    speculative_method: dspark
    num_spec_tokens: 2
    thinking: "on"
    category: multi_turn-2
    acceptance_length: 2.2
    method: assumed
    rationale: Quoted from a guide that gives no hardware.
"""

DELETE = object()


def valid_set() -> dict[str, Any]:
    return yaml.safe_load(VALID_TEXT)


def mutate(data: Any, where: tuple[str | int, ...], value: object) -> Any:
    """Set (or, with ``DELETE``, remove) the field at ``where``; return ``data``."""
    parent = data
    for part in where[:-1]:
        parent = parent[part]
    if value is DELETE:
        del parent[where[-1]]
    else:
        parent[where[-1]] = value
    return data


def write(tmp_path: Path, data: Any, name: str = "broken-set.yaml") -> Path:
    path = tmp_path / name
    text = data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False)
    path.write_text(text, encoding="utf-8")
    return path


def problems_of(path: Path, model: type = AcceptanceProfileSet, key: str | None = None):
    with pytest.raises(ValidationError) as exc:
        load(model, path, key=key)
    assert exc.value.problems
    return exc.value.problems


def assert_problem(
    problems: list[Problem], file: Path | str, path: str, phrase: str, only: bool = True
) -> Problem:
    """The problem at ``path`` whose message holds ``phrase``; with ``only``, every problem found
    lies at ``path`` (breaking one thing reports that thing and nothing else)."""
    listing = "\n".join(str(p) for p in problems)
    hits = [p for p in problems if p.path == path and phrase in p.message]
    assert hits, f"no problem at {path!r} mentioning {phrase!r} in:\n{listing}"
    hit = hits[0]
    assert hit.file == str(file)
    assert str(hit) == f"{file}: {path}: {hit.message}"
    if only:
        assert {p.path for p in problems} == {path}, listing
    return hit


def test_the_fixture_is_valid(tmp_path: Path) -> None:
    profile_set = load(AcceptanceProfileSet, write(tmp_path, VALID_TEXT))
    assert profile_set.name == "test-set"
    assert [p.method for p in profile_set.profiles] == ["measured", "copied", "assumed"]
    # provenance may be absent with method assumed; rationale is not needed with measured
    assert profile_set.profiles[2].provenance is None
    assert profile_set.profiles[0].rationale is None
    assert profile_set.profiles[0].per_position_rates == [0.8, 0.5, 0.2]


P0, P1, P2 = ("profiles", 0), ("profiles", 1), ("profiles", 2)
PROV0 = (*P0, "provenance")
SAMP0 = (*PROV0, "sampling")

# (where, new value or DELETE, path the problem names, key phrase of its message, only that path)
BAD_FIELDS = [
    # kind, name, profiles, caveats
    pytest.param(("kind",), "ProfileSet", "kind", "AcceptanceProfileSet", True, id="kind-wrong"),
    pytest.param(("kind",), DELETE, "kind", "is required", True, id="kind-missing"),
    pytest.param(("name",), "", "name", "must not be empty", True, id="name-empty"),
    pytest.param(("name",), "   ", "name", "must not be empty", True, id="name-blank"),
    pytest.param(("name",), DELETE, "name", "is required", True, id="name-missing"),
    pytest.param(("profiles",), [], "profiles", "at least one", True, id="profiles-empty"),
    pytest.param(("profiles",), DELETE, "profiles", "is required", True, id="profiles-missing"),
    pytest.param(("caveats", 1), "", "caveats[1]", "must not be empty", True, id="caveat-empty"),
    pytest.param(("caveats", 0), " ", "caveats[0]", "must not be empty", True, id="caveat-blank"),
    # model, speculative_method, thinking, category
    pytest.param((*P0, "model"), DELETE, "profiles[0].model", "is required", True, id="no-model"),
    pytest.param(
        (*P0, "model"), "", "profiles[0].model", "must not be empty", True, id="empty-model"
    ),
    pytest.param(
        (*P1, "speculative_method"),
        DELETE,
        "profiles[1].speculative_method",
        "is required",
        True,
        id="no-speculative-method",
    ),
    pytest.param(
        (*P0, "thinking"), "maybe", "profiles[0].thinking", "'on'", True, id="thinking-maybe"
    ),
    pytest.param(
        (*P0, "thinking"), "ON", "profiles[0].thinking", "'off'", True, id="thinking-upper"
    ),
    pytest.param(
        (*P0, "thinking"), DELETE, "profiles[0].thinking", "is required", True, id="no-thinking"
    ),
    pytest.param(
        (*P0, "category"), "Coding", "profiles[0].category", "malformed", True, id="category-upper"
    ),
    pytest.param(
        (*P0, "category"), "co ding", "profiles[0].category", "malformed", True, id="category-space"
    ),
    pytest.param(
        (*P0, "category"), "", "profiles[0].category", "malformed", True, id="category-empty"
    ),
    # num_spec_tokens, acceptance_length (profile 1 has no rates, so only the length is wrong)
    pytest.param(
        (*P0, "num_spec_tokens"), 0, "profiles[0].num_spec_tokens", "at least 1", True, id="k-0"
    ),
    pytest.param(
        (*P1, "num_spec_tokens"), -3, "profiles[1].num_spec_tokens", "at least 1", True, id="k-neg"
    ),
    pytest.param(
        (*P1, "num_spec_tokens"),
        2.5,
        "profiles[1].num_spec_tokens",
        "expected an integer",
        True,
        id="k-float",
    ),
    pytest.param(
        (*P1, "acceptance_length"),
        math.nan,
        "profiles[1].acceptance_length",
        "finite",
        True,
        id="al-nan",
    ),
    pytest.param(
        (*P1, "acceptance_length"),
        math.inf,
        "profiles[1].acceptance_length",
        "finite",
        True,
        id="al-inf",
    ),
    pytest.param(
        (*P1, "acceptance_length"),
        0.5,
        "profiles[1].acceptance_length",
        "below 1",
        True,
        id="al-below-1",
    ),
    pytest.param(
        (*P1, "acceptance_length"),
        4.01,
        "profiles[1].acceptance_length",
        "outside [1, 4]",
        True,
        id="al-above-k-plus-1",
    ),
    pytest.param(
        (*P1, "acceptance_length"),
        "2.9",
        "profiles[1].acceptance_length",
        "expected a number",
        True,
        id="al-string",
    ),
    pytest.param(
        (*P1, "acceptance_length"),
        DELETE,
        "profiles[1].acceptance_length",
        "is required",
        True,
        id="al-missing",
    ),
    # per_position_rates (profile 0: K 3, AL 2.5)
    pytest.param(
        (*P0, "per_position_rates"),
        [0.8, 0.7],
        "profiles[0].per_position_rates",
        "expected K = 3",
        True,
        id="rates-too-few",
    ),
    pytest.param(
        (*P0, "per_position_rates"),
        [0.6, 0.4, 0.3, 0.2],
        "profiles[0].per_position_rates",
        "expected K = 3",
        True,
        id="rates-too-many",
    ),
    pytest.param(
        (*P0, "per_position_rates"),
        [1.5, 0.5, 0.2],
        "profiles[0].per_position_rates[0]",
        "outside [0, 1]",
        True,
        id="rate-above-1",
    ),
    pytest.param(
        (*P0, "per_position_rates"),
        [0.9, 0.6, -0.1],
        "profiles[0].per_position_rates[2]",
        "outside [0, 1]",
        True,
        id="rate-negative",
    ),
    pytest.param(
        (*P0, "per_position_rates"),
        [0.9, math.nan, 0.1],
        "profiles[0].per_position_rates[1]",
        "finite",
        True,
        id="rate-nan",
    ),
    pytest.param(
        (*P0, "per_position_rates"),
        [0.5, 0.8, 0.2],
        "profiles[0].per_position_rates",
        "rises",
        True,
        id="rates-rise",
    ),
    pytest.param(
        (*P0, "per_position_rates"),
        [0.8, 0.5, 0.22],
        "profiles[0].per_position_rates",
        "sum to",
        True,
        id="rates-sum-off",
    ),
    pytest.param(
        (*P0, "per_position_rates"),
        [0.8, 0.5, 0.1],
        "profiles[0].per_position_rates",
        "sum to",
        True,
        id="rates-sum-short",
    ),
    # method
    pytest.param(
        (*P0, "method"),
        "guessed",
        "profiles[0].method",
        "measured, inferred, copied",
        True,
        id="method-bad",
    ),
    pytest.param(
        (*P0, "method"),
        "not_charged",
        "profiles[0].method",
        "not_charged",
        True,
        id="method-not-charged",
    ),
    pytest.param(
        (*P0, "method"), DELETE, "profiles[0].method", "is required", True, id="no-method"
    ),
    # fields the method requires
    pytest.param(
        (*P0, "provenance"),
        DELETE,
        "profiles[0].provenance",
        "required with method measured",
        True,
        id="measured-no-provenance",
    ),
    pytest.param(
        (*P1, "provenance"),
        DELETE,
        "profiles[1].provenance",
        "required with method copied",
        True,
        id="copied-no-provenance",
    ),
    pytest.param(
        (*P1, "rationale"),
        DELETE,
        "profiles[1].rationale",
        "required with method copied",
        True,
        id="copied-no-rationale",
    ),
    pytest.param(
        (*P2, "rationale"),
        DELETE,
        "profiles[2].rationale",
        "required with method assumed",
        True,
        id="assumed-no-rationale",
    ),
    pytest.param(
        (*P1, "copied_from"),
        DELETE,
        "profiles[1].copied_from",
        "required with method copied",
        True,
        id="copied-no-copied-from",
    ),
    pytest.param(
        (*P1, "copied_from"),
        "model-b-fp8/mtp/3/on/coding",
        "profiles[1].copied_from",
        "model/method/k<K>",
        True,
        id="copied-from-malformed",
    ),
    pytest.param(
        (*PROV0, "hardware"),
        DELETE,
        "profiles[0].provenance.hardware",
        "required with method measured",
        True,
        id="measured-no-hardware",
    ),
    pytest.param(
        (*PROV0, "engine_image"),
        DELETE,
        "profiles[0].provenance.engine_image",
        "required with method measured",
        True,
        id="measured-no-engine-image",
    ),
    pytest.param(
        (*PROV0, "sampling"),
        DELETE,
        "profiles[0].provenance.sampling",
        "required with method measured",
        True,
        id="measured-no-sampling",
    ),
    # provenance
    pytest.param(
        (*PROV0, "source"),
        DELETE,
        "profiles[0].provenance.source",
        "is required",
        True,
        id="no-source",
    ),
    pytest.param(
        ("profiles", 1, "provenance", "source"),
        "",
        "profiles[1].provenance.source",
        "must not be empty",
        True,
        id="empty-source",
    ),
    pytest.param(
        (*PROV0, "prompts"),
        -1,
        "profiles[0].provenance.prompts",
        "must not be negative",
        True,
        id="negative-prompts",
    ),
    pytest.param(
        (*PROV0, "tp"), -4, "profiles[0].provenance.tp", "must not be negative", True, id="neg-tp"
    ),
    pytest.param(
        (*PROV0, "settings", "rejection_sample_method"),
        "",
        "profiles[0].provenance.settings",
        "'rejection_sample_method' is empty",
        True,
        id="empty-setting",
    ),
    pytest.param(
        (*PROV0, "settings", "draft_sample_method"),
        None,
        "profiles[0].provenance.settings",
        "'draft_sample_method' is empty",
        True,
        id="null-setting",
    ),
    # sampling
    pytest.param(
        (*SAMP0, "temperature"),
        DELETE,
        "profiles[0].provenance.sampling.temperature",
        "is required",
        True,
        id="no-temperature",
    ),
    pytest.param(
        (*SAMP0, "temperature"),
        -0.5,
        "profiles[0].provenance.sampling.temperature",
        ">= 0",
        True,
        id="negative-temperature",
    ),
    pytest.param(
        (*SAMP0, "top_p"),
        0,
        "profiles[0].provenance.sampling.top_p",
        "outside (0, 1]",
        True,
        id="top-p-0",
    ),
    pytest.param(
        (*SAMP0, "top_p"),
        1.5,
        "profiles[0].provenance.sampling.top_p",
        "outside (0, 1]",
        True,
        id="top-p-1.5",
    ),
    pytest.param(
        (*SAMP0, "top_k"),
        -2,
        "profiles[0].provenance.sampling.top_k",
        "at least -1",
        True,
        id="top-k-minus-2",
    ),
    pytest.param(
        (*SAMP0, "max_tokens"),
        -1,
        "profiles[0].provenance.sampling.max_tokens",
        "must not be negative",
        True,
        id="negative-max-tokens",
    ),
    # unknown keys, at every level
    # an unknown key is named by its parent and its line, never by its text (it may be a line of
    # a file that is not a profile set at all)
    pytest.param(("colour",), "red", "(document)", "not a recognized key", True, id="unknown-top"),
    pytest.param(
        (*P0, "acceptance_rate"),
        0.5,
        "profiles[0]",
        "not a recognized key",
        True,
        id="unknown-profile-key",
    ),
    pytest.param(
        (*PROV0, "gpu"),
        "b300",
        "profiles[0].provenance",
        "not a recognized key",
        True,
        id="unknown-provenance-key",
    ),
    pytest.param(
        (*SAMP0, "min_p"),
        0.1,
        "profiles[0].provenance.sampling",
        "not a recognized key",
        True,
        id="unknown-sampling-key",
    ),
]


@pytest.mark.parametrize(("where", "value", "path", "phrase", "only"), BAD_FIELDS)
def test_a_broken_field_is_named(
    tmp_path: Path,
    where: tuple[str | int, ...],
    value: object,
    path: str,
    phrase: str,
    only: bool,
) -> None:
    file = write(tmp_path, mutate(valid_set(), where, value))
    assert_problem(problems_of(file), file, path, phrase, only)


def test_a_duplicate_profile_key_names_the_second_profile(tmp_path: Path) -> None:
    data = valid_set()
    twin = copy.deepcopy(data["profiles"][0])
    twin["acceptance_length"] = 2.6  # another value does not make another key
    twin["per_position_rates"] = [0.8, 0.6, 0.2]
    data["profiles"].append(twin)
    file = write(tmp_path, data)
    hit = assert_problem(problems_of(file), file, "profiles[3]", "repeats the key")
    assert "model-a/dspark/k3/thinking-off/coding" in hit.message
    assert "profiles[0]" in hit.message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("model", "model-z"),
        ("speculative_method", "eagle3"),
        ("num_spec_tokens", 4),
        ("thinking", "on"),
        ("category", "math"),
    ],
)
def test_profiles_differing_in_one_key_field_are_distinct(
    tmp_path: Path, field: str, value: object
) -> None:
    data = valid_set()
    twin = copy.deepcopy(data["profiles"][0])
    twin[field] = value
    twin.pop("per_position_rates")
    data["profiles"].append(twin)
    assert len(load(AcceptanceProfileSet, write(tmp_path, data)).profiles) == 4


@pytest.mark.parametrize("bare", ["off", "on", "true", "false", "yes"])
def test_a_bare_yaml_boolean_thinking_asks_for_quotes(tmp_path: Path, bare: str) -> None:
    text = VALID_TEXT.replace('thinking: "off"', f"thinking: {bare}", 1)
    assert text != VALID_TEXT
    file = write(tmp_path, text)
    hit = assert_problem(problems_of(file), file, "profiles[0].thinking", "boolean")
    assert "quot" in hit.message  # "... so quote it (thinking: "on")"


@pytest.mark.parametrize(
    ("where", "value"),
    [
        pytest.param(
            (*P0, "rationale"), "Measured, and explained anyway.", id="measured-rationale"
        ),
        pytest.param((*P2, "provenance"), {"source": "a guide"}, id="assumed-provenance"),
        pytest.param((*P2, "copied_from"), "x/dspark/k2/thinking-on/coding", id="assumed-copied"),
        pytest.param((*P1, "provenance"), {"source": "s"}, id="copied-minimal-provenance"),
        pytest.param((*PROV0, "run"), DELETE, id="no-run"),
        pytest.param((*PROV0, "benchmark"), DELETE, id="no-benchmark"),
        pytest.param((*PROV0, "prompts"), 0, id="zero-prompts"),
        pytest.param((*PROV0, "tp"), DELETE, id="no-tp"),
        pytest.param((*PROV0, "settings"), DELETE, id="no-settings"),
        pytest.param(("caveats",), DELETE, id="no-caveats"),
        pytest.param((*SAMP0, "top_p"), 1.0, id="top-p-1"),
        pytest.param((*SAMP0, "top_p"), DELETE, id="no-top-p"),
        pytest.param((*SAMP0, "top_k"), -1, id="top-k-minus-1"),
        pytest.param((*SAMP0, "top_k"), 0, id="top-k-0"),
        pytest.param((*SAMP0, "temperature"), 0, id="greedy"),
        pytest.param((*SAMP0, "max_tokens"), DELETE, id="no-max-tokens"),
        pytest.param((*P0, "per_position_rates"), DELETE, id="no-rates"),
        pytest.param((*P0, "per_position_rates"), [0.8, 0.5, 0.205], id="rates-within-0.01"),
        pytest.param((*P0, "per_position_rates"), [0.8, 0.5, 0.195], id="rates-within-0.01-low"),
        pytest.param((*P1, "acceptance_length"), 1, id="al-1"),
        pytest.param((*P1, "acceptance_length"), 4, id="al-k-plus-1"),
        pytest.param((*P0, "category"), "a_b-9", id="category-all-characters"),
    ],
)
def test_a_valid_variation_is_accepted(
    tmp_path: Path, where: tuple[str | int, ...], value: object
) -> None:
    load(AcceptanceProfileSet, write(tmp_path, mutate(valid_set(), where, value)))


def _inferred() -> dict[str, Any]:
    """The fixture with its copied profile turned into an inferred one: a source and a rationale,
    no hardware, engine image nor sampling (what the run did not state is not made up)."""
    data = valid_set()
    profile = data["profiles"][1]
    del profile["copied_from"]
    profile |= {"method": "inferred", "rationale": "AL from a run's TPOT, other Ks from a model.",
                "provenance": {"source": "speclens calibrate --acceptance-from c4"}}  # fmt: skip
    return data


def test_an_inferred_profile_needs_a_source_and_a_rationale_only(tmp_path: Path) -> None:
    loaded = load(AcceptanceProfileSet, write(tmp_path, _inferred()))
    assert [p.method for p in loaded.profiles] == ["measured", "inferred", "assumed"]
    assert (
        loaded.profiles[1].provenance is not None and loaded.profiles[1].provenance.hardware is None
    )
    for field in ("provenance", "rationale"):
        data = mutate(_inferred(), (*P1, field), DELETE)
        file = write(tmp_path, data, f"no-{field}.yaml")
        assert_problem(
            problems_of(file), file, f"profiles[1].{field}", "required with method inferred"
        )


def test_a_wrong_method_lists_inferred_among_the_methods(tmp_path: Path) -> None:
    file = write(tmp_path, mutate(valid_set(), (*P0, "method"), "guessed"))
    hit = assert_problem(problems_of(file), file, "profiles[0].method", "expected one of")
    assert (
        hit.message
        == "expected one of measured, inferred, copied, assumed, got a string ('guessed')"
    )


def test_rates_exactly_0_01_from_the_length_are_within_tolerance(tmp_path: Path) -> None:
    # AL 2.5 needs 1.5; these sum to 1.51 (decimal), which is not *more* than 0.01 away.
    data = mutate(valid_set(), (*P0, "per_position_rates"), [0.8, 0.5, 0.21])
    load(AcceptanceProfileSet, write(tmp_path, data))


# A required field given as YAML null (`provenance:` with nothing after it) is as missing as an
# absent one: the method's requirement is not met.
@pytest.mark.parametrize(
    ("where", "path"),
    [
        pytest.param((*P0, "provenance"), "profiles[0].provenance", id="measured-provenance"),
        pytest.param((*P1, "provenance"), "profiles[1].provenance", id="copied-provenance"),
        pytest.param((*P1, "rationale"), "profiles[1].rationale", id="copied-rationale"),
        pytest.param((*P2, "rationale"), "profiles[2].rationale", id="assumed-rationale"),
        pytest.param((*P1, "copied_from"), "profiles[1].copied_from", id="copied-from"),
        pytest.param((*PROV0, "hardware"), "profiles[0].provenance.hardware", id="hardware"),
        pytest.param(
            (*PROV0, "engine_image"), "profiles[0].provenance.engine_image", id="engine-image"
        ),
        pytest.param((*PROV0, "sampling"), "profiles[0].provenance.sampling", id="sampling"),
    ],
)
def test_a_required_field_set_to_null_is_missing(
    tmp_path: Path, where: tuple[str | int, ...], path: str
) -> None:
    file = write(tmp_path, mutate(valid_set(), where, None))
    problems = problems_of(file)
    assert path in [p.path for p in problems], "\n".join(map(str, problems))


@pytest.mark.parametrize(
    "where",
    [
        pytest.param((*P1, "acceptance_length"), id="acceptance-length"),
        pytest.param((*P0, "per_position_rates", 0), id="rate"),
        pytest.param((*SAMP0, "temperature"), id="temperature"),
        pytest.param((*SAMP0, "top_p"), id="top-p"),
    ],
)
def test_an_integer_too_large_for_a_float_is_a_problem_not_a_crash(
    tmp_path: Path, where: tuple[str | int, ...]
) -> None:
    # YAML reads a 400-digit literal as an int; the number fields take ints.
    file = write(tmp_path, mutate(valid_set(), where, 10**400))
    problems = problems_of(file)
    assert any(p.path.startswith("profiles[") for p in problems)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param({"num_spec_tokens": 3, "acceptance_length": 10**400}, id="length"),
        pytest.param({"num_spec_tokens": 3, "acceptance_rate": 10**400}, id="rate"),
        pytest.param({"num_spec_tokens": 1, "per_position_rates": [10**400]}, id="rates"),
    ],
)
def test_an_inline_integer_too_large_for_a_float_is_a_problem_not_a_crash(
    data: dict[str, Any],
) -> None:
    problems = value_problems(data)
    assert all(p.path.startswith("acceptance.") for p in problems)


def test_every_problem_in_every_profile_is_reported_at_once(tmp_path: Path) -> None:
    data = valid_set()
    data["kind"] = "ProfileSet"
    data["caveats"][1] = ""
    data["profiles"][0]["num_spec_tokens"] = 0
    data["profiles"][0]["provenance"]["sampling"]["top_p"] = 2
    data["profiles"][1]["thinking"] = "maybe"
    del data["profiles"][1]["copied_from"]
    data["profiles"][2]["category"] = "Multi Turn"
    data["profiles"][2]["acceptance_length"] = 3.5  # K 2: outside [1, 3]
    file = write(tmp_path, data)
    problems = problems_of(file)
    assert_problem(problems, file, "kind", "AcceptanceProfileSet", only=False)
    assert_problem(problems, file, "caveats[1]", "must not be empty", only=False)
    assert_problem(problems, file, "profiles[0].num_spec_tokens", "at least 1", only=False)
    assert_problem(
        problems, file, "profiles[0].provenance.sampling.top_p", "outside (0, 1]", only=False
    )
    assert_problem(problems, file, "profiles[1].thinking", "'on'", only=False)
    assert_problem(problems, file, "profiles[1].copied_from", "required", only=False)
    assert_problem(problems, file, "profiles[2].category", "malformed", only=False)
    assert_problem(problems, file, "profiles[2].acceptance_length", "outside [1, 3]", only=False)
    assert len(problems) == 8, "\n".join(map(str, problems))


def test_one_bad_field_does_not_hide_a_cross_check(tmp_path: Path) -> None:
    # a mistyped model and a missing provenance in one profile: both are reported
    data = valid_set()
    data["profiles"][0]["model"] = 7
    del data["profiles"][0]["provenance"]
    file = write(tmp_path, data)
    problems = problems_of(file)
    assert_problem(problems, file, "profiles[0].model", "expected a string", only=False)
    assert_problem(problems, file, "profiles[0].provenance", "required", only=False)


# --------------------------------------------------------------------------- YAML documents
def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    text = VALID_TEXT.replace("  - Coding only.\n", "  - Coding only.\n   bad: [unclosed\n")
    file = write(tmp_path, text)
    problems = problems_of(file)
    assert len(problems) == 1
    assert problems[0].file == str(file)
    assert problems[0].path.startswith("line ")
    assert "invalid YAML" in problems[0].message
    assert str(file) in str(problems[0])


def test_a_yaml_syntax_error_line_is_one_based(tmp_path: Path) -> None:
    file = write(tmp_path, "kind: AcceptanceProfileSet\nname: [x\n")
    (problem,) = problems_of(file)
    assert problem.path.startswith(("line 2,", "line 3,"))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        pytest.param("name: test-set\n", "name: test-set\nname: other\n", id="top-level"),
        pytest.param(
            "    category: coding\n    acceptance_length: 2.5\n",
            "    category: coding\n    acceptance_length: 2.5\n    acceptance_length: 2.6\n",
            id="in-a-profile",
        ),
        pytest.param("top_p: 0.95,", "top_p: 0.95, top_p: 0.9,", id="flow-mapping"),
    ],
)
def test_a_duplicate_mapping_key_is_refused(tmp_path: Path, old: str, new: str) -> None:
    text = VALID_TEXT.replace(old, new, 1)
    assert text != VALID_TEXT
    file = write(tmp_path, text)
    (problem,) = problems_of(file)
    assert "repeats the key at line " in problem.message
    assert problem.path.startswith("line ")
    assert str(file) in str(problem)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        pytest.param("- kind: AcceptanceProfileSet\n", "list", id="list"),
        pytest.param("AcceptanceProfileSet\n", "str", id="string"),
        pytest.param("42\n", "int", id="int"),
        pytest.param("", "nothing", id="empty-file"),
        pytest.param("# only a comment\n", "nothing", id="comment-only"),
    ],
)
def test_a_non_mapping_document_is_refused(tmp_path: Path, text: str, kind: str) -> None:
    file = write(tmp_path, text)
    (problem,) = problems_of(file)
    assert problem.path == "(document)"
    assert "expected a mapping" in problem.message
    assert kind in problem.message
    assert str(file) in str(problem)


def test_a_non_mapping_profile_is_refused(tmp_path: Path) -> None:
    data = valid_set()
    data["profiles"][1] = "model-b"
    file = write(tmp_path, data)
    assert_problem(problems_of(file), file, "profiles[1]", "mapping")


def test_an_unreadable_file_is_a_validation_error(tmp_path: Path) -> None:
    file = tmp_path / "missing.yaml"
    (problem,) = problems_of(file)
    assert str(file) in str(problem)


ANCHORED = """\
kind: AcceptanceProfileSet
name: anchored
profiles:
  - &base
    model: model-a
    speculative_method: dspark
    num_spec_tokens: 1
    thinking: "on"
    category: coding
    acceptance_length: 1.8
    method: measured
    provenance: &prov
      source: https://example.com/a
      hardware: b300
      engine_image: img
      sampling: &greedy {temperature: 0}
  - {<<: *base, num_spec_tokens: 2, acceptance_length: 2.4}
  - <<: *base
    thinking: "off"
    provenance:
      <<: *prov
      hardware: h200
  - <<: [*base]
    num_spec_tokens: 3
    acceptance_length: 2.7
    provenance: {source: other, hardware: b200, engine_image: img2, sampling: *greedy}
"""


def test_anchors_aliases_and_merge_keys(tmp_path: Path) -> None:
    profile_set = load(AcceptanceProfileSet, write(tmp_path, ANCHORED))
    p = profile_set.profiles
    assert [x.num_spec_tokens for x in p] == [1, 2, 1, 3]
    assert [x.acceptance_length for x in p] == [1.8, 2.4, 1.8, 2.7]
    assert [x.thinking for x in p] == ["on", "on", "off", "on"]
    assert {x.model for x in p} == {"model-a"}
    assert p[1].provenance == p[0].provenance
    assert p[2].provenance is not None and p[2].provenance.hardware == "h200"
    assert p[2].provenance.source == "https://example.com/a"
    assert p[3].provenance is not None and p[3].provenance.sampling is not None
    assert p[3].provenance.sampling.temperature == 0


def test_a_merged_profile_is_checked_like_any_other(tmp_path: Path) -> None:
    # merging the first profile without changing its key repeats the key
    text = ANCHORED.replace(
        "  - {<<: *base, num_spec_tokens: 2, acceptance_length: 2.4}",
        "  - {<<: *base, acceptance_length: 1.9}",
    )
    file = write(tmp_path, text)
    assert_problem(problems_of(file), file, "profiles[1]", "repeats the key")


# --------------------------------------------------------------------------- inline values
def value_problems(data: object) -> list[Problem]:
    with pytest.raises(ValidationError) as exc:
        validate(AcceptanceValue, data, "scenario.yaml", prefix="acceptance")
    return exc.value.problems


BAD_VALUES = [
    pytest.param(
        {"num_spec_tokens": 0, "acceptance_length": 1.0},
        "acceptance.num_spec_tokens",
        "at least 1",
        id="k-0",
    ),
    pytest.param(
        {"acceptance_length": 2.0}, "acceptance.num_spec_tokens", "is required", id="no-k"
    ),
    pytest.param({"num_spec_tokens": 3}, "acceptance", "states no acceptance", id="no-acceptance"),
    pytest.param(
        {"num_spec_tokens": 3, "source": "a log"},
        "acceptance",
        "states no acceptance",
        id="only-a-source",
    ),
    pytest.param(
        {"num_spec_tokens": 3, "acceptance_length": 2.5, "acceptance_rate": 0.5},
        "acceptance.acceptance_rate",
        "not allowed with acceptance_length",
        id="length-and-rate",
    ),
    pytest.param(
        {"num_spec_tokens": 3, "acceptance_length": 4.5},
        "acceptance.acceptance_length",
        "outside [1, 4]",
        id="length-above",
    ),
    pytest.param(
        {"num_spec_tokens": 3, "acceptance_length": 0.9},
        "acceptance.acceptance_length",
        "below 1",
        id="length-below",
    ),
    pytest.param(
        {"num_spec_tokens": 3, "acceptance_length": math.nan},
        "acceptance.acceptance_length",
        "finite",
        id="length-nan",
    ),
    pytest.param(
        {"num_spec_tokens": 3, "acceptance_rate": 1.5},
        "acceptance.acceptance_rate",
        "outside [0, 1]",
        id="rate-above",
    ),
    pytest.param(
        {"num_spec_tokens": 3, "acceptance_rate": -0.1},
        "acceptance.acceptance_rate",
        "outside [0, 1]",
        id="rate-below",
    ),
    pytest.param(
        {"num_spec_tokens": 3, "acceptance_rate": math.inf},
        "acceptance.acceptance_rate",
        "finite",
        id="rate-inf",
    ),
    pytest.param(
        {"num_spec_tokens": 3, "per_position_rates": [0.5, 0.8, 0.2]},
        "acceptance.per_position_rates",
        "rises",
        id="rates-rise",
    ),
    pytest.param(
        {"num_spec_tokens": 3, "per_position_rates": [0.8, 0.5]},
        "acceptance.per_position_rates",
        "expected K = 3",
        id="rates-count",
    ),
    pytest.param(
        {"num_spec_tokens": 3, "per_position_rates": [0.8, 1.2, 0.2]},
        "acceptance.per_position_rates[1]",
        "outside [0, 1]",
        id="rate-entry",
    ),
    pytest.param(
        {"num_spec_tokens": 3, "acceptance_length": 2.5, "per_position_rates": [0.3, 0.2, 0.1]},
        "acceptance.per_position_rates",
        "disagree with the stated value",
        id="rates-vs-length",
    ),
    pytest.param(
        {"num_spec_tokens": 3, "acceptance_rate": 0.5, "per_position_rates": [0.3, 0.2, 0.1]},
        "acceptance.per_position_rates",
        "disagree with the stated value",
        id="rates-vs-rate",
    ),
    pytest.param(
        {"num_spec_tokens": 3, "acceptance_length": 2.5, "source": ""},
        "acceptance.source",
        "must not be empty",
        id="empty-source",
    ),
    pytest.param(
        {"num_spec_tokens": 3, "acceptance_length": 2.5, "k": 3},
        "acceptance",
        "not a recognized key",
        id="unknown-key",
    ),
]


@pytest.mark.parametrize(("data", "path", "phrase"), BAD_VALUES)
def test_an_invalid_inline_value_is_named(data: dict[str, Any], path: str, phrase: str) -> None:
    assert_problem(value_problems(data), "scenario.yaml", path, phrase)


@pytest.mark.parametrize(
    ("data", "length"),
    [
        ({"num_spec_tokens": 3, "acceptance_length": 2.8, "source": "server log"}, 2.8),
        ({"num_spec_tokens": 3, "acceptance_length": 1}, 1.0),
        ({"num_spec_tokens": 3, "acceptance_length": 4}, 4.0),
        ({"num_spec_tokens": 4, "acceptance_rate": 0.5}, 3.0),
        ({"num_spec_tokens": 4, "acceptance_rate": 0}, 1.0),
        ({"num_spec_tokens": 3, "per_position_rates": [0.9, 0.8, 0.5]}, 3.2),
        ({"num_spec_tokens": 2, "per_position_rates": [0.0, 0.0]}, 1.0),
        ({"num_spec_tokens": 2, "per_position_rates": [1.0, 1.0]}, 3.0),
        (
            {"num_spec_tokens": 3, "acceptance_length": 2.5, "per_position_rates": [0.8, 0.5, 0.2]},
            2.5,
        ),
        (
            {"num_spec_tokens": 3, "acceptance_rate": 0.5, "per_position_rates": [0.8, 0.5, 0.2]},
            2.5,
        ),
        (
            {
                "num_spec_tokens": 3,
                "acceptance_length": 2.5,
                "per_position_rates": [0.8, 0.5, 0.205],
            },
            2.5,
        ),
    ],
)
def test_a_valid_inline_value_states_its_length(data: dict[str, Any], length: float) -> None:
    value = validate(AcceptanceValue, data, "scenario.yaml", prefix="acceptance")
    assert value.length == pytest.approx(length, abs=1e-12)
    assert 1 <= value.length <= value.num_spec_tokens + 1


@pytest.mark.parametrize("field", ["acceptance_length", "acceptance_rate", "per_position_rates"])
def test_an_inline_value_with_its_only_acceptance_null_states_none(field: str) -> None:
    # `acceptance_length:` with nothing after it states no acceptance
    problems = value_problems({"num_spec_tokens": 3, field: None})
    assert all(p.path.startswith("acceptance") for p in problems)


def test_an_inline_value_that_is_not_a_mapping() -> None:
    (problem,) = value_problems(2.8)
    assert problem.path == "acceptance"
    assert "expected a mapping" in problem.message


# --------------------------------------------------------------------------- pins
def pin_file(tmp_path: Path, pin: object) -> Path:
    return write(tmp_path, {"name": "scenario", "acceptance": pin}, "scenario.yaml")


BAD_PINS = [
    pytest.param({}, "acceptance", "sets nothing", id="sets-nothing"),
    pytest.param(
        {
            "profiles": "inferencex-golden-al",
            "value": {"num_spec_tokens": 3, "acceptance_length": 2.8},
        },
        "acceptance.profiles",
        "not allowed with value",
        id="profiles-and-value",
    ),
    pytest.param(
        {"fallback_category": "coding", "value": {"num_spec_tokens": 3, "acceptance_length": 2.8}},
        "acceptance.fallback_category",
        "not allowed with value",
        id="fallback-and-value",
    ),
    pytest.param(
        {"value": {"num_spec_tokens": 3, "acceptance_length": 9}},
        "acceptance.value.acceptance_length",
        "outside [1, 4]",
        id="invalid-value",
    ),
    pytest.param(
        {"value": {"num_spec_tokens": 3}},
        "acceptance.value",
        "states no acceptance",
        id="value-states-nothing",
    ),
    pytest.param({"profiles": ""}, "acceptance.profiles", "must not be empty", id="empty-profiles"),
    pytest.param(
        {"fallback_category": "Coding"},
        "acceptance.fallback_category",
        "malformed",
        id="malformed-fallback",
    ),
    pytest.param(
        {"profiles": "x", "category": "coding"},
        "acceptance",
        "not a recognized key",
        id="unknown-key",
    ),
]


@pytest.mark.parametrize(("pin", "path", "phrase"), BAD_PINS)
def test_an_invalid_pin_is_named(
    tmp_path: Path, pin: dict[str, Any], path: str, phrase: str
) -> None:
    file = pin_file(tmp_path, pin)
    assert_problem(problems_of(file, AcceptancePin, key="acceptance"), file, path, phrase)


@pytest.mark.parametrize(
    "pin",
    [
        {"value": {"num_spec_tokens": 3, "acceptance_length": 2.8, "source": "server log"}},
        {"profiles": "inferencex-golden-al", "fallback_category": "coding"},
        {"profiles": "inferencex-golden-al"},
        {"fallback_category": "coding"},
    ],
)
def test_a_valid_pin(tmp_path: Path, pin: dict[str, Any]) -> None:
    loaded = load(AcceptancePin, pin_file(tmp_path, pin), key="acceptance")
    if "value" in pin:
        assert loaded.value is not None and loaded.value.length == 2.8


@pytest.mark.parametrize(
    "pin",
    [{"profiles": None}, {"value": None}, {"fallback_category": None}],
    ids=["profiles", "value", "fallback-category"],
)
def test_a_pin_whose_only_key_is_null_sets_nothing(tmp_path: Path, pin: dict[str, Any]) -> None:
    file = pin_file(tmp_path, pin)
    problems = problems_of(file, AcceptancePin, key="acceptance")
    assert all(p.path.startswith("acceptance") for p in problems)


def test_a_scenario_without_its_acceptance_key(tmp_path: Path) -> None:
    file = write(tmp_path, {"name": "scenario"}, "scenario.yaml")
    assert_problem(
        problems_of(file, AcceptancePin, key="acceptance"), file, "acceptance", "required"
    )


# --------------------------------------------------------------------------- fuzz
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
JSON_LIKE = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=24,
)


def _places(data: Any, where: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Every field path of ``data`` (mappings' keys and lists' indices, at every depth)."""
    out: list[tuple[str | int, ...]] = []
    items = (
        data.items()
        if isinstance(data, dict)
        else enumerate(data)
        if isinstance(data, list)
        else ()
    )
    for key, child in items:
        out.append((*where, key))
        out += _places(child, (*where, key))
    return out


PLACES = _places(valid_set())
# keys a field may be added under: known ones in the wrong place, and an unknown one
NEW_KEYS = [
    "kind",
    "profiles",
    "provenance",
    "sampling",
    "acceptance_rate",
    "rationale",
    "copied_from",
    "per_position_rates",
    "unknown",
]


def _get(data: Any, where: tuple[str | int, ...]) -> Any:
    for part in where:
        data = data[part]
    return data


MAPPINGS = [()] + [p for p in PLACES if isinstance(_get(valid_set(), p), dict)]


def _validates_or_refuses(model: type, data: Any) -> None:
    try:
        validate(model, data, "fuzz.yaml")
    except ValidationError as exc:
        assert exc.problems
        for p in exc.problems:
            assert isinstance(p.path, str) and isinstance(p.message, str) and p.message
            assert str(p).startswith("fuzz.yaml: ")


@FUZZ
@given(doc=JSON_LIKE)
def test_fuzz_arbitrary_documents(doc: Any) -> None:
    for model in (AcceptanceProfileSet, AcceptanceValue, AcceptancePin):
        _validates_or_refuses(model, doc)


@FUZZ
@given(
    profiles=st.lists(
        st.dictionaries(
            st.sampled_from(
                sorted(
                    {
                        *NEW_KEYS,
                        "model",
                        "thinking",
                        "num_spec_tokens",
                        "acceptance_length",
                        "method",
                        "category",
                        "speculative_method",
                    }
                )
            ),
            JSON_LIKE,
        ),
        max_size=3,
    )
)
def test_fuzz_arbitrary_profiles(profiles: list[dict[str, Any]]) -> None:
    _validates_or_refuses(
        AcceptanceProfileSet, {"kind": "AcceptanceProfileSet", "name": "n", "profiles": profiles}
    )


@FUZZ
@given(
    where=st.sampled_from(PLACES),
    value=JSON_LIKE,
    delete=st.booleans(),
    added=st.tuples(st.sampled_from(MAPPINGS), st.sampled_from(NEW_KEYS), JSON_LIKE) | st.none(),
)
def test_fuzz_one_field_of_the_valid_set_replaced(
    where: tuple[str | int, ...],
    value: Any,
    delete: bool,
    added: tuple[tuple[str | int, ...], str, Any] | None,
) -> None:
    data = valid_set()
    mutate(data, where, DELETE if delete else value)
    if added is not None:
        at, key, new = added
        try:
            target = _get(data, at)
        except (KeyError, IndexError, TypeError):
            target = None
        if isinstance(target, dict):
            target[key] = new
    _validates_or_refuses(AcceptanceProfileSet, data)


VALUE_KEYS = st.fixed_dictionaries(
    {},
    optional={
        "num_spec_tokens": st.integers(-2, 6) | JSON_LIKE,
        "acceptance_length": st.floats(0, 8) | JSON_LIKE,
        "acceptance_rate": st.floats(-0.5, 1.5) | JSON_LIKE,
        "per_position_rates": st.lists(st.floats(-0.2, 1.2), max_size=6) | JSON_LIKE,
        "source": st.text(max_size=5) | JSON_LIKE,
    },
)


@FUZZ
@given(data=VALUE_KEYS)
def test_fuzz_inline_values(data: dict[str, Any]) -> None:
    try:
        value = validate(AcceptanceValue, data, "fuzz.yaml", prefix="acceptance")
    except ValidationError as exc:
        assert all(p.path.startswith("acceptance") for p in exc.problems)
        return
    # a value that validates states an AL in [1, K + 1] (a value whose only acceptance key is
    # null is test_an_inline_value_with_its_only_acceptance_null_states_none's case)
    stated = (value.acceptance_length, value.acceptance_rate, value.per_position_rates)
    if any(v is not None for v in stated):
        assert 1 <= value.length <= value.num_spec_tokens + 1


@FUZZ
@given(
    pin=st.fixed_dictionaries(
        {},
        optional={
            "profiles": JSON_LIKE,
            "value": VALUE_KEYS | JSON_LIKE,
            "fallback_category": JSON_LIKE,
        },
    )
)
def test_fuzz_pins(pin: dict[str, Any]) -> None:
    _validates_or_refuses(AcceptancePin, pin)


YAML_ALPHABET = st.sampled_from(list("ab01.-:[]{},&*!|>'\"#?%@` \n\t<=~\\")) | st.characters()


@FUZZ
@given(text=st.text() | st.text(alphabet=YAML_ALPHABET, max_size=60))
def test_fuzz_parse_yaml_raises_only_validation_errors(text: str) -> None:
    try:
        parse_yaml(text, "fuzz.yaml")
    except ValidationError as exc:
        (problem,) = exc.problems
        assert problem.file == "fuzz.yaml"
        assert "invalid YAML" in problem.message


def test_fuzz_helpers_cover_the_fixture() -> None:
    assert ("profiles", 0, "provenance", "sampling", "top_p") in PLACES
    assert ("profiles", 0, "provenance", "sampling") in MAPPINGS
