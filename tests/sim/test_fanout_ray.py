"""Sweep points and a calibration's closed loops as Ray tasks on a real Ray cluster: a head
started with ``ray start --head --num-cpus 2`` on loopback (its own ports and temp directory),
joined with ``--ray 127.0.0.1:PORT``. The results are those of ``--jobs 2``, and once the
cluster is stopped no process of it (``raylet``, ``gcs_server``, workers) is left.

Ray is an optional dependency that the dev extra installs: without it these tests fail, they do
not skip."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from speclens.sim.closed_loop import Load, schedule
from speclens.sim.roofline import Efficiency

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: The K x concurrency grid: 16 points.
GRID = ["--sweep", "num_spec_tokens=1..4", "--sweep", "concurrency=1,2,4,8"]
SCENARIO = {
    "model": "kimi-k3",
    "hardware": "b300",
    "deployment": {"pools": [{"role": "mixed", "parallel": 8, "engine": {
        "speculative": {"method": "dspark", "num_spec_tokens": 7}, "max_num_seqs": 64}}]},
    "workload": {"category": "coding", "thinking": "on", "input_tokens": {"min": 64, "max": 256},
                 "output_tokens": {"min": 32, "max": 128}, "concurrency": 8, "requests": 32},
}  # fmt: skip
RAY = Path(sys.executable).parent / "ray"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(temp: Path) -> dict[str, str]:
    """Loopback only (Ray otherwise swaps 127.0.0.1 for the machine's address), no usage
    report, Ray's temp files under ``temp``, and token authentication with a token of the test's
    own (the head and every driver that joins it read it from the environment)."""
    return {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": str(temp), "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32)}  # fmt: skip


def _left(temp: Path, known: set[str] | None = None) -> list[str]:
    """Every process still running from this cluster (``pid comm``): its command line names
    ``temp``, or it descends from one that does (the raylet's agents retitle themselves
    ``ray::DashboardAgent`` and ``ray::RuntimeEnvAgent`` and outlived every run that matched
    the command line alone), or it is in ``known``, which each call adds what it found to (an
    agent whose raylet was killed is orphaned, no longer its descendant)."""
    parents, names, found = {}, {}, set(known or ())
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            names[proc.name] = (proc / "comm").read_text().strip()
            parents[proc.name] = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            continue
        if str(temp) in cmdline:
            found.add(proc.name)
    while children := {pid for pid, parent in parents.items() if parent in found} - found:
        found |= children
    if known is not None:
        known |= found
    return [f"{pid} {names[pid]}" for pid in sorted(found, key=int) if pid in names]


def _stop(temp: Path, known: set[str]) -> None:
    """Stop this cluster as ``ray stop --force`` does, SIGKILL to each of its processes, but to
    its own only (``ray stop`` would stop every Ray of this user on the machine); then wait up to
    10 s for them to go."""
    deadline = time.monotonic() + 10
    while (left := _left(temp, known)) and time.monotonic() < deadline:
        for entry in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.split(" ", 1)[0]), signal.SIGKILL)
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, dict[str, str]]]:
    """A Ray head on 127.0.0.1 with 2 CPUs: its address and the environment to join it with
    (which sends the files of any Ray started under it to the head's temp directory)."""
    import ray  # noqa: F401  (fails here, loudly, where the dev extra was not installed)

    # Short: Ray's socket paths (session_<date>_<time>_<us>_<pid>/sockets/plasma_store under it)
    # must fit in 107 bytes, and pytest's temp path took them over once its count passed 1,000.
    temp = Path(os.path.realpath(tempfile.mkdtemp(prefix="ray-")))
    env, known = _env(temp), set[str]()
    port = _free_port()
    ports = ["--port", str(port), "--dashboard-port", str(_free_port()),
             "--dashboard-agent-listen-port", str(_free_port()), "--metrics-export-port",
             str(_free_port())]  # fmt: skip
    start = [str(RAY), "start", "--head", "--num-cpus", "2", "--node-ip-address", "127.0.0.1",
             *ports, "--include-dashboard", "false", "--temp-dir", str(temp),
             "--disable-usage-stats"]  # fmt: skip
    try:
        done = subprocess.run(start, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"ray start failed:\n{done.stdout}\n{done.stderr}"
        running = [entry.split(" ", 1) for entry in _left(temp, known)]
        assert {"raylet", "gcs_server"} <= {comm for _, comm in running}  # ray stop's check
        yield f"127.0.0.1:{port}", env
    finally:
        _stop(temp, known)
        left = _left(temp, known)
        shutil.rmtree(temp, ignore_errors=True)
        assert not left, f"processes of the Ray cluster left after it stopped: {left}"


def _speclens(env: dict[str, str], *args: str | Path) -> str:
    done = subprocess.run([sys.executable, "-m", "speclens", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_k_by_concurrency_sweep_on_ray_gives_the_rows_of_jobs_2(
    cluster: tuple[str, dict[str, str]], tmp_path: Path, run_cli
) -> None:
    address, env = cluster
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    on_ray = _speclens(env, "sim", path, *GRID, "--json", "--ray", address)
    code, local, err = run_cli("sim", path, *GRID, "--json", "--jobs", "2")
    assert code == 0, err
    assert on_ray == local  # byte for byte: every figure to its last digit
    rows = json.loads(on_ray)
    assert len(rows) == 16
    assert [(r["sweep"]["num_spec_tokens"], r["sweep"]["concurrency"]) for r in rows] == [
        (k, c) for k in (1, 2, 3, 4) for c in (1, 2, 4, 8)
    ]
    assert len({r["makespan_s"] for r in rows}) == 16
    # joined, not started: one Ray session under the temp directory, the head's
    temp = Path(env["RAY_TMPDIR"])
    assert len([p for p in temp.rglob("session_2*") if p.is_dir()]) == 1


def _published(root: Path) -> Path:
    """A published sweep (aggregate-only points) of DeepSeek-V3 on 8 x H200 at c 2, 4, 16."""
    from speclens.sim import catalog
    from speclens.sim.roofline import Roofline

    roof = Roofline(catalog.model("deepseek-v3"), catalog.chip("h200"), 8,
                    efficiency=Efficiency(compute=0.3, memory=0.6, overhead=4e-3))  # fmt: skip
    for c in (2, 4, 16):
        settings = {"model": "deepseek-v3", "hardware": "h200", "engine": "sglang",
                    "precision": "fp8", "tensor_parallel": 8, "expert_parallel": 1,
                    "dp_attention": False, "gpus": 8, "disaggregated": False,
                    "input_tokens": {"min": 512, "max": 512},
                    "output_tokens": {"min": 128, "max": 128}, "concurrency": c,
                    "method": None, "num_spec_tokens": None, "date": "2026-05-27"}  # fmt: skip
        figures = schedule(Load(c, 512, 128)).figures(roof, 0.08, 8).summary_figures()
        point = root / "points" / f"c{c}"
        point.mkdir(parents=True)
        summary = {"aggregate_only": True, "settings": settings, "figures": figures}
        (point / "summary.json").write_text(json.dumps(summary))
    return root


def test_a_calibration_on_ray_fits_what_it_fits_in_one_process(
    cluster: tuple[str, dict[str, str]], tmp_path: Path, run_cli
) -> None:
    address, env = cluster
    points = _published(tmp_path / "published")
    on_ray = _speclens(env, "calibrate", points, "-o", tmp_path / "ray.yaml", "--json", "--ray",
                       address)  # fmt: skip
    code, here, err = run_cli("calibrate", points, "-o", tmp_path / "here.yaml", "--json")
    assert code == 0, err
    fits = []
    for out in (on_ray, here):
        document = json.loads(out[out.index("{") :])
        document["provenance"].pop("fitted_at")
        fits.append(document)
    assert fits[0] == fits[1]
    assert fits[0]["fit"]["tpot_error_median"] < 0.05
