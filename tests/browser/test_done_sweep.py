"""``speclens sweep`` with server axes, end to end (the end-to-end tier: five server start-ups,
each a fresh interpreter the sweep starts itself): a natural sweep over K written as the golden
curve, then that curve forced back at each K beside a server that cannot start."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

import launch

pytestmark = pytest.mark.integration
PY = sys.executable
#: Tiny runs: a point costs its requests and bench's report files.
LOAD = ["--model", "dummy", "--max-tokens", "16", "--ignore-eos", "--backend", "openai"]


def sweep(*args: str | Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return launch.run([PY, "-m", "speclens", "sweep", *map(str, args)], timeout=timeout)


def document(root: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((root / "sweep.json").read_text())
    return data


def pooled_al(root: Path) -> dict[int, float]:
    """Per K, 1 + accepted drafts / verify steps over the measured, successful requests of the
    sweep's points that finished ok, read from their records.jsonl (one category here)."""
    sums: dict[int, list[int]] = {}
    for point in document(root)["points"]:
        k = point["settings"]["num_speculative_tokens"]
        if point["status"] != "ok":
            continue
        for line in (root / point["dir"] / "records.jsonl").read_text().splitlines():
            row = json.loads(line)
            spec = row.get("spec_decode_acceptance")
            if row["warmup"] or not row["success"] or not spec:
                continue
            cell = sums.setdefault(k, [0, 0])
            cell[0] += spec["num_accepted_draft_tokens"]
            cell[1] += spec["num_spec_steps"]
    return {k: round(1 + a / n, 4) for k, (a, n) in sums.items()}


def _engine(name: str, command: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "command": command, "startup_timeout_s": 180, **extra}


