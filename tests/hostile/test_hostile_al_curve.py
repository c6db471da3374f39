"""Hostile input to the AL curve (``speclens.acceptance.curve``) and to ``calibrate
--write-profile``: a curve for a K outside 1..8, an AL outside [1, K + 1] at some K, flags that
make no profile, a target that cannot be written. Each is refused in one line, before the fit,
and nothing is written: neither the profile set nor the cost file."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from curvekit import off_points
from curvekit import point as _point
from speclens.acceptance import AcceptanceProfileSet, ValidationError, curve
from speclens.cli.calibrate_points import write_all


@pytest.fixture
def points(tmp_path: Path) -> Path:
    return off_points(tmp_path / "off")


def _refused(run_cli: Any, tmp_path: Path, args: list[Any], code: int, phrase: str) -> str:
    out, profile = tmp_path / "cost.yaml", tmp_path / "reg" / "acceptance" / "r.yaml"
    args = [str(a).replace("PROFILE", str(profile)) for a in args]
    got, stdout, err = run_cli("calibrate", *args, "-o", out)
    assert got == code, (stdout, err)
    assert len(err.strip().splitlines()) == 1 and phrase in err, err
    assert "Traceback" not in err
    assert not out.exists() and not profile.exists()
    return err.strip()


def test_a_run_at_a_k_past_8_makes_no_curve(run_cli, tmp_path: Path, points: Path) -> None:
    run = _point(tmp_path / "mtp9", 4, k=9, al=3.0)
    line = _refused(run_cli, tmp_path, [points, "--acceptance-from", run, "--write-profile",
                                        "PROFILE", "--thinking", "on"], 1, "lies outside 1..8")  # fmt: skip
    assert line.startswith(f"{run / 'summary.json'}: settings.num_spec_tokens: K 9 lies outside")


def test_a_k_past_8_from_the_flag_names_the_flag(run_cli, tmp_path: Path, points: Path) -> None:
    run = _point(tmp_path / "mtp", 4, k=None, al=1.0, method="mtp")
    line = _refused(run_cli, tmp_path, [points, "--acceptance-from", run, "-k", "12",
                                        "--write-profile", "PROFILE", "--thinking", "off"], 1,
                    "K 12 lies outside 1..8")  # fmt: skip
    assert line.startswith("command line: -k: ")


@pytest.mark.parametrize(("extra", "phrase"), [
    (["--write-profile", "PROFILE"], "--thinking: the run's thinking mode"),
    (["--write-profile", "PROFILE", "--thinking", "on", "--category", "Random Prompts"],
     "--category: 'Random Prompts' is malformed"),
    (["--write-profile", "curve.json", "--thinking", "on"], "expected a .yaml file"),
])  # fmt: skip
def test_flags_that_make_no_profile_are_usage_errors(run_cli, tmp_path: Path, points: Path,
                                                     extra: list[str], phrase: str) -> None:  # fmt: skip
    run = _point(tmp_path / "mtp", 4, k=3, al=2.4)
    _refused(run_cli, tmp_path, [points, "--acceptance-from", run, *extra], 2, phrase)


def test_a_run_without_a_dataset_needs_a_category(run_cli, tmp_path: Path, points: Path) -> None:
    run = _point(tmp_path / "mtp", 4, k=3, al=2.4, dataset=None)
    _refused(run_cli, tmp_path, [points, "--acceptance-from", run, "--write-profile", "PROFILE",
                                 "--thinking", "on"], 2, "states no settings.dataset")  # fmt: skip


@pytest.mark.parametrize("extra", [["--write-profile", "PROFILE"], ["--thinking", "on"],
                                   ["--category", "coding"]])  # fmt: skip
def test_profile_flags_without_acceptance_from(run_cli, tmp_path: Path, points: Path,
                                               extra: list[str]) -> None:  # fmt: skip
    _refused(run_cli, tmp_path, [points, *extra], 2, "go with --acceptance-from")


def test_the_key_flags_without_write_profile(run_cli, tmp_path: Path, points: Path) -> None:
    run = _point(tmp_path / "mtp", 4, k=3, al=2.4)
    _refused(run_cli, tmp_path, [points, "--acceptance-from", run, "--thinking", "on"], 2,
             "give it")  # fmt: skip


def test_the_profile_set_may_not_be_the_cost_file(run_cli, tmp_path: Path, points: Path) -> None:
    run = _point(tmp_path / "mtp", 4, k=3, al=2.4)
    out = tmp_path / "cost.yaml"
    code, _, err = run_cli("calibrate", points, "--acceptance-from", run, "--write-profile", out,
                           "--thinking", "on", "-o", out)  # fmt: skip
    assert code == 2 and "is the cost file" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_an_unwritable_profile_target_is_refused_before_the_fit(run_cli, tmp_path: Path,
                                                                points: Path) -> None:  # fmt: skip
    run = _point(tmp_path / "mtp", 4, k=3, al=2.4)
    blocker = tmp_path / "reg"
    blocker.write_text("a file where the directory would go")
    _refused(run_cli, tmp_path, [points, "--acceptance-from", run, "--write-profile",
                                 blocker / "r.yaml", "--thinking", "on"], 1,
             "--write-profile: cannot write")  # fmt: skip


def test_a_failed_write_leaves_neither_file(tmp_path: Path) -> None:
    """The cost file and the profile set are written together: when the second cannot be, the
    first is not left behind, nor any temporary file."""
    first, second = tmp_path / "cost.yaml", tmp_path / "missing" / "r.yaml"
    with pytest.raises(typer.Exit) as exc:
        write_all([(first, "a: 1\n"), (second, "b: 2\n")])
    assert exc.value.exit_code == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("k", "value", "where"), [
    (3, 0.5, "at K 3"), (2, 3.5, "at K 2"), (8, math.nan, "at K 8"), (5, math.inf, "at K 5"),
])  # fmt: skip
def test_a_training_curve_with_an_al_outside_its_bounds(k: int, value: float, where: str) -> None:
    lengths = [1.5 + 0.3 * i for i in range(8)]
    lengths[k - 1] = value
    bad = curve.TrainingCurve("m/mtp/thinking-on/coding", "file", tuple(lengths))
    with pytest.raises(ValidationError) as exc:
        curve.fit([bad], "set", "set.yaml")
    (problem,) = exc.value.problems
    assert problem.file == "set.yaml" and problem.path == f"m/mtp/thinking-on/coding {where}"
    assert f"lies outside [1, {k + 1}]" in problem.message and "\n" not in str(exc.value)


def test_a_training_curve_short_of_a_k_or_none_at_all() -> None:
    with pytest.raises(ValidationError, match=r"has 7 ALs, expected one at each K 1..8"):
        curve.fit([curve.TrainingCurve("c", "f", (2.0,) * 7)], "set")
    with pytest.raises(ValidationError, match="no training curve"):
        curve.fit([], "set")


def test_a_set_whose_curve_misses_a_k_is_no_training_set() -> None:
    profiles = [{"model": "m", "speculative_method": "mtp", "num_spec_tokens": k,
                 "thinking": "on", "category": "coding", "acceptance_length": 1.5 + 0.2 * k,
                 "method": "assumed", "rationale": "r"} for k in (1, 2, 3, 5, 6, 7, 8)]  # fmt: skip
    missing = AcceptanceProfileSet.model_validate(
        {"kind": "AcceptanceProfileSet", "name": "s", "profiles": profiles}
    )
    with pytest.raises(ValidationError) as exc:
        curve.training_curves(missing, "s.yaml")
    assert str(exc.value) == ("s.yaml: profiles: the curve m/mtp/thinking-on/coding has no AL at "
                              "K 4: a training curve needs every K in 1..8")  # fmt: skip


def test_without_write_profile_a_k_past_8_fits_and_says_there_is_no_curve(
    run_cli, tmp_path: Path, points: Path
) -> None:
    run = _point(tmp_path / "mtp9", 4, k=9, al=3.0)
    out = tmp_path / "cost.yaml"
    code, stdout, err = run_cli("calibrate", points, "--acceptance-from", run, "-o", out)
    assert code == 0, err
    assert "note: no AL curve: K 9 lies outside 1..8" in stdout
    assert yaml.safe_load(out.read_text())["acceptance"]["curve"] is None


def test_written_files_are_made_as_open_would_make_them(tmp_path: Path) -> None:
    """Staged through a temporary file (mode 0600), each file still ends as the umask allows."""
    import os

    mask = os.umask(0o022)
    try:
        write_all([(tmp_path / "cost.yaml", "a: 1\n"), (tmp_path / "r.yaml", "b: 2\n")])
    finally:
        os.umask(mask)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cost.yaml", "r.yaml"]
    assert all((p.stat().st_mode & 0o777) == 0o644 for p in tmp_path.iterdir())
    assert (tmp_path / "r.yaml").read_text() == "b: 2\n"
