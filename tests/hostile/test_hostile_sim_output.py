"""``speclens sim --output-dir`` given a directory that cannot take a run: one line naming the
option and the file, exit 2, before any simulation, and nothing written through a link.

Kills the mutation: ``run_output.output_problem`` returning None (no check up front): then a
file is "File exists", a planted summary.json or PNG link fails after the whole simulation with
exit 1, and records.jsonl's refusal is RecordStream's, not this line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

SMALL = {
    "model": "kimi-k3",
    "deployment": {"pools": [{"engine": {"speculative": {"method": "dspark", "num_spec_tokens": 7}}}]},
    "workload": {"category": "coding", "thinking": "on", "input_tokens": 16,
                 "output_tokens": 16, "concurrency": 4, "requests": 8},
}  # fmt: skip


def _scenario(tmp_path: Path, **workload: object) -> Path:
    data = {**SMALL, "workload": {**SMALL["workload"], **workload}}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _refused(run_cli, *args: object) -> str:
    code, out, err = run_cli("sim", *args)
    lines = err.splitlines()
    assert (code, len(lines)) == (2, 1), (code, err)
    assert "Traceback" not in err and "speclens sim" not in out  # no table: nothing simulated
    return lines[0]


def test_a_file_as_the_output_dir_is_refused(run_cli, tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.write_text("keep me")
    line = _refused(run_cli, _scenario(tmp_path), "--output-dir", target)
    assert line.startswith(f"command line: --output-dir: '{target}': is not a directory")
    assert target.read_text() == "keep me"


@pytest.mark.parametrize("name", ["records.jsonl", "summary.json", "latency_cdf.png"])
def test_a_planted_link_is_refused_and_never_written_through(
    run_cli, tmp_path: Path, name: str
) -> None:
    """records.jsonl would be refused by ``runs.files.open_new`` (O_NOFOLLOW); the others are
    refused up front too, not after the simulation has run."""
    out, victim = tmp_path / "out", tmp_path / "victim"
    out.mkdir()
    victim.write_text("keep me")
    (out / name).symlink_to(victim)
    line = _refused(run_cli, _scenario(tmp_path), "--output-dir", out)
    assert (
        line
        == f"command line: --output-dir: '{out}': {name} is a symbolic link (never written through)"
    )
    assert victim.read_text() == "keep me"
    assert not (out / "records.jsonl").exists() or (out / "records.jsonl").is_symlink()


def test_a_directory_in_place_of_a_file_is_refused(run_cli, tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "summary.json").mkdir(parents=True)
    line = _refused(run_cli, _scenario(tmp_path), "--output-dir", out)
    assert line == f"command line: --output-dir: '{out}': summary.json is not a regular file"


def test_a_parent_that_is_a_file_is_refused(run_cli, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "run"
    line = _refused(run_cli, _scenario(tmp_path), "--output-dir", out)
    assert line.startswith(f"command line: --output-dir: cannot write to '{out}")


def test_a_run_too_long_to_keep_per_request_is_refused(run_cli, tmp_path: Path) -> None:
    """The records hold every request's gaps until written: bounded before the run (the plain
    command's budget is far larger, its figures kept in constant memory)."""
    from speclens.sim.run_output import MAX_RECORDED_REQUEST_STEPS

    requests = MAX_RECORDED_REQUEST_STEPS // 16 + 1
    out = tmp_path / "out"
    line = _refused(run_cli, _scenario(tmp_path, requests=requests), "--output-dir", out)
    assert line.startswith(f"command line: --output-dir: {requests:,} requests x up to 16 output")
    assert f"over the {MAX_RECORDED_REQUEST_STEPS:,} a run keeps per request" in line
    assert not out.exists()


def test_a_sweep_into_a_file_or_onto_a_planted_link_is_refused(run_cli, tmp_path: Path) -> None:
    """A sweep checks its directory and every point's run directory before the first point."""
    target = tmp_path / "taken"
    target.write_text("keep me")
    args = ("--sweep", "concurrency=1,2", "--output-dir")
    line = _refused(run_cli, _scenario(tmp_path), *args, target)
    assert line.startswith(f"command line: --output-dir: '{target}': is not a directory")
    out, victim = tmp_path / "sweep", tmp_path / "victim"
    (out / "points" / "c2-r0").mkdir(parents=True)
    victim.write_text("keep me")
    (out / "points" / "c2-r0" / "summary.json").symlink_to(victim)
    line = _refused(run_cli, _scenario(tmp_path), *args, out)
    point = out / "points" / "c2-r0"
    assert (
        line
        == f"command line: --output-dir: '{point}': summary.json is a symbolic link (never written through)"
    )
    assert victim.read_text() == "keep me" and not (out / "sweep.json").exists()