@pytest.mark.slow
@pytest.mark.timeout(600)  # five server start-ups, each importing torch
def test_server_axes_golden_curve_then_forced_back_at_each_k(tmp_path: Path) -> None:
    """A natural n-gram sweep over K 2 and 4 (the dummy model, real drafting) writes the curve as
    a measured profile set; a second sweep forces that curve back in the sim executor through
    {forcing} (``profiles resolve --emit vllm``) and realizes each K's AL; a server whose
    command exits 1 fails its points with its log and the sweep goes on (exit 3)."""
    serve = f"{PY} -m speclens serve --port {{port}} --per-request-spec-decode-stats summary"
    natural = {
        "engines": [_engine("speclens", f"{serve} --method ngram --num-speculative-tokens {{k}}")],
        "axes": {"num_speculative_tokens": [2, 4], "concurrency": [2]},
    }
    (tmp_path / "natural.yaml").write_text(yaml.safe_dump(natural))
    registry = tmp_path / "registry"
    (registry / "acceptance").mkdir(parents=True)
    curve_path = registry / "acceptance" / "curve.yaml"
    first = sweep("--sweep-file", tmp_path / "natural.yaml", *LOAD, "--num-requests", "6",
                  "--output-dir", tmp_path / "natural", "--write-profile", curve_path)  # fmt: skip
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    curve = yaml.safe_load(curve_path.read_text())
    by_k = {p["num_spec_tokens"]: p for p in curve["profiles"]}
    assert sorted(by_k) == [2, 4]
    for k, profile in by_k.items():
        assert profile["method"] == "measured" and profile["speculative_method"] == "ngram"
        prov = profile["provenance"]
        assert prov["run"] == str(tmp_path / "natural") and prov["prompts"] == 6
        assert prov["engine_image"].startswith("speclens==") and prov["sampling"]["max_tokens"] == 16  # fmt: skip
        assert 1.0 < profile["acceptance_length"] <= k + 1
        log = tmp_path / "natural" / "points" / f"speclens-k{k}-c2-r0" / "server.log"
        assert log.is_file()
    # the curve's AL is the natural sweep's own: pooled over its records, not just self-consistent
    assert {k: p["acceptance_length"] for k, p in by_k.items()} == pooled_al(tmp_path / "natural")

    forced = {
        "engines": [
            _engine("sim", f"{serve} --executor sim {{forcing}}", emit="vllm", method="ngram"),
            _engine(
                "broken", f"{PY} -c \"print('cannot start: boom'); raise SystemExit(1)\" {{port}}"
            ),
        ],
        "axes": {
            "num_speculative_tokens": [2, 4],
            "concurrency": [4],
            "acceptance_profile": {
                "model": "dummy",
                "method": "ngram",
                "thinking": "off",
                "category": "random",
            },
        },
    }
    (tmp_path / "forced.yaml").write_text(yaml.safe_dump(forced))
    out = tmp_path / "forced"
    second = sweep("--sweep-file", tmp_path / "forced.yaml", *LOAD, "--num-requests", "16",
                   "--registry", registry, "--output-dir", out)  # fmt: skip
    assert second.returncode == 3, second.stdout[-3000:] + second.stderr[-3000:]
    data = document(out)
    assert data["kind"] == "server" and data["axes"]["engine"] == ["sim", "broken"]
    points = {p["id"]: p for p in data["points"]}
    for k in (2, 4):
        point = points[f"sim-k{k}-al{by_k[k]['acceptance_length']:g}-c4-r0"]
        assert point["status"] == "ok", point
        summary = json.loads((out / point["dir"] / "summary.json").read_text())
        assert summary["server"]["acceptance"]["num_speculative_tokens"] == k
        (stats,) = [s for s in data["stats"] if s["engine"] == "sim" and s["settings"]["num_speculative_tokens"] == k]  # fmt: skip
        al = stats["figures"]["realized_al"]
        se = (al["high"] - al["low"]) / 3.92
        assert abs(al["mean"] - by_k[k]["acceptance_length"]) <= 4 * se + 1e-3, (k, al)
        broken = points[f"broken-k{k}-al{by_k[k]['acceptance_length']:g}-c4-r0"]
        assert broken["status"] == "failed" and broken["exit_code"] == 3
        assert "exited with code 1 before" in broken["error"] and "boom" in broken["error"]
        assert "boom" in (out / broken["dir"] / "server.log").read_text()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _server_of(sweep_pid: int) -> int | None:
    """The sweep's server: its child that leads its own process group."""
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and int(fields[1]) == sweep_pid and fields[2] == entry.name:
            return int(entry.name)
    return None


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_terminated_sweep_stops_its_real_server(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM or SIGHUP to ``speclens sweep`` while a real ``speclens serve`` (the dummy model)
    serves a point: the sweep stops that server (it had been left running, reparented to PID 1),
    keeps the cut point and exits 130."""
    serve = f"{PY} -m speclens serve --port {{port}} --method ngram --num-speculative-tokens 2"
    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text(yaml.safe_dump({
        "engines": [_engine("dummy", serve)],
        "axes": {"concurrency": [1, 2]},
    }))  # fmt: skip
    out = tmp_path / "out"
    command = [PY, "-m", "speclens", "sweep", "--sweep-file", str(sweep_file), *LOAD,
               "--duration", "120", "--output-dir", str(out)]  # fmt: skip
    with (tmp_path / "stdout").open("wb") as so, (tmp_path / "stderr").open("wb") as se:
        # its signals at their defaults: under nohup a sweep rightly leaves SIGHUP ignored
        proc = subprocess.Popen(command, stdout=so, stderr=se, preexec_fn=launch.default_signals)
    server = None
    try:
        records = out / "points" / "dummy-c1-r0" / "records.jsonl"
        deadline = time.monotonic() + 180
        while (
            time.monotonic() < deadline
            and proc.poll() is None
            and not (records.exists() and records.stat().st_size)
        ):
            server = server or _server_of(proc.pid)
            time.sleep(0.1)
        assert server is not None and _alive(server), (tmp_path / "stderr").read_text()[-3000:]
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
        deadline = time.monotonic() + 5
        while _alive(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server), f"the server {server} outlived the sweep"
        assert code == 130, (tmp_path / "stderr").read_text()[-3000:]
        points = document(out)["points"]
        assert [p["status"] for p in points] == ["interrupted"], points
        assert (out / "points" / "dummy-c1-r0" / "server.log").is_file()
    finally:
        if proc.poll() is None:
            proc.kill()
        if server is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(server, signal.SIGKILL)
