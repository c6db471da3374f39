"""What makes two published InferenceX points the same point, and the same configuration: the
model is part of a configuration (a ``dsr1`` point and a ``gptoss120b`` point with the rest equal
had become one sweep), and NaN, which InferenceX's files may hold in a metric the summary does
not read, counts as equal to NaN when copies of one point are merged, never to a number."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from publishedkit import metrics, point, write_points
from speclens.runs import published_read as pr
from speclens.runs.rundir import InputError


def read(tmp_path: Path, *points: dict, name: str = "b.json") -> list[pr.Published]:
    return pr.read_inferencex(write_points(tmp_path / name, list(points), nan=True))


# ----------------------------------------------------------------- the model in the name
def test_the_model_is_part_of_a_configuration(tmp_path):
    pts = read(tmp_path, point(conc=4), point(conc=8, model="gptoss120b"))
    groups = pr.configurations(pts)
    assert {name: [s["settings"]["model"] for s in runs] for name, runs in groups.items()} == {
        "dsr1-mi355x-sglang-fp8-1024x1024-tp8-nomtp-2026-05-27": ["deepseek-r1"],
        "gptoss120b-mi355x-sglang-fp8-1024x1024-tp8-nomtp-2026-05-27": ["gptoss120b"],
    }


def test_two_models_at_one_concurrency_are_two_configurations(tmp_path):
    pts = read(tmp_path, point(conc=4), point(conc=4, model="gptoss120b"))
    groups = pr.configurations(pts)
    assert sorted(groups) == [pr.configuration_name(p.data) for p in pts]
    assert all(len(runs) == 1 for runs in groups.values())


def test_the_import_writes_a_sweep_per_model(run_cli, tmp_path):
    source = write_points(tmp_path / "bench.json", [point(conc=4), point(conc=8, model="gptoss120b")])  # fmt: skip
    out = tmp_path / "out"
    code, stdout, stderr = run_cli("import", "inferencex", source, "--output-dir", out)
    assert code == 0, stderr
    assert stdout.splitlines()[:2] == [
        "dsr1-mi355x-sglang-fp8-1024x1024-tp8-nomtp-2026-05-27: 1 point (concurrency 4)",
        "gptoss120b-mi355x-sglang-fp8-1024x1024-tp8-nomtp-2026-05-27: 1 point (concurrency 8)",
    ]
    assert len([p for p in out.iterdir()]) == 2


# ------------------------------------------------------------------- NaN in duplicates
def with_nan(**over) -> dict:
    """A point whose unread metric ``std_tpot`` is NaN (as Python's json writes it)."""
    return point(metrics=metrics() | {"std_tpot": float("nan")}, **over)


def test_copies_that_both_hold_nan_are_one_point(tmp_path):
    a = read(tmp_path, with_nan(), name="a.json")
    b = read(tmp_path, with_nan(), point(conc=8), name="b.json")
    kept, merged = pr.dedupe(a + b)
    assert merged == 1 and [p.data["conc"] for p in kept] == [4, 8]
    assert math.isnan(kept[0].data["metrics"]["std_tpot"])


@pytest.mark.parametrize(
    ("first", "second"), [(float("nan"), 0.5), (0.5, float("nan")), (float("nan"), None)]
)
def test_nan_is_the_same_only_as_nan(tmp_path, first, second):
    a = read(tmp_path, point(metrics=metrics() | {"std_tpot": first}), name="a.json")
    b = read(tmp_path, point(metrics=metrics() | {"std_tpot": second}), name="b.json")
    with pytest.raises(InputError) as caught:
        pr.dedupe(a + b)
    (line,) = caught.value.lines
    assert line.startswith(f"{tmp_path / 'b.json'}: [0].metrics.std_tpot: expected {first!r} as the same point")  # fmt: skip


def test_nan_in_a_published_key_still_identifies_copies(tmp_path):
    """A NaN in a key the identity is made of (every key but metrics and image): the copies
    are one point."""
    a = read(tmp_path, point(score=float("nan")), name="a.json")
    b = read(tmp_path, point(score=float("nan")), name="b.json")
    kept, merged = pr.dedupe(a + b)
    assert (len(kept), merged) == (1, 1)


def test_the_import_merges_copies_holding_nan(run_cli, tmp_path):
    a = write_points(tmp_path / "a.json", [with_nan()], nan=True)
    b = write_points(tmp_path / "b.json", [with_nan(), with_nan(conc=8)], nan=True)
    code, stdout, stderr = run_cli("import", "inferencex", a, b, "--output-dir", tmp_path / "out")
    assert code == 0, stderr
    assert stdout.splitlines()[-1].endswith("2 points (of 3 read, 1 duplicate merged) into " + str(tmp_path / "out"))  # fmt: skip
