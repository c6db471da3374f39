"""A tensor-parallel rank that stops answering (issue 29, item 20).

With TP 2 and rank 1 stopped (SIGSTOP), every request hung and ``/health`` answered 200: rank 0
waited in a collective with no practical timeout. Now rank 0's monitor calls the group wedged
when one collective outlasts ``--collective-timeout``, kills the other ranks (which fails the
collective), fails the request in flight and new ones with the reason, answers ``/health`` 503
and stops the server (exit 1). An idle rank 0 checks every second that the ranks answer, so an
idle server finds a stopped rank too (``tests/engine/test_parallel_watchdog.py``, in process: a
TP-2 server takes seconds to start, so this tier starts one).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from test_hostile_tp import CORES, alive, rank_pids

import launch
from serverkit import (
    ServerProcess,
    child_env,
    free_port,
    post,
    post_in_background,
    serve_command,
    wait_until,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(CORES < 2, reason="TP 2 needs two cores"),
]

TIMEOUT_S = 2.0
#: The timeout, the monitor's poll and the heartbeat, stretched for a loaded CI machine.
FOUND_WITHIN_S = 25.0
WEDGED = "did not complete a collective"


def wedged_server(tmp_path: Path) -> tuple[ServerProcess, int]:
    server = ServerProcess(["-tp", "2", "--collective-timeout", str(TIMEOUT_S)], tmp_path).start()
    server.wait_ready()
    (rank,) = rank_pids(server.pid)
    return server, rank


def health(server: ServerProcess) -> int | None:
    """``/health``'s status, or None once the server no longer answers."""
    try:
        return httpx.get(server.url + "/health", timeout=2).status_code
    except httpx.HTTPError:
        return None


def cleanup(server: ServerProcess, rank: int) -> None:
    for sig in (signal.SIGCONT, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(rank, sig)
    server.stop()


@pytest.mark.timeout(120)
def test_a_stopped_rank_fails_the_request_in_flight_and_health(tmp_path: Path) -> None:
    server, rank = wedged_server(tmp_path)
    try:
        body = {"model": "dummy", "prompt": "x", "max_tokens": 1500, "ignore_eos": True}
        time.sleep(TIMEOUT_S + 1.0)  # idle past the timeout: the heartbeat finds the ranks well
        assert health(server) == 200
        thread, answer = post_in_background(server.url + "/v1/completions", body)
        time.sleep(1.0)
        assert health(server) == 200
        os.kill(rank, signal.SIGSTOP)
        stopped = time.monotonic()
        thread.join(timeout=FOUND_WITHIN_S)
        assert answer, "the request in flight still hangs"
        assert time.monotonic() - stopped < FOUND_WITHIN_S
        (got,) = answer
        if isinstance(got, httpx.Response):
            assert got.status_code >= 500, got.text
            assert WEDGED in got.json()["error"]["message"], got.text
        # /health fails (503, then nothing once the server has stopped), and so does a new one
        assert health(server) in {503, None}
        try:
            late = post(server.url + "/v1/completions", body, timeout=10)
            assert late.status_code == 503, late.text
            assert WEDGED in late.json()["error"]["message"], late.text
        except httpx.HTTPError:
            pass  # the server has already stopped
        assert server.wait(timeout=30) == 1
        log = server.log()
        assert WEDGED in log and f"within {TIMEOUT_S:g} s" in log, log[-3000:]
        assert wait_until(lambda: not alive(rank), timeout=10)
    finally:
        cleanup(server, rank)


@pytest.mark.parametrize("value", ["0.1", "nan", "100000"])
def test_a_collective_timeout_out_of_range_is_a_usage_error(value: str) -> None:
    done = launch.run(
        serve_command(["-tp", "2", "--collective-timeout", value], free_port()),
        timeout=120,
        env=child_env(),
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert f"--collective-timeout {float(value):g}: expected seconds in 0.5..86400" in done.stderr
