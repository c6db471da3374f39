"""compare's comparability checks on the differences that slipped through: forced against
natural acceptance, a streamed against a non-streamed run (and another endpoint), the
temperature, the categories of the requests sent, and two forced runs that report one AL but
realize another. Each test fails when its check stops looking at that difference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from comparekit import write_run
from speclens.runs import compare as cmp
from speclens.runs.compare_inputs import labels_for, read_inputs


def _compare(*paths: Path, differ: tuple[str, ...] = ()) -> dict[str, Any]:
    inputs = read_inputs(list(paths), labels_for(len(paths), []), [1] * len(paths))
    return cmp.compare(inputs, differ)


def _checks(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in result["pairs"][0]["checks"]}


def edit_summary(run: Path, settings: dict[str, Any] | None = None, **acceptance: Any) -> Path:
    """Overwrite fields of a run's summary.json: ``settings`` and the server's acceptance."""
    path = run / "summary.json"
    summary = orjson.loads(path.read_bytes())
    summary["settings"].update(settings or {})
    summary["server"]["acceptance"].update(acceptance)
    path.write_bytes(orjson.dumps(summary))
    return run


def edit_rows(run: Path, **fields: Any) -> Path:
    """Overwrite fields of every row of a run's records.jsonl."""
    path = run / "records.jsonl"
    rows = [orjson.loads(line) | fields for line in path.read_bytes().splitlines()]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return run


# --- acceptance: forced against natural -----------------------------------------------------------


def test_a_forced_run_and_a_natural_run_are_not_comparable(tmp_path: Path) -> None:
    """A server forced at AL 4.0 (K 3, every draft accepted) against a natural one that
    accepted nothing (AL 1.0): the acceptance check does not apply, the pair is not
    comparable, and the forced run is called forced."""
    a = write_run(tmp_path / "a", seed=1, k=3, rates=(1.0, 1.0, 1.0))
    b = write_run(tmp_path / "b", seed=2, k=3, rates=(0.0,), forced=False)
    result = _compare(a, b)
    pair, check = result["pairs"][0], _checks(result)["acceptance"]
    assert not check["ok"], check
    assert check["detail"].startswith("A forced (AL 4), B natural: a forced acceptance is not "
                                      "comparable with a natural one"), check  # fmt: skip
    assert "A AL 4.000" in check["detail"] and "B AL 1.000" in check["detail"]
    assert "natural acceptance: A" not in check["detail"]
    assert not pair["comparable"] and pair["label"].startswith("not comparable: acceptance (A ")
    histogram = _checks(result)["histogram"]
    assert "natural acceptance or" not in histogram["detail"], histogram
    assert "not required (A forced (AL 4), B natural)" in histogram["detail"], histogram


def test_forced_against_natural_stays_not_comparable_with_a_named_k(tmp_path: Path) -> None:
    """--differ k names a K difference, not a forced schedule against real drafting."""
    a = write_run(tmp_path / "a", seed=1, k=3, rates=(1.0, 1.0, 1.0))
    b = write_run(tmp_path / "b", seed=2, k=5, rates=(0.5,), forced=False)
    check = _checks(_compare(a, b, differ=("k",)))["acceptance"]
    assert not check["ok"] and check["detail"].startswith("A forced (AL 4), B natural"), check


def test_a_sweep_that_mixes_forced_and_natural_runs_is_said_so(tmp_path: Path) -> None:
    from comparekit import write_sweep

    a = write_sweep(tmp_path / "a", [(4, 0, {"seed": 1}), (4, 1, {"seed": 2, "forced": False})])
    b = write_run(tmp_path / "b", seed=3)
    check = _checks(_compare(a, b))["acceptance"]
    assert not check["ok"] and check["detail"].startswith("A mixed (forced and natural runs), "
                                                          "B forced (AL 3.78)"), check  # fmt: skip


# --- sampling: stream and endpoint, temperature ---------------------------------------------------


@pytest.mark.parametrize(
    ("a_settings", "b_settings", "evidence"),
    [
        ({"stream": True, "endpoint": "completions"}, {"stream": False, "endpoint": "completions"},
         "stream true, endpoint completions vs max_tokens 64, ignore_eos true, temperature 0, "
         "stream false, endpoint completions"),
        ({"stream": True, "endpoint": "completions"}, {"stream": True, "endpoint": "chat"},
         "endpoint completions vs max_tokens 64"),
        ({"stream": True, "endpoint": "chat"}, {}, "stream unknown, endpoint none"),
        ({}, {"temperature": 0.7}, "temperature 0, stream unknown, endpoint none vs max_tokens "
         "64, ignore_eos true, temperature 0.7"),
    ],
)  # fmt: skip
def test_sampling_checks_stream_endpoint_and_temperature(
    tmp_path: Path, a_settings: dict[str, Any], b_settings: dict[str, Any], evidence: str
) -> None:
    a = edit_summary(write_run(tmp_path / "a", seed=1), a_settings)
    b = edit_summary(write_run(tmp_path / "b", seed=2), b_settings)
    result = _compare(a, b)
    check = _checks(result)["sampling"]
    assert not check["ok"] and evidence in check["detail"], check
    assert result["pairs"][0]["label"].startswith("not comparable: sampling (")


def test_the_same_stream_and_endpoint_pass_and_are_stated(tmp_path: Path) -> None:
    same = {"stream": False, "endpoint": "chat", "temperature": 0.7}
    a = edit_summary(write_run(tmp_path / "a", seed=1), same)
    b = edit_summary(write_run(tmp_path / "b", seed=2), same)
    check = _checks(_compare(a, b))["sampling"]
    assert check == {"name": "sampling", "ok": True, "detail": "max_tokens 64, ignore_eos true, "
                     "temperature 0.7, stream false, endpoint chat in both"}  # fmt: skip


# --- prompts: the categories of the requests sent -------------------------------------------------


def test_the_same_indices_in_other_categories_are_other_prompts(tmp_path: Path) -> None:
    """One dataset digest, the same measured indices, but B's requests are of another category
    (a --category filter picks other rows at the same positions)."""
    a = write_run(tmp_path / "a", seed=1)
    b = edit_rows(write_run(tmp_path / "b", seed=2), category="coding")
    check = _checks(_compare(a, b))["prompts"]
    assert not check["ok"], check
    assert "different requests sent" in check["detail"] and "categories" in check["detail"]


# --- acceptance: forced runs that report one AL and realize another -------------------------------


def test_forced_runs_at_one_reported_al_whose_intervals_do_not_overlap(tmp_path: Path) -> None:
    """Both servers say forced AL 3.78; B's steps realize about 3.3 (it does not force what it
    says). The reported ALs agree, so only the realized intervals can tell."""
    a = write_run(tmp_path / "a", seed=1)
    b = edit_summary(write_run(tmp_path / "b", seed=2, rates=(1.0, 1.0, 0.3)),
                     acceptance_length=3.78)  # fmt: skip
    result = _compare(a, b)
    check = _checks(result)["acceptance"]
    assert not check["ok"], check
    assert check["detail"].startswith("forced: A AL 3.7") and "B AL 3.3" in check["detail"]
    assert check["detail"].endswith(": intervals do not overlap"), check
    assert result["pairs"][0]["label"].startswith("not comparable: acceptance (forced: ")
