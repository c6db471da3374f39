"""The shipped registry and user registries (spec 001, "Profile set")."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from speclens.acceptance import (
    AcceptanceProfileSet,
    ProfileKey,
    Registry,
    ValidationError,
    load_sets,
    shipped_registry,
)
from speclens.acceptance.files import parse_yaml, read_yaml

#: The specification beside this checkout (shared/ sits next to the repository).
SPEC = Path(__file__).resolve().parents[3] / "shared" / "seeds" / "001_2482355381b1763c.txt"

SHIPPED_NAMES = {
    "inferencex-golden-al",
    "inferencex-golden-al-2026-08",
    "kimi-k3-dspark-golden-al",
    "smollm2-ngram-spec-bench",
    "smollm2-ngram-spread",
}

USER_SET = """\
kind: AcceptanceProfileSet
name: {name}
profiles:
  - model: glm-5.3
    speculative_method: mtp
    num_spec_tokens: 3
    thinking: "on"
    category: coding
    acceptance_length: {al}
    method: assumed
    rationale: A user's own guess.
"""


def spec_example() -> str:
    """The profile-set example of the spec: from ``kind: AcceptanceProfileSet`` up to the first
    key table after it."""
    if not SPEC.exists():
        pytest.skip("the specification is not beside this checkout")
    text = SPEC.read_text(encoding="utf-8")
    start = text.index("kind: AcceptanceProfileSet")
    lines = text[start:].splitlines(keepends=True)
    end = next(i for i, line in enumerate(lines) if line.startswith("Key\tType"))
    return "".join(lines[:end])


def user_registry(root: Path, files: dict[str, str], sub: str | None = "acceptance") -> Path:
    folder = root / sub if sub else root
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return root


GLM_KEY = ProfileKey(
    model="glm-5.3", speculative_method="mtp", num_spec_tokens=3, thinking="on", category="coding"
)


# --------------------------------------------------------------------------- the shipped registry
@pytest.fixture(scope="module")
def shipped() -> Registry:
    return Registry.load()


def test_the_shipped_registry_loads(shipped: Registry) -> None:
    assert set(shipped.names) >= SHIPPED_NAMES
    assert len(shipped) == len(shipped.names)
    for registered in shipped:
        assert isinstance(registered.profile_set, AcceptanceProfileSet)
        assert registered.name == registered.path.stem
        # by convention a set's name equals its file name
        assert registered.profile_set.name == registered.name
        assert registered.path.parent == shipped_registry() / "acceptance"


def test_only_the_shipped_registry_without_extras(shipped: Registry) -> None:
    assert set(shipped.names) == {
        p.stem for p in (shipped_registry() / "acceptance").glob("*.y*ml")
    }
    assert len(Registry.load(shipped=False)) == 0


def test_inferencex_golden_al_holds_the_spec_example(shipped: Registry) -> None:
    registered = shipped.get("inferencex-golden-al")
    assert registered is not None
    profiles = registered.profile_set.profiles
    assert [(str(p.key), p.acceptance_length, p.method) for p in profiles] == [
        ("deepseek-v4.1-flash/dspark/k5/thinking-off/coding", 4.07, "measured"),
        ("deepseek-v4.1-flash/dspark/k5/thinking-on/coding", 3.51, "measured"),
        ("glm-5.3/mtp/k3/thinking-on/coding", 2.99, "copied"),
    ]
    assert len(registered.profile_set.caveats or []) == 3
    # the anchored provenance is shared by both DeepSeek profiles
    first, second, glm = profiles
    assert first.provenance is not None
    assert first.provenance == second.provenance
    assert first.provenance.hardware == "b300"
    assert first.provenance.prompts == 80 and first.provenance.tp == 4
    assert first.provenance.sampling is not None
    assert first.provenance.sampling.temperature == 1.0
    assert first.provenance.sampling.max_tokens == 4096
    assert first.provenance.settings == {
        "draft_sample_method": "probabilistic",
        "rejection_sample_method": "block",
    }
    assert glm.copied_from == "glm-5.2-fp8/mtp/k3/thinking-on/coding"
    assert glm.rationale and glm.rationale.startswith("Provisional.")
    assert glm.provenance is not None and glm.provenance.sampling is not None
    assert glm.provenance.sampling.top_p == 0.95
    assert glm.provenance.engine_image is None


def test_inferencex_golden_al_file_is_the_spec_example(shipped: Registry) -> None:
    registered = shipped.get("inferencex-golden-al")
    assert registered is not None
    example = spec_example()
    assert example.startswith("kind: AcceptanceProfileSet\nname: inferencex-golden-al\n")
    expected = parse_yaml(example, "spec")
    actual = read_yaml(registered.path)
    assert actual == expected
    assert yaml.safe_load(example) == expected
    # one anchor, shared by alias
    assert actual["profiles"][0]["provenance"] is actual["profiles"][1]["provenance"]
    text = registered.path.read_text(encoding="utf-8")
    assert "&dsv41" in text and "*dsv41" in text


def test_kimi_k3_dspark_golden_al(shipped: Registry) -> None:
    registered = shipped.get("kimi-k3-dspark-golden-al")
    assert registered is not None
    profiles = registered.profile_set.profiles
    assert [p.num_spec_tokens for p in profiles] == list(range(1, 9))
    assert [p.acceptance_length for p in profiles] == [
        1.84,
        2.45,
        2.87,
        3.22,
        3.44,
        3.54,
        3.78,
        3.88,
    ]
    for p in profiles:
        assert p.model == "kimi-k3"
        assert p.speculative_method == "dspark"
        assert p.category == "coding"
        assert p.thinking == "on"
        assert 1 <= p.acceptance_length <= p.num_spec_tokens + 1
    assert len({p.key for p in profiles}) == 8


def test_shipped_find(shipped: Registry) -> None:
    key = ProfileKey(
        model="kimi-k3",
        speculative_method="dspark",
        num_spec_tokens=7,
        thinking="on",
        category="coding",
    )
    # the published curve (measured) and the older quote of it (assumed); the resolver picks
    # the measured one
    hits = {name: profile for name, profile in shipped.find(key)}
    assert set(hits) == {"inferencex-golden-al-2026-08", "kimi-k3-dspark-golden-al"}
    assert {p.acceptance_length for p in hits.values()} == {3.78}
    assert hits["inferencex-golden-al-2026-08"].method == "measured"
    missing = ProfileKey(
        model="kimi-k3",
        speculative_method="dspark",
        num_spec_tokens=9,
        thinking="on",
        category="coding",
    )
    assert shipped.find(missing) == []
    assert shipped.find(key, names=["inferencex-golden-al"]) == []


# --------------------------------------------------------------------------- user registries
def test_a_user_registry_dir_is_added(tmp_path: Path) -> None:
    root = user_registry(tmp_path / "reg", {"mine.yaml": USER_SET.format(name="mine", al=2.8)})
    registry = Registry.load(extra=[root])
    assert set(registry.names) == SHIPPED_NAMES | {"mine"}
    mine = registry.get("mine")
    assert mine is not None
    assert mine.path == root / "acceptance" / "mine.yaml"
    assert mine.profile_set.profiles[0].acceptance_length == 2.8
    assert "mine" in registry


def test_a_user_registry_alone(tmp_path: Path) -> None:
    root = user_registry(tmp_path / "reg", {"mine.yaml": USER_SET.format(name="mine", al=2.8)})
    registry = Registry.load(extra=[root], shipped=False)
    assert registry.names == ["mine"]


def test_a_set_is_known_by_its_file_stem(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = user_registry(
        tmp_path / "reg", {"by-file.yaml": USER_SET.format(name="by-content", al=2.8)}
    )
    with caplog.at_level(logging.WARNING):
        registry = Registry.load(extra=[root])
    assert "by-file" in registry
    assert "by-content" not in registry
    registered = registry.get("by-file")
    assert registered is not None and registered.profile_set.name == "by-content"
    assert "by-file" in caplog.text  # the mismatch is pointed out


def test_yml_files_are_read_too(tmp_path: Path) -> None:
    root = user_registry(tmp_path / "reg", {"other.yml": USER_SET.format(name="other", al=2.8)})
    assert "other" in Registry.load(extra=[root], shipped=False)


def test_a_user_set_with_a_shipped_name_is_refused(tmp_path: Path) -> None:
    root = user_registry(
        tmp_path / "reg",
        {"inferencex-golden-al.yaml": USER_SET.format(name="inferencex-golden-al", al=2.8)},
    )
    with pytest.raises(ValidationError) as exc:
        Registry.load(extra=[root])
    (problem,) = exc.value.problems
    assert problem.path == "name"
    assert "inferencex-golden-al" in problem.message
    assert problem.file == str(root / "acceptance" / "inferencex-golden-al.yaml")
    assert str(shipped_registry() / "acceptance" / "inferencex-golden-al.yaml") in problem.message


def test_two_user_dirs_with_one_name_are_refused(tmp_path: Path) -> None:
    a = user_registry(tmp_path / "a", {"mine.yaml": USER_SET.format(name="mine", al=2.8)})
    b = user_registry(tmp_path / "b", {"mine.yaml": USER_SET.format(name="mine", al=2.9)})
    with pytest.raises(ValidationError) as exc:
        Registry.load(extra=[a, b], shipped=False)
    (problem,) = exc.value.problems
    assert problem.path == "name"
    assert problem.file == str(b / "acceptance" / "mine.yaml")
    assert str(a / "acceptance" / "mine.yaml") in problem.message


def test_a_broken_file_lists_every_problem(tmp_path: Path) -> None:
    broken = USER_SET.format(name="broken", al=9.5).replace('thinking: "on"', "thinking: maybe")
    root = user_registry(
        tmp_path / "reg",
        {"broken.yaml": broken, "fine.yaml": USER_SET.format(name="fine", al=2.8)},
    )
    with pytest.raises(ValidationError) as exc:
        Registry.load(extra=[root])
    file = str(root / "acceptance" / "broken.yaml")
    assert {(p.file, p.path) for p in exc.value.problems} == {
        (file, "profiles[0].thinking"),
        (file, "profiles[0].acceptance_length"),
    }
    assert f"{file}: profiles[0].acceptance_length: " in str(exc.value)


def test_two_broken_files_are_both_reported(tmp_path: Path) -> None:
    root = user_registry(
        tmp_path / "reg",
        {
            "one.yaml": USER_SET.format(name="one", al=0.5),
            "two.yaml": "kind: AcceptanceProfileSet\nname: [two\n",
            "three.yaml": USER_SET.format(name="three", al=2.8).replace("kind: ", "kind: X"),
        },
    )
    with pytest.raises(ValidationError) as exc:
        Registry.load(extra=[root])
    by_file = {(Path(p.file).name, p.path) for p in exc.value.problems}
    assert ("one.yaml", "profiles[0].acceptance_length") in by_file
    assert any(f == "two.yaml" and path.startswith("line ") for f, path in by_file)
    assert ("three.yaml", "kind") in by_file
    text = str(exc.value)
    for name in ("one.yaml", "two.yaml", "three.yaml"):
        assert str(root / "acceptance" / name) in text


def test_problems_from_several_dirs_are_all_reported(tmp_path: Path) -> None:
    a = user_registry(tmp_path / "a", {"x.yaml": "- not a mapping\n"})
    b = user_registry(tmp_path / "b", {"y.yaml": ""})
    missing = tmp_path / "nowhere"
    with pytest.raises(ValidationError) as exc:
        Registry.load(extra=[a, missing, b])
    files = {p.file for p in exc.value.problems}
    assert files == {
        str(a / "acceptance" / "x.yaml"),
        str(missing),
        str(b / "acceptance" / "y.yaml"),
    }


def test_a_path_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-registry"
    with pytest.raises(ValidationError) as exc:
        Registry.load(extra=[missing])
    (problem,) = exc.value.problems
    assert problem.file == str(missing)
    assert "does not exist" in problem.message


def test_an_empty_registry_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "acceptance").mkdir()
    with pytest.raises(ValidationError) as exc:
        load_sets([tmp_path])
    (problem,) = exc.value.problems
    assert problem.file == str(tmp_path)
    assert "no acceptance/*.yaml" in problem.message


def test_find_returns_matches_from_every_set(shipped: Registry, tmp_path: Path) -> None:
    root = user_registry(tmp_path / "reg", {"mine.yaml": USER_SET.format(name="mine", al=2.8)})
    registry = Registry.load(extra=[root])
    hits = registry.find(GLM_KEY)
    assert sorted((name, p.acceptance_length) for name, p in hits) == [
        ("inferencex-golden-al", 2.99),
        ("mine", 2.8),
    ]
    assert [name for name, _ in registry.find(GLM_KEY, names=["mine"])] == ["mine"]
    assert [name for name, _ in shipped.find(GLM_KEY)] == ["inferencex-golden-al"]


def test_load_sets_reads_a_folder_without_acceptance(tmp_path: Path) -> None:
    folder = user_registry(
        tmp_path / "flat",
        {
            "a.yaml": USER_SET.format(name="a", al=2.8),
            "b.yaml": USER_SET.format(name="b", al=2.9),
            "notes.txt": "not a profile set",
        },
        sub=None,
    )
    sets = load_sets([folder])
    assert [(s.name, s.path) for s in sets] == [("a", folder / "a.yaml"), ("b", folder / "b.yaml")]
    assert Registry.load(extra=[folder], shipped=False).names == ["a", "b"]


def test_load_sets_reads_a_single_file(tmp_path: Path) -> None:
    file = tmp_path / "single.yaml"
    file.write_text(USER_SET.format(name="single", al=2.8), encoding="utf-8")
    (registered,) = load_sets([file])
    assert registered.name == "single" and registered.path == file


def test_acceptance_dir_wins_over_the_folder_itself(tmp_path: Path) -> None:
    root = user_registry(tmp_path / "reg", {"inside.yaml": USER_SET.format(name="inside", al=2.8)})
    (root / "outside.yaml").write_text("not: [valid", encoding="utf-8")
    assert [s.name for s in load_sets([root])] == ["inside"]
