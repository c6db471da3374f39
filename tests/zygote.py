"""A start-up server for the tests' ``python -m speclens`` processes (see ``launch.py``).

It imports torch and speclens once, then forks one child per request. The child is the command
as a fresh interpreter runs it: its own argv, environment, working directory and output files,
``runpy`` on ``speclens.__main__``, and the interpreter's exit steps (non-daemon threads joined,
atexit handlers, output flushed, the exit status or the death by SIGINT an uncaught Ctrl-C gives).
It skips only the teardown of every module (over a second of copy-on-write faults in a fork) and
the import (about 4 s of CPU each), paid here once.

Requests arrive on stdin, one JSON object per line; replies go to stdout, one per line:
``{"ready": p}`` once its imports are done, ``{"id": n, "pid": p}`` when a child is started and ``{"pid": p, "code": c, "cpu": s}`` when it
ends, with ``c`` as ``subprocess`` gives it (the exit status, or minus the signal) and ``s`` the
CPU seconds it used (user and system; the import it skipped is not among them).

It lives no longer than the test process that started it (whose pid is its one argument): EOF
on stdin ends it, and so does that process gone (the kernel's parent-death signal, and its parent
pid checked every 50 ms), even where a fork of it keeps the pipe open. Each child dies with it
(the parent-death signal, SIGKILL), so a test run that was killed leaves none of them running.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import random
import runpy
import select
import signal
import sys
import threading
import traceback
from typing import Any

# What every command needs; imported before any fork so children start warm. pyplot and the
# report's plots: about 0.8 s of import for every bench run that writes its files.
import matplotlib

matplotlib.use("Agg")  # the backend every command that plots selects
import matplotlib.pyplot
import numpy as np
import torch  # noqa: F401

import speclens.bench.client
import speclens.bench.run
import speclens.cli
import speclens.engine
import speclens.engine.weights
import speclens.runs.html_plots
import speclens.server.app  # noqa: F401


def _reseed() -> None:
    """A fresh interpreter seeds numpy's global generator from the OS; a fork would share ours."""
    np.random.seed(int.from_bytes(os.urandom(4), "little"))
    random.seed()


os.register_at_fork(after_in_child=_reseed)


#: The signal the kernel sends it when the thread that started it ends; it ends itself where its
#: parent process has gone with that thread.
PARENT_GONE = signal.SIGUSR1
#: What that signal did in the process that started it: what it does in each child, as before.
PARENT_GONE_AT_START = signal.getsignal(PARENT_GONE)
PR_SET_PDEATHSIG = 1


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value})")


def _die_with(parent: int, sig: int) -> None:
    """``sig`` to this process when ``parent`` (its parent now) goes; at once where it has
    already gone."""
    _prctl(PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)


def _reply(obj: dict[str, Any]) -> None:
    os.write(1, (json.dumps(obj) + "\n").encode())


def _open(target: dict[str, Any] | None) -> int:
    if target is None:
        return os.open(os.devnull, os.O_WRONLY)
    mode = os.O_APPEND if target["append"] else os.O_TRUNC
    return os.open(target["path"], os.O_WRONLY | os.O_CREAT | mode, 0o644)


def _become(request: dict[str, Any], zygote: int) -> None:
    """In the child: turn into the command, then leave through the interpreter's normal exit."""
    signal.signal(PARENT_GONE, PARENT_GONE_AT_START)
    _die_with(zygote, signal.SIGKILL)
    if request.get("new_session"):
        os.setsid()
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    out = _open(request.get("stdout"))
    err = out if request.get("stderr") == request.get("stdout") else _open(request.get("stderr"))
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in {out, err}:
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = ["-m", *request["args"]]
    code, interrupted = 0, False
    try:
        runpy.run_module("speclens", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = _status(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    _exit(code, interrupted)


def _status(code: object) -> int:
    """What the interpreter makes of ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _exit(code: int, interrupted: bool) -> None:
    """The interpreter's exit, less the module teardown."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # what the interpreter calls first
    except KeyboardInterrupt:
        interrupted = True
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if interrupted:  # as the interpreter does for an uncaught KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _reap() -> None:
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        cpu = usage.ru_utime + usage.ru_stime
        _reply({"pid": pid, "code": os.waitstatus_to_exitcode(status), "cpu": cpu})


def _serve(parent: int) -> None:
    """Fork a child for each request until EOF on stdin, or until ``parent`` has gone."""
    zygote = os.getpid()
    pending = b""
    while os.getppid() == parent:
        ready, _, _ = select.select([0], [], [], 0.05)
        _reap()
        if not ready:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _become(request, zygote)  # never returns: it ends as the interpreter does
            _reply({"id": request["id"], "pid": pid})


def main() -> None:
    parent = int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid()

    def parent_gone(_sig: int, _frame: object) -> None:
        if os.getppid() != parent:
            os._exit(0)

    signal.signal(PARENT_GONE, parent_gone)
    _die_with(parent, PARENT_GONE)
    _reply({"ready": os.getpid()})
    _serve(parent)
    os._exit(0)  # nothing to tear down: its children go as it does, at once


if __name__ == "__main__":
    main()
