"""Files a user controls that point elsewhere: a registry entry or a scenario's
``step_cost_file`` that leaves its folder (a symlink, ``..``, an absolute path) is refused naming
the file, and no message ever prints the lines of a file that is not what it should be. A file
of secret-looking lines (the shape of /etc/shadow: each line ends in ':', so YAML reads it as a
mapping whose keys are the lines) stands in for a real secret."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

import launch
from speclens.acceptance import AcceptanceProfileSet, ValidationError, load, load_sets
from speclens.acceptance.files import parse_yaml

SECRET = "SECRETHASHxyz"
#: /etc/shadow's shape: user:hash:lastchg:min:max:warn::: with a trailing ':'.
SHADOW = (
    f"zorroacct:$6$saltsalt${SECRET}0:19000:0:99999:7:::\n"
    f"daemonxq:*:19000:0:99999:7:::\n"
    f"alice:$6$pepper${SECRET}1:19000:0:99999:7:::\n"
)

SMALL = {
    "model": "kimi-k3",
    "hardware": "b300",
    "deployment": {"pools": [{"engine": {"speculative": {"method": "dspark", "num_spec_tokens": 7}}}]},
    "workload": {"category": "coding", "thinking": "on", "input_tokens": 32,
                 "output_tokens": 32, "concurrency": 4, "requests": 8},
}  # fmt: skip


def speclens(*args: str | Path, timeout: float = 60) -> tuple[int, str]:
    """``python -m speclens ARGS`` in a child; (exit code, stdout and stderr together)."""
    done = launch.run(
        [sys.executable, "-m", "speclens", *map(str, args)],
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )
    return done.returncode, done.stdout + done.stderr


def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere" / "shadow"
    path.parent.mkdir()
    path.write_text(SHADOW)
    return path


def registry(tmp_path: Path) -> Path:
    (tmp_path / "reg" / "acceptance").mkdir(parents=True)
    return tmp_path / "reg"


def assert_no_secret(text: str) -> None:
    assert SECRET not in text, text
    assert "zorroacct" not in text and "daemonxq" not in text, text


def test_a_registry_entry_symlinked_out_of_its_folder_is_refused(tmp_path: Path) -> None:
    reg = registry(tmp_path)
    entry = reg / "acceptance" / "x.yaml"
    entry.symlink_to(secret_file(tmp_path))
    code, text = speclens("profiles", "list", "--registry", reg)
    assert code == 1, text
    assert f"{entry}: (file): leaves its folder {reg / 'acceptance'}" in text, text
    assert "expected a path inside that folder" in text
    assert_no_secret(text)


def test_a_relative_symlink_through_dotdot_is_refused(tmp_path: Path) -> None:
    secret_file(tmp_path)
    reg = registry(tmp_path)
    entry = reg / "acceptance" / "x.yaml"
    entry.symlink_to(Path("..") / ".." / "elsewhere" / "shadow")
    with pytest.raises(ValidationError) as caught:
        load_sets([reg])
    (problem,) = caught.value.problems
    assert problem.file == str(entry) and "leaves its folder" in problem.message
    assert_no_secret(str(caught.value))


def test_a_registry_whose_acceptance_folder_is_a_symlink_elsewhere_is_refused(
    tmp_path: Path,
) -> None:
    outside = secret_file(tmp_path).parent
    (outside / "set.yaml").write_text(SHADOW)
    reg = tmp_path / "reg"
    reg.mkdir()
    (reg / "acceptance").symlink_to(outside)
    with pytest.raises(ValidationError) as caught:
        load_sets([reg])
    (problem,) = caught.value.problems  # the folder once, not once per file
    assert problem.file == str(reg / "acceptance") and "leaves its folder" in problem.message
    assert_no_secret(str(caught.value))


def test_a_symlink_inside_the_registry_folder_is_kept(tmp_path: Path) -> None:
    reg = registry(tmp_path)
    shipped = Path(__file__).resolve().parents[2] / "src/speclens/registry/acceptance"
    real = reg / "acceptance" / "inferencex-golden-al.yaml"
    real.write_text((shipped / "inferencex-golden-al.yaml").read_text())
    (reg / "acceptance" / "alias.yaml").symlink_to(real.name)
    names = sorted(s.name for s in load_sets([reg]))
    assert names == ["alias", "inferencex-golden-al"]


def test_a_secret_file_validated_directly_is_located_never_quoted(tmp_path: Path) -> None:
    """``profiles validate /etc/shadow``: every problem names the file and a line, no line."""
    path = secret_file(tmp_path)
    code, text = speclens("profiles", "validate", path)
    assert code == 1, text
    assert_no_secret(text)
    for line in (1, 2, 3):
        assert f"{path}: (document): the key at line {line}, column 1 is not a recognized key" in (
            text
        ), text
    assert "expected one of kind, name, caveats, profiles" in text


def test_an_unknown_nested_key_is_located_by_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        f"kind: AcceptanceProfileSet\nname: s\nprofiles:\n  - model: m\n    {SECRET}: 1\n"
    )
    with pytest.raises(ValidationError) as caught:
        load(AcceptanceProfileSet, path)
    assert SECRET not in str(caught.value)
    hit = [p for p in caught.value.problems if "not a recognized key" in p.message]
    assert [(p.path, p.message.split(" is ")[0]) for p in hit] == [
        ("profiles[0]", "the key at line 5, column 5")
    ]
    assert "expected one of model, speculative_method" in hit[0].message


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(f"{SECRET}: 1\n{SECRET}: 2\n", id="duplicate-key"),
        pytest.param(f"a: !{SECRET} x\n", id="unknown-tag"),
        pytest.param(f"a: *{SECRET}\n", id="undefined-alias"),
        pytest.param(f"a: &{SECRET} 1\nb: &{SECRET} 2\nc: 3\n", id="repeated-anchor"),
    ],
)
def test_a_yaml_error_quotes_none_of_the_input(text: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_yaml(text, "f.yaml")
    message = str(caught.value)
    assert SECRET not in message, message
    assert message.startswith("f.yaml: line ") or message.startswith("f.yaml: (document)")


def _scenario(tmp_path: Path, step_cost_file: str) -> Path:
    data = {**SMALL, "deployment": {"pools": [{**SMALL["deployment"]["pools"][0]}]}}  # type: ignore[index]
    data["deployment"]["pools"][0]["step_cost_file"] = step_cost_file  # type: ignore[index]
    path = tmp_path / "scn" / "scenario.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_a_step_cost_file_outside_the_scenario_folder_is_refused(tmp_path: Path, how: str) -> None:
    secret = secret_file(tmp_path)
    name = {"dotdot": "../elsewhere/shadow", "absolute": str(secret), "symlink": "cost.yaml"}[how]
    path = _scenario(tmp_path, name)
    if how == "symlink":
        (path.parent / "cost.yaml").symlink_to(secret)
    code, text = speclens("sim", path, "--json")
    assert code == 1, text
    assert "step_cost_file: leaves its folder" in text, text
    assert str(path.parent / name) in text
    assert_no_secret(text)


def test_a_step_cost_file_of_secret_lines_inside_the_folder_is_not_quoted(
    tmp_path: Path,
) -> None:
    path = _scenario(tmp_path, "cost.yaml")
    (path.parent / "cost.yaml").write_text(SHADOW)
    code, text = speclens("sim", path, "--json")
    assert code == 1, text
    assert "cost.yaml" in text and "line 1, column 1" in text, text
    assert_no_secret(text)
