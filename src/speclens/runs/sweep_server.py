"""A sweep's server: started in its own process group, waited on by its health route (bounded),
and stopped by its group (SIGTERM, then SIGKILL), its log kept beside the point's run. A
terminating signal to the sweep acts as a Ctrl-C (``interrupts``), and nothing interrupts a
server's stop (``held``), so no server outlives the sweep.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speclens.runs.files import open_new

LOG_TAIL_LINES = 20
LOG_TAIL_CHARS = 2000
STOP_GRACE_S = 10.0


# -------------------------------------------------------------------------- the servers
def free_port() -> int:
    """A loopback port nothing listens on now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(path: Path) -> str:
    """The last lines of a server log, bounded, for a failure's reason."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(no log: {exc.strerror or exc})"
    lines = [line for line in text.splitlines() if line.strip()][-LOG_TAIL_LINES:]
    return "\n".join(lines)[-LOG_TAIL_CHARS:] or "(the log is empty)"


@dataclass
class Server:
    """One server process in its own process group, its output in ``log_path``."""

    argv: list[str]
    env: dict[str, str]
    log_path: Path
    health_url: str
    timeout_s: float
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> str | None:
        """Start it and wait for its health route: None when it answers 200 in time, else why
        not (with its log's tail)."""
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open_new(self.log_path)  # a link planted there is refused, never followed
        except OSError as exc:
            return f"{self.log_path}: the server log cannot be written: {exc.strerror or exc}"
        try:
            with log, held():  # a signal between the fork and ``self.proc`` would orphan it
                self.proc = subprocess.Popen(
                    self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env={**os.environ, **self.env}, start_new_session=True,
                )  # fmt: skip
        except OSError as exc:
            return f"the server command {self.argv[0]!r} cannot start: {exc.strerror or exc}"
        return self._wait_healthy()

    def _wait_healthy(self) -> str | None:
        assert self.proc is not None
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                return self.why(f"the server exited with code {code} before {self.health_url} answered")  # fmt: skip
            if _healthy(self.health_url):
                return None
            time.sleep(0.2)
        return self.why(f"the server was not healthy at {self.health_url} after {self.timeout_s:g} s")  # fmt: skip

    def why(self, reason: str) -> str:
        return f"{reason}; server log tail ({self.log_path.name}):\n{log_tail(self.log_path)}"

    def died(self) -> str | None:
        """Why it is gone, when it exited while it should be serving."""
        code = None if self.proc is None else self.proc.poll()
        return None if code is None else self.why(f"the server exited with code {code} during the sweep")  # fmt: skip

    def stop(self) -> None:
        """SIGTERM to its process group, then SIGKILL to what is left after the grace. Nothing
        interrupts it: a Ctrl-C or a terminating signal that arrives meanwhile is held, and
        delivered once the group is gone."""
        if self.proc is None:
            return
        with held():
            self._stop()

    def _stop(self) -> None:
        assert self.proc is not None
        group = self.proc.pid
        _signal_group(group, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=STOP_GRACE_S)
        deadline = time.monotonic() + (STOP_GRACE_S if self.proc.poll() is not None else 0)
        while _group_alive(group) and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal_group(group, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=STOP_GRACE_S)


def copy_log(log: Path, target: Path) -> None:
    """The setting's server log copied to a point's ``server.log``, never through a link planted
    at either; OSError names the file."""
    fd = os.open(log, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as source:
        if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(log))
        target.parent.mkdir(parents=True, exist_ok=True)
        with open_new(target) as out:
            shutil.copyfileobj(source, out)


# ------------------------------------------------------------------------------ signals
def _terminating() -> tuple[signal.Signals, ...]:
    names = ("SIGHUP", "SIGTERM", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGVTALRM",
             "SIGPROF", "SIGXCPU", "SIGIO", "SIGPWR")  # fmt: skip
    return tuple(getattr(signal, n) for n in names if hasattr(signal, n))


#: The signals whose default action ends the process, besides SIGINT (which Python raises as
#: KeyboardInterrupt): a sweep takes each as a Ctrl-C, so that the server it started is stopped.
TERMINATING = _terminating()


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _as_ctrl_c(signum: int, _frame: Any) -> None:
    """A terminating signal handled as a Ctrl-C: through SIGINT's own handler (bench's load
    phase ends its sending on it), or as a KeyboardInterrupt where SIGINT is ignored."""
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
        raise KeyboardInterrupt
    signal.raise_signal(signal.SIGINT)


@contextlib.contextmanager
def interrupts() -> Iterator[list[str]]:
    """For the block, every terminating signal left at its default action (one ignored, as
    ``nohup`` ignores SIGHUP, or handled by someone else is left alone) acts as a Ctrl-C; yields
    the names of those that arrived. The handlers are put back after."""
    if not _in_main_thread():
        yield []
        return
    seen: list[str] = []

    def handler(signum: int, frame: Any) -> None:
        seen.append(signal.Signals(signum).name)
        _as_ctrl_c(signum, frame)

    previous = {}
    for sig in TERMINATING:
        if signal.getsignal(sig) is signal.SIG_DFL:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield seen
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Hold SIGINT and the terminating signals for the block (stopping a server must not be cut
    short: a second Ctrl-C during its grace period would skip the SIGKILL); the first that
    arrived is delivered to its own handler after the block."""
    if not _in_main_thread():
        yield
        return
    caught: list[int] = []
    previous = {}
    for sig in (signal.SIGINT, *TERMINATING):
        handler = signal.getsignal(sig)
        if handler is not signal.SIG_IGN and handler is not None:
            previous[sig] = signal.signal(sig, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    if caught:
        signal.raise_signal(caught[0])


def _signal_group(group: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


@contextlib.contextmanager
def started(server: Server) -> Iterator[str | None]:
    """The server started (yields why it failed, or None), always stopped after."""
    try:
        yield server.start()
    finally:
        server.stop()
