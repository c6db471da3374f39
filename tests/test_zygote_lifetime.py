"""A test process killed mid-run leaves no process behind: the start-up server (``zygote.py``)
that forks its ``python -m speclens`` commands, and every command it forked, go with it.

The test process here is a child that starts a server through ``launch.popen`` (forked by the
start-up server) and is then killed with SIGKILL, which runs none of its clean-up. With
``held``, a fork of it that outlives it keeps the start-up server's stdin open, so no EOF tells
the server its test process has gone: only its parent's death does."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serverkit import child_env, free_port, serve_command

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sys.platform != "linux", reason="the start-up server is Linux's"),
]

TESTS = Path(__file__).resolve().parent
#: The test process: a server forked by the start-up server, the pids on one line, then a wait
#: for the kill.
TEST_PROCESS = """
import json, os, sys, time
import launch

out = open(sys.argv[1], "wb")
server = launch.popen(json.loads(sys.argv[2]), stdout=out, stderr=out, env=json.loads(sys.argv[3]))
assert isinstance(server, launch.Child), "not forked by the start-up server"
(zygote,) = launch._zygotes.values()
holder = 0
if sys.argv[4] == "held":
    holder = os.fork()
    if holder == 0:  # holds every descriptor of the test process, its pipes to the server too
        time.sleep(300)
        os._exit(0)
print(json.dumps({"zygote": zygote.proc.pid, "server": server.pid, "holder": holder}), flush=True)
time.sleep(300)
"""
#: How long the processes have to go once the test process is killed (the server polls its
#: parent every 50 ms and gives what it forked up to 5 s to go).
GONE_WITHIN_S = 30.0


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _left(pids: list[int], within_s: float) -> list[int]:
    """Which of ``pids`` still run after ``within_s`` seconds (sooner where none does)."""
    deadline = time.monotonic() + within_s
    while (left := [p for p in pids if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.parametrize(
    "killed", ["test process", "test process, its pipes held", "start-up server"]
)
def test_a_killed_test_process_leaves_no_start_up_server_and_no_command(
    tmp_path: Path, killed: str
) -> None:
    """SIGKILL to the test process: the start-up server and the server it forked go. SIGKILL
    to the start-up server itself (which cleans nothing up): the server it forked goes."""
    env = {**child_env(), "PYTHONPATH": str(TESTS)}
    command = serve_command([], free_port())
    held = "held" if "held" in killed else "not held"
    test_process = subprocess.Popen(
        [sys.executable, "-c", TEST_PROCESS, str(tmp_path / "server.log"), json.dumps(command),
         json.dumps(env), held],
        stdout=subprocess.PIPE, env=env, start_new_session=True,
    )  # fmt: skip
    pids: dict[str, int] = {}
    try:
        assert test_process.stdout is not None
        line = test_process.stdout.readline()
        assert line, f"the test process ended with {test_process.wait(timeout=60)}"
        pids = json.loads(line)
        assert _running(pids["zygote"]) and _running(pids["server"]), (
            tmp_path / "server.log"
        ).read_text(errors="replace")[-2000:]
        if killed == "start-up server":
            os.kill(pids["zygote"], signal.SIGKILL)
            gone = [pids["server"]]
        else:
            test_process.kill()
            test_process.wait(timeout=60)
            gone = [pids["zygote"], pids["server"]]
        left = _left(gone, GONE_WITHIN_S)
        assert not left, f"still running {GONE_WITHIN_S:.0f} s after the {killed} was killed: " \
            f"{left} of {pids}"  # fmt: skip
    finally:
        test_process.kill()
        for pid in (pids.get("holder"), pids.get("server"), pids.get("zygote")):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


#: A test process whose start-up server stops (SIGSTOP) before its second command: the fork
#: fails within ``FORK_TIMEOUT_S`` (here 3 s) and says why.
STOPPED_SERVER = """
import json, os, signal, sys, time
import launch

launch.FORK_TIMEOUT_S = 3.0
command, env = json.loads(sys.argv[1]), json.loads(sys.argv[2])
first = launch.popen(command, env=env)
assert isinstance(first, launch.Child), "not forked by the start-up server"
first.wait(timeout=120)
(zygote,) = launch._zygotes.values()
print(zygote.proc.pid, flush=True)
os.kill(zygote.proc.pid, signal.SIGSTOP)
start = time.monotonic()
try:
    launch.popen(command, env=env)
    print("forked")
except RuntimeError as exc:
    print(f"{time.monotonic() - start:.1f} {exc}")
finally:
    os.kill(zygote.proc.pid, signal.SIGKILL)
"""


def test_a_start_up_server_that_stops_answering_fails_the_fork_in_bounded_time(
    tmp_path: Path,
) -> None:
    env = {**child_env(), "PYTHONPATH": str(TESTS)}
    command = [sys.executable, "-m", "speclens", "--version"]
    out = tmp_path / "stdout"
    with out.open("wb") as stdout:
        test_process = subprocess.Popen(
            [sys.executable, "-c", STOPPED_SERVER, json.dumps(command), json.dumps(env)],
            env=env, stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        code = test_process.wait(timeout=120)
        assert code == 0, out.read_text(errors="replace")[-2000:]
    finally:
        test_process.kill()
        lines = out.read_text().split("\n")
        if lines[0].isdigit():  # the stopped server, whatever became of the test process
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(lines[0]), signal.SIGKILL)
    took, message = lines[1].split(" ", 1)
    assert message == "the tests' start-up server forked nothing in 3 s"
    assert 3.0 <= float(took) < 30.0


#: A test whose fixture's teardown leaves a mark, and which waits to be stopped.
STOPPED_TEST = """
import time
from pathlib import Path

import pytest


@pytest.fixture
def marked():
    yield
    Path("torn-down").write_text("yes")


def test_waits(marked):
    Path("started").write_text("yes")
    time.sleep(300)
"""


def test_a_sigterm_to_the_test_run_tears_its_fixtures_down(tmp_path: Path) -> None:
    (tmp_path / "test_stopped.py").write_text(STOPPED_TEST)
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
         "test_stopped.py"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "started").exists() and time.monotonic() < deadline:
            assert run.poll() is None, "the test run ended before its test started"
            time.sleep(0.2)
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=60)
    finally:
        run.kill()
    assert (tmp_path / "torn-down").exists(), "the fixture was not torn down"
