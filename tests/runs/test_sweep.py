"""``speclens sweep`` end to end on loopback: load axes against one forced sim server; Ctrl-C.
Server axes (five server start-ups) are in the end-to-end tier: tests/browser/test_done_sweep.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import launch
from serverkit import FORCED, ServerProcess, running_server, wait_until

pytestmark = pytest.mark.integration
PY = sys.executable
#: Tiny runs: a point costs its requests and bench's report files.
LOAD = ["--model", "dummy", "--max-tokens", "16", "--ignore-eos", "--backend", "openai"]


@pytest.fixture(scope="module")
def sim_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(
        tmp_path_factory.mktemp("sweep-sim"), *FORCED, "--executor", "sim",
        "--per-request-spec-decode-stats", "summary",
    ) as server:  # fmt: skip
        yield server


def sweep(*args: str | Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return launch.run([PY, "-m", "speclens", "sweep", *map(str, args)], timeout=timeout)


def document(root: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((root / "sweep.json").read_text())
    return data


def test_load_sweep_writes_every_point_and_its_statistics(
    sim_server: ServerProcess, tmp_path: Path
) -> None:
    out = tmp_path / "sweep"
    done = sweep("--url", sim_server.url, *LOAD, "--concurrency", "1,2", "--rounds", "2",
                 "--num-requests", "4", "--output-dir", out)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = document(out)
    assert data["schema"] == "speclens.sweep/1" and data["kind"] == "load"
    assert data["axes"] == {"concurrency": [1, 2]} and data["rounds"] == 2
    assert [p["id"] for p in data["points"]] == ["c1-r0", "c1-r1", "c2-r0", "c2-r1"]
    for point in data["points"]:
        assert point["status"] == "ok" and point["exit_code"] == 0 and point["error"] is None
        summary = json.loads((out / point["dir"] / "summary.json").read_text())
        assert summary["settings"]["concurrency"] == point["settings"]["concurrency"]
        assert (out / point["dir"] / "records.jsonl").read_text().count("\n") == 4
    assert [s["settings"]["concurrency"] for s in data["stats"]] == [1, 2]
    for stats in data["stats"]:
        assert stats["rounds_ok"] == 2
        tput = stats["figures"]["output_tokens_per_s"]
        assert tput["method"] == "t" and tput["n"] == 2 and tput["low"] <= tput["mean"]
        al = stats["figures"]["realized_al"]
        assert al["n"] == 8 and abs(al["mean"] - 3.78) <= max(4 * (al["high"] - al["low"]) / 3.92, 0.05)  # fmt: skip
    rows = (out / "sweep.csv").read_text().splitlines()
    assert len(rows) == 5 and rows[0].startswith("id,engine,concurrency,request_rate")
    assert "realized_al_mean" in rows[0] and rows[1].startswith("c1-r0,,1,,,,0,ok,0,")


@pytest.mark.timeout(240)
def test_ctrl_c_keeps_every_finished_point_and_exits_130(
    sim_server: ServerProcess, tmp_path: Path
) -> None:
    out = tmp_path / "sweep"
    command = [PY, "-m", "speclens", "sweep", "--url", sim_server.url, *LOAD, "--duration", "3",
               "--concurrency", "1,2,3,4", "--output-dir", str(out)]  # fmt: skip
    with (tmp_path / "stdout").open("wb") as so, (tmp_path / "stderr").open("wb") as se:
        proc = launch.popen(command, stdout=so, stderr=se)

    def finished() -> bool:
        """A point is ok and the next one's load is under way (its first records are written:
        a Ctrl-C in its set-up, before bench's load phase, would leave it no report)."""
        try:
            points = document(out)["points"]
        except (OSError, ValueError):
            return False
        recorded = {p["dir"] for p in points}
        running = [d for d in (out / "points").iterdir() if f"points/{d.name}" not in recorded]
        records = [d / "records.jsonl" for d in running if (d / "records.jsonl").exists()]
        return any(p["status"] == "ok" for p in points) and any(r.stat().st_size for r in records)

    try:
        assert wait_until(finished, timeout=120), (tmp_path / "stderr").read_text()[-3000:]
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        code = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130, (tmp_path / "stderr").read_text()[-3000:]
    assert time.monotonic() - started < 60
    statuses = [p["status"] for p in document(out)["points"]]
    assert statuses[-1] == "interrupted" and set(statuses[:-1]) == {"ok"}, statuses
    assert len(statuses) < 4
    for point in document(out)["points"]:
        # the cut point has its report when its run had begun (a Ctrl-C can land in its probe)
        begun = (out / point["dir"] / "records.jsonl").exists()
        if point["status"] == "ok" or begun:
            assert (out / point["dir"] / "summary.json").is_file(), point
