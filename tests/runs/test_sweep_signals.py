"""A sweep stops the servers it started, whatever ends it: SIGTERM or SIGHUP to ``speclens sweep``
had killed it on the spot and left its server running, reparented to PID 1 (in real use a vLLM
holding a GPU and a port); and a second Ctrl-C during ``Server.stop()``'s grace period skipped
the SIGKILL."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

import launch
from serverkit import wait_until
from speclens.runs import sweep_server

pytestmark = pytest.mark.integration
PY = sys.executable


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (state, ppid, pgrp, ...), or None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def alive(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def server_of(sweep_pid: int) -> int | None:
    """The sweep's server: its child that leads its own process group."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = stat_fields(int(entry.name))
            if fields and int(fields[1]) == sweep_pid and int(fields[2]) == int(entry.name):
                return int(entry.name)
    return None


@dataclass
class Swept:
    """A ``speclens sweep`` process and, once seen, the server it started."""

    proc: Any
    server: int | None = None

    def find(self) -> bool:
        if self.server is None:
            self.server = server_of(self.proc.pid)
        return self.server is not None


@contextlib.contextmanager
def sweep_process(tmp_path: Path, engine: dict[str, Any], *args: str) -> Iterator[Swept]:
    """``speclens sweep`` with one engine, as a process; whatever it leaves running is killed."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"engines": [engine], "axes": {"concurrency": [1]}}))
    command = [PY, "-m", "speclens", "sweep", "--sweep-file", str(path), "--model", "dummy",
               "--output-dir", str(tmp_path / "out"), *args]  # fmt: skip
    with (tmp_path / "stdout").open("wb") as so, (tmp_path / "stderr").open("wb") as se:
        # its signals at their defaults: under nohup a sweep rightly leaves SIGHUP ignored
        swept = Swept(
            subprocess.Popen(command, stdout=so, stderr=se, preexec_fn=launch.default_signals)
        )
    try:
        yield swept
    finally:
        if swept.proc.poll() is None:
            swept.proc.kill()
        if swept.server is not None:  # an orphan the sweep left: the test fails, nothing leaks
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(swept.server, signal.SIGKILL)


def stderr(tmp_path: Path) -> str:
    return (tmp_path / "stderr").read_text(errors="replace")[-3000:]


def assert_stopped(tmp_path: Path, swept: Swept, name: str) -> None:
    code = swept.proc.wait(timeout=60)
    server = swept.server
    assert server is not None
    assert wait_until(lambda: not alive(server), timeout=5), f"server {server} outlived the sweep"
    assert code == 130, (code, stderr(tmp_path))
    assert f"sweep: {name} received: stopped as on Ctrl-C" in stderr(tmp_path)
    points = json.loads((tmp_path / "out" / "sweep.json").read_text())["points"]
    assert [p["status"] for p in points] == ["interrupted"], points


CANNED = Path(__file__).parents[1] / "bench" / "canned_server.py"


@pytest.mark.timeout(120)
def test_sigterm_during_a_point_stops_the_server(tmp_path: Path) -> None:
    """A server under load (a fast canned one here; the end-to-end tier does this with a real
    ``speclens serve``): SIGTERM to the sweep ends the point as a Ctrl-C does, stops the
    server, writes the files, exits 130."""
    engine = {"name": "canned", "command": f"{PY} {CANNED} {{port}}", "startup_timeout_s": 60}
    with sweep_process(tmp_path, engine, "--duration", "120", "--backend", "openai") as swept:
        records = tmp_path / "out" / "points" / "canned-c1-r0" / "records.jsonl"

        def loaded() -> bool:
            return swept.find() and records.exists() and records.stat().st_size > 0

        assert wait_until(loaded, timeout=60), stderr(tmp_path)
        assert swept.server is not None and alive(swept.server)
        started = time.monotonic()
        swept.proc.send_signal(signal.SIGTERM)
        assert_stopped(tmp_path, swept, "SIGTERM")
        assert time.monotonic() - started < 30


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT])
def test_a_terminating_signal_while_the_server_starts_stops_it(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """The sweep is waiting for its server's health route when the terminal hangs up (SIGHUP) or
    SIGQUIT arrives: the server (here one that never answers) is stopped all the same."""
    sleeper = f"{PY} -c \"import time; print('starting', flush=True); time.sleep(120)\" {{port}}"
    engine = {"name": "slow", "command": sleeper, "startup_timeout_s": 120}
    with sweep_process(tmp_path, engine) as swept:
        log = tmp_path / "out" / "servers" / "slow.log"

        def starting() -> bool:
            return swept.find() and log.exists() and "starting" in log.read_text()

        assert wait_until(starting, timeout=60), stderr(tmp_path)
        swept.proc.send_signal(sig)
        assert_stopped(tmp_path, swept, sig.name)


def test_a_second_ctrl_c_during_the_stop_does_not_skip_the_sigkill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that ignores SIGTERM gets SIGKILL after the grace period, even when a Ctrl-C
    lands during that period: it is held and raised once the group is gone."""
    monkeypatch.setattr(sweep_server, "STOP_GRACE_S", 1.5)
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('up', flush=True); time.sleep(60)")  # fmt: skip
    log = tmp_path / "server.log"
    server = sweep_server.Server([PY, "-c", stubborn], {}, log, "http://127.0.0.1:9/health", 0.4)
    try:
        assert server.start() is not None  # never healthy: start gives up, the process runs
        assert server.proc is not None and wait_until(lambda: "up" in log.read_text(), timeout=30)
        pid = server.proc.pid
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            server.stop()
        timer.join()
        assert time.monotonic() - started >= 1.4  # the grace period ran to its end
        assert not alive(pid)
        assert server.proc.returncode == -signal.SIGKILL
    finally:
        if server.proc is not None and server.proc.poll() is None:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait()
