"""``speclens sweep`` against inputs that broke it: a concurrency below one request per worker on
any point of the axis, a sweep file asking for 9 x 10^8 points, and server logs with symbolic
links planted where they are written."""

from __future__ import annotations

import json
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from speclens.cli import app
from speclens.runs import sweep_points

PY = sys.executable


def sweep(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["sweep", "--model", "dummy", *map(str, args)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def one_line_refusal(code: int, output: str, out: Path) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, output
    assert "Traceback" not in output
    assert not (out / "sweep.json").exists()  # refused before anything ran
    return lines[0]


# ------------------------------------------------------------ item 8: workers x concurrency
@pytest.mark.parametrize("axis", ["4,1", "8,2,16"])
def test_every_concurrency_on_the_axis_needs_one_request_per_worker(
    tmp_path: Path, axis: str
) -> None:
    """--workers 4 --concurrency 4,1: the point labelled 1 ran 13 requests at once (workers 1-3
    got a share of 0, "no limit"), since only the first value was checked."""
    out = tmp_path / "out"
    code, output = sweep("--url", "http://127.0.0.1:9", "--workers", "4", "--concurrency", axis,
                         "--output-dir", out)  # fmt: skip
    low = ", ".join(v for v in axis.split(",") if int(v) < 4)
    assert one_line_refusal(code, output, out) == (
        "command line: --concurrency: expected at least one request per worker and shard "
        f"(4: --workers 4), got {low}"
    )


@pytest.mark.parametrize("own", [False, True])
def test_a_sweep_files_concurrency_axis_is_checked_too(tmp_path: Path, own: bool) -> None:
    axes = {"concurrency": [2, 1]}
    engine = {"name": "e", "command": f"{PY} -c pass {{port}}"}
    document = {"engines": [{**engine, "axes": axes}]} if own else {"engines": [engine], "axes": axes}  # fmt: skip
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(document))
    out = tmp_path / "out"
    code, output = sweep("--sweep-file", path, "--workers", "2", "--output-dir", out)
    where = "engines[0].axes.concurrency" if own else "axes.concurrency"
    assert one_line_refusal(code, output, out) == (
        f"{path}: {where}: expected at least one request per worker and shard (2: --workers 2), got 1"
    )


# ----------------------------------------------------------------- item 9: too many points
def test_a_sweep_file_of_nine_hundred_million_points_is_one_line(tmp_path: Path) -> None:
    """K 64 x AL 5,000 x concurrency 2,812 x 1 round: a MemoryError traceback while the points
    were planned. Now counted from the axes' sizes and refused before any plan, in bounded time
    and memory."""
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump({
        "engines": [{"name": "e", "command": f"{PY} -c pass {{port}} {{k}} {{al}}"}],
        "axes": {
            "num_speculative_tokens": list(range(1, 65)),
            "acceptance_length": [1 + i / 5_000 for i in range(5_000)],
            "concurrency": list(range(1, 2813)),
        },
    }))  # fmt: skip
    out = tmp_path / "out"
    tracemalloc.start()
    started = time.monotonic()
    try:
        code, output = sweep("--sweep-file", path, "--output-dir", out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert one_line_refusal(code, output, out) == (
        f"{path}: axes: 899,840,000 points (engines[0] e: 64 K x 5000 AL x 2812 loads x 1 rounds): "
        f"expected at most {sweep_points.MAX_POINTS:,}"
    )
    assert time.monotonic() - started < 30 and peak < 200 * 2**20, peak


def test_a_load_axis_times_rounds_over_the_bound(tmp_path: Path) -> None:
    out = tmp_path / "out"
    values = ",".join(str(c) for c in range(1, 102))
    code, output = sweep("--url", "http://127.0.0.1:9", "--concurrency", values, "--rounds", "100",
                         "--output-dir", out)  # fmt: skip
    assert one_line_refusal(code, output, out) == (
        "command line: --concurrency: 10,100 points (101 loads x 100 rounds): expected at most 10,000"
    )


# ------------------------------------------------------------- item 11: planted symlinks
def test_server_logs_are_never_written_through_planted_links(tmp_path: Path) -> None:
    """servers/<setting>.log and points/<id>/server.log were opened with a plain open(): a link
    planted at either sent the server's output to any file the user can write. Both are refused
    like every other run file; the files they point at are untouched."""
    victim, other = tmp_path / "victim.txt", tmp_path / "other.txt"
    victim.write_text("precious\n")
    other.write_text("precious too\n")
    path = tmp_path / "s.yaml"
    command = f"{PY} -c \"print('server output')\" {{port}} {{k}}"
    path.write_text(yaml.safe_dump({
        "engines": [{"name": "e", "command": command, "startup_timeout_s": 20}],
        "axes": {"num_speculative_tokens": [2, 3], "concurrency": [1]},
    }))  # fmt: skip
    out = tmp_path / "out"
    (out / "servers").mkdir(parents=True)
    (out / "servers" / "e-k2.log").symlink_to(victim)
    (out / "points" / "e-k3-c1-r0").mkdir(parents=True)
    (out / "points" / "e-k3-c1-r0" / "server.log").symlink_to(other)
    code, output = sweep("--sweep-file", path, "--output-dir", out)
    assert code == 3, output
    assert victim.read_text() == "precious\n" and other.read_text() == "precious too\n"
    points = {p["id"]: p for p in json.loads((out / "sweep.json").read_text())["points"]}
    assert points["e-k2-c1-r0"]["status"] == "failed"
    assert points["e-k2-c1-r0"]["error"] == (
        f"{out / 'servers' / 'e-k2.log'}: the server log cannot be written: "
        "is a symbolic link (never written through)"
    )
    # the K 3 server started and exited: its own log is written, the planted copy refused
    assert "server output" in (out / "servers" / "e-k3.log").read_text()
    assert "exited with code 0 before" in points["e-k3-c1-r0"]["error"]
    assert f"{out / 'points' / 'e-k3-c1-r0' / 'server.log'}: cannot copy the server log" in output
    assert (out / "points" / "e-k3-c1-r0" / "server.log").is_symlink()
