"""Start ``python -m speclens ...`` processes for the tests, without paying the import each time.

A test suite that starts a hundred servers and refused start-ups spends most of its CPU importing
torch. ``popen`` and ``run`` hand such a command to one warm start-up server per test process
(``zygote.py``), which forks it: a real process with its own pid, signals, exit status, output
files and interpreter exit. Anything else (another program, an environment that changes what an
import reads, ``SPECLENS_TEST_FRESH=1``) goes to ``subprocess`` as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

ZYGOTE = Path(__file__).with_name("zygote.py")
#: Variables read when a library loads (OpenMP reads its thread count as it is loaded): a
#: command whose value differs from the start-up server's gets a fresh interpreter.
_READ_AT_IMPORT = ("OMP_", "MKL_", "KMP_", "PYTHON", "TORCH", "CUDA", "LD_", "GOMP")


#: How long the start-up server may take to fork a command once it has its imports done (a fork
#: takes milliseconds; a loaded machine stretches that to seconds).
FORK_TIMEOUT_S = 60.0


def _import_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_READ_AT_IMPORT)}


class _Zygote:
    """One start-up server and the exit codes it reports, shared by a test process's threads."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = _import_env(env)
        self.proc = subprocess.Popen(
            [sys.executable, str(ZYGOTE), str(os.getpid())],  # it ends when this process does
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=dict(env),
            start_new_session=True,  # a Ctrl-C meant for the tests is not one for it
        )
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.pids: dict[int, int] = {}
        self.codes: dict[int, int] = {}
        self.cpu: dict[int, float] = {}
        self.next_id = 0
        self.ready = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            reply = json.loads(line)
            with self.changed:
                if "ready" in reply:
                    self.ready = True
                elif "id" in reply:
                    self.pids[reply["id"]] = reply["pid"]
                else:
                    self.codes[reply["pid"]] = reply["code"]
                    self.cpu[reply["pid"]] = reply["cpu"]
                self.changed.notify_all()
        with self.changed:  # it died: nothing more will be reported
            self.proc.wait()
            self.changed.notify_all()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork(self, request: dict[str, Any]) -> int:
        deadline = None  # counted from when the server has its imports done
        with self.changed:
            request_id = self.next_id
            self.next_id += 1
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps({**request, "id": request_id}) + "\n").encode())
            self.proc.stdin.flush()
            while request_id not in self.pids:
                if not self.alive:
                    raise RuntimeError("the tests' start-up server died")
                if deadline is None and self.ready:
                    deadline = time.monotonic() + FORK_TIMEOUT_S
                if deadline is not None and time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the tests' start-up server forked nothing in {FORK_TIMEOUT_S:.0f} s"
                    )
                self.changed.wait(1.0)
            return self.pids.pop(request_id)

    def wait(self, pid: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.changed:
            while pid not in self.codes:
                left = None if deadline is None else deadline - time.monotonic()
                if (left is not None and left <= 0) or not self.alive:
                    return None
                self.changed.wait(0.5 if left is None else min(left, 0.5))
            return self.codes[pid]


#: One start-up server per import-time environment (servers run with ``OMP_NUM_THREADS=1``,
#: most other commands without it), started when first needed.
_zygotes: dict[frozenset[tuple[str, str]], _Zygote] = {}
_zygote_lock = threading.Lock()
#: Each server costs one import of torch and speclens; past this many environments, commands
#: go fresh.
MAX_ZYGOTES = 3


def _warm(env: Mapping[str, str]) -> _Zygote | None:
    """The start-up server for commands run with ``env``, or None when they need a fresh one."""
    if env.get("SPECLENS_TEST_FRESH") == "1" or sys.platform != "linux":
        return None
    key = frozenset(_import_env(env).items())
    with _zygote_lock:
        zygote = _zygotes.get(key)
        if zygote is None or not zygote.alive:
            if zygote is None and len(_zygotes) >= MAX_ZYGOTES:
                return None
            zygote = _zygotes[key] = _Zygote(env)
    return zygote


class Child:
    """A forked command, with the part of ``subprocess.Popen`` the tests use."""

    def __init__(self, zygote: _Zygote, pid: int, args: list[str]) -> None:
        self.zygote, self.pid, self.args = zygote, pid, args
        self.returncode: int | None = None
        self.stdout: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.wait(self.pid, 0)
        return self.returncode

    @property
    def cpu_s(self) -> float | None:
        """CPU seconds the command used, once it has ended (not counting the skipped import)."""
        return self.zygote.cpu.get(self.pid) if self.returncode is not None else None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.zygote.wait(self.pid, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _speclens_args(command: Sequence[str]) -> list[str] | None:
    """The arguments after ``python -m speclens``, or None for any other command."""
    if (
        len(command) >= 3
        and command[0] == sys.executable
        and list(command[1:3]) == ["-m", "speclens"]
    ):
        return [str(a) for a in command[3:]]
    return None


def _name(stream: IO[Any] | None) -> dict[str, Any] | None:
    """Where a child's stream goes: a file by its path (and whether it appends), or nowhere."""
    if stream is None:
        return None
    return {"path": str(stream.name), "append": "a" in stream.mode}


def _by_name(*streams: Any) -> bool:
    """Only files with a path can be handed over (not pipes, not ``subprocess.STDOUT``)."""
    return all(s is None or isinstance(getattr(s, "name", None), str) for s in streams)


def default_signals() -> None:
    """``preexec_fn`` for a child whose signal handling is under test: SIGHUP and SIGTERM at
    their defaults, as a shell starts a command, whatever this process inherited (``nohup``
    ignores SIGHUP, and an ignored signal is inherited). The zygote's children inherit its
    dispositions, so such a child is started with ``subprocess.Popen``."""
    for sig in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def popen(
    command: Sequence[str | Path],
    *,
    stdout: IO[Any] | None = None,
    stderr: IO[Any] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    start_new_session: bool = False,
) -> Child | subprocess.Popen[bytes]:
    """``subprocess.Popen`` for a command whose output goes to files (or nowhere)."""
    command = [str(c) for c in command]
    env = dict(os.environ if env is None else env)
    args = _speclens_args(command)
    zygote = _warm(env) if args is not None and _by_name(stdout, stderr) else None
    if zygote is None or args is None:
        return subprocess.Popen(
            command, stdout=stdout, stderr=stderr, env=env, cwd=cwd,
            start_new_session=start_new_session,
        )  # fmt: skip
    request = {
        "args": args,
        "env": env,
        "cwd": str(cwd or os.getcwd()),
        "stdout": _name(stdout),
        "stderr": _name(stderr),
        "new_session": start_new_session,
    }
    return Child(zygote, zygote.fork(request), command)


class Completed(subprocess.CompletedProcess[str]):
    """``subprocess.CompletedProcess``, plus ``cpu_s``: the CPU seconds a forked command used
    (its own work, without the import), or None for one run fresh (whose CPU includes it)."""

    cpu_s: float | None = None


def run(
    command: Sequence[str | Path],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
) -> Completed:
    """``subprocess.run(..., capture_output=True, text=True)``; on timeout the command is killed
    and ``subprocess.TimeoutExpired`` carries what it wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        out_path, err_path = Path(tmp) / "stdout", Path(tmp) / "stderr"
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = popen(command, stdout=out, stderr=err, env=env, cwd=cwd)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            raise subprocess.TimeoutExpired(
                [str(c) for c in command], timeout,
                output=out_path.read_text(errors="replace"),
                stderr=err_path.read_text(errors="replace"),
            ) from None  # fmt: skip
        done = Completed(
            [str(c) for c in command], code,
            out_path.read_text(errors="replace"), err_path.read_text(errors="replace"),
        )  # fmt: skip
        done.cpu_s = proc.cpu_s if isinstance(proc, Child) else None
        return done
