"""Start a peer server in its own process group, wait until its ``/health`` answers, stop it.

Shared by the peer tier's fixtures and ``benchmarks/peers.py``. Standard library only. The
server gets its own process group (vLLM forks an engine core and workers), so stopping it
reaches every process: SIGTERM to the group, a wait, then SIGKILL for whatever outlived it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

STOP_TIMEOUT_S = 30.0


class StartError(RuntimeError):
    """The server exited, or was not healthy in time, while starting."""


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2.0) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the whole process group, wait, then SIGKILL what outlived it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=STOP_TIMEOUT_S)


@contextlib.contextmanager
def running(
    name: str,
    cmd: Sequence[str],
    port: int,
    log: Path,
    timeout_s: float,
    env: dict[str, str] | None = None,
    poll_s: float = 0.5,
) -> Iterator[str]:
    """``cmd`` serving on loopback ``port`` (output to ``log``); yields its base URL once
    ``/health`` answers 200; raises ``StartError`` if it exits or stays unhealthy."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            list(cmd), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        while not healthy(url):
            if proc.poll() is not None:
                raise StartError(f"{name} exited with {proc.returncode} while starting")
            if time.monotonic() - started > timeout_s:
                raise StartError(f"{name} not healthy after {timeout_s:.0f} s")
            time.sleep(poll_s)
        yield url
    finally:
        stop(proc)
