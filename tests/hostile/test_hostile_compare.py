"""speclens compare on bad input: one line naming the file, the field and what was expected, a
non-zero exit (2 usage, 1 an invalid file), never a traceback."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from comparekit import write_run, write_sweep


def _one_line(code: int, out: str, err: str, expected_code: int, *needles: str) -> None:
    assert code == expected_code, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err + out
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_a_directory_that_is_not_a_run(run_cli, tmp_path: Path) -> None:
    a = write_run(tmp_path / "a")
    (tmp_path / "empty").mkdir()
    _one_line(*run_cli("compare", a, tmp_path / "empty"), 2, "empty: not a run or sweep "
              "directory: no sweep.json, and summary.json and records.jsonl missing")  # fmt: skip


def test_a_path_that_is_not_a_directory(run_cli, tmp_path: Path) -> None:
    a = write_run(tmp_path / "a")
    _one_line(*run_cli("compare", a, tmp_path / "nowhere"), 2, "nowhere: not a directory")


def test_runs_of_different_models(run_cli, tmp_path: Path) -> None:
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b", model="other")
    _one_line(*run_cli("compare", a, b), 2, "runs of different models", "'dummy'", "'other'")


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda s: s["settings"].update(temperature="hot"),
         "summary.json: settings.temperature: expected a number >= 0, got 'hot'"),
        (lambda s: s["settings"].update(prompts_sha256="x"),
         "settings.prompts_sha256: expected null or 64 lowercase hex digits"),
        (lambda s: s.pop("figures"), "settings, figures: missing: not a speclens run summary"),
        (lambda s: s["figures"].update(duration_s=-1), "figures.duration_s: expected seconds"),
    ],
)  # fmt: skip
def test_a_tampered_summary(run_cli, tmp_path: Path, edit, needle: str) -> None:
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b")
    summary = orjson.loads((b / "summary.json").read_bytes())
    edit(summary)
    (b / "summary.json").write_bytes(orjson.dumps(summary))
    _one_line(*run_cli("compare", a, b), 1, str(b / "summary.json"), needle)


def test_an_unreadable_summary(run_cli, tmp_path: Path) -> None:
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b")
    (b / "summary.json").write_bytes(b"{not json")
    _one_line(*run_cli("compare", a, b), 1, "summary.json: not JSON")


def test_a_tampered_record(run_cli, tmp_path: Path) -> None:
    """A histogram that no longer sums to the record's verify steps: the record validator's."""
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b")
    lines = (b / "records.jsonl").read_bytes().splitlines()
    row = orjson.loads(lines[3])
    row["spec_decode_acceptance"]["num_spec_steps"] += 1
    lines[3] = orjson.dumps(row)
    (b / "records.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    _one_line(*run_cli("compare", a, b), 1, "records.jsonl: line 4: spec_decode_acceptance",
              "not a valid acceptance record")  # fmt: skip


def test_a_record_line_that_is_not_json(run_cli, tmp_path: Path) -> None:
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b")
    with (b / "records.jsonl").open("ab") as fh:
        fh.write(b"\x00\xff garbage\n")
    _one_line(*run_cli("compare", a, b), 1, "records.jsonl: line 25: not JSON")


def test_a_sweep_point_outside_the_sweep(run_cli, tmp_path: Path) -> None:
    a = write_run(tmp_path / "a")
    s = write_sweep(tmp_path / "s", [(1, 0, {})])
    sweep = orjson.loads((s / "sweep.json").read_bytes())
    sweep["points"][0]["dir"] = "../a"
    (s / "sweep.json").write_bytes(orjson.dumps(sweep))
    _one_line(*run_cli("compare", a, s), 1, "sweep.json: points[0].dir: expected a path inside "
              "the sweep, got '../a'")  # fmt: skip


def test_a_sweep_of_another_schema(run_cli, tmp_path: Path) -> None:
    a = write_run(tmp_path / "a")
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "sweep.json").write_bytes(b'{"schema": "other/9"}')
    _one_line(*run_cli("compare", a, tmp_path / "s"), 1,
              "sweep.json: schema: expected 'speclens.sweep/1', got 'other/9'")  # fmt: skip


def test_a_sweep_with_no_finished_point(run_cli, tmp_path: Path) -> None:
    a = write_run(tmp_path / "a")
    s = write_sweep(tmp_path / "s", [(1, 0, {})])
    sweep = orjson.loads((s / "sweep.json").read_bytes())
    sweep["points"][0]["status"] = "failed"
    (s / "sweep.json").write_bytes(orjson.dumps(sweep))
    _one_line(*run_cli("compare", a, s), 1, "no point finished (status ok) to compare")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--gpus", "0"], "command line: --gpus: expected an integer in [1, 4096], got 0"),
        (["--gpus", "1", "--gpus", "2", "--gpus", "3"], "--gpus: expected one value for every"),
        (["--differ", "model"], "command line: --differ: expected one of k, got 'model'"),
        (["--label", "x"], "--label: expected one per input (2), got 1"),
        (["--label", "x", "--label", "x"], "--label: expected distinct non-empty labels"),
    ],
)  # fmt: skip
def test_bad_options(run_cli, tmp_path: Path, args: list[str], needle: str) -> None:
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b")
    _one_line(*run_cli("compare", a, b, *args), 2, needle)


def test_one_input_is_a_usage_error(run_cli, tmp_path: Path) -> None:
    a = write_run(tmp_path / "a")
    _one_line(*run_cli("compare", a), 2, "expected two or more run or sweep directories")
