"""speclens compare on pairs it once called comparable, exit 0: a server forced at AL 4.0
against a natural one at AL 1.0 (the forced one labelled natural), and a streamed run against a
--no-stream run of the same server. Each exits 1, says why, and tags every delta; a summary
whose stream or endpoint is not a setting is an invalid file."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from comparekit import write_run

#: The labels these tests read (default labels are the directory names).
AB = ("--label", "A", "--label", "B")


def _settings(run: Path, **settings: object) -> Path:
    path = run / "summary.json"
    summary = orjson.loads(path.read_bytes())
    summary["settings"].update(settings)
    path.write_bytes(orjson.dumps(summary))
    return run


def _tagged(out: str) -> None:
    lines = [line for line in out.splitlines() if "concurrency 4:" in line]
    assert lines and all(line.strip().startswith("NOT COMPARABLE: ") for line in lines), out


def test_forced_at_4_against_natural_at_1_exits_1(run_cli, tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", seed=1, k=3, rates=(1.0, 1.0, 1.0))
    b = write_run(tmp_path / "b", seed=2, k=3, rates=(0.0,), forced=False)
    code, out, err = run_cli("compare", a, b, *AB)
    assert code == 1, out + err
    assert "A vs B: not comparable: acceptance (A forced (AL 4), B natural: " in out
    assert "FAIL acceptance: A forced (AL 4), B natural: a forced acceptance is not comparable" \
        in out  # fmt: skip
    assert "natural acceptance: A AL 4" not in out
    _tagged(out)


def test_a_streamed_run_against_a_no_stream_run_exits_1(run_cli, tmp_path: Path) -> None:
    a = _settings(write_run(tmp_path / "a", seed=1), stream=True, endpoint="completions")
    b = _settings(write_run(tmp_path / "b", seed=2), stream=False, endpoint="completions")
    code, out, err = run_cli("compare", a, b)
    assert code == 1, out + err
    assert "FAIL sampling: " in out and "stream true" in out and "stream false" in out
    _tagged(out)


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        ({"stream": "yes"}, "settings.stream: expected null or true or false, got 'yes'"),
        ({"endpoint": 7}, "settings.endpoint: expected null or an endpoint name, got 7"),
        ({"endpoint": "x" * 65}, "settings.endpoint: expected null or an endpoint name"),
    ],
)  # fmt: skip
def test_a_tampered_stream_or_endpoint(run_cli, tmp_path: Path, settings, needle: str) -> None:
    a = write_run(tmp_path / "a")
    b = _settings(write_run(tmp_path / "b"), **settings)
    code, out, err = run_cli("compare", a, b)
    assert code == 1 and "Traceback" not in out + err, (code, out, err)
    (line,) = err.strip().splitlines()
    assert str(b / "summary.json") in line and needle in line, line
