"""Shared fixtures."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from speclens.cli import app


def _as_ctrl_c(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM to the test run (a cancelled job, ``kill``) ends it as Ctrl-C does, through
    every fixture's teardown, so the servers and Ray clusters the fixtures started are stopped
    (by default a SIGTERM ends Python at once, and they run on)."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _as_ctrl_c)
    # A shell that runs the suite in the background (``make test &``) ignores SIGINT and SIGQUIT
    # in it, and every process the tests start inherits that: the signal tests then send
    # signals nothing hears (three failed so). The tests' processes take the defaults.
    if main and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if main and signal.getsignal(signal.SIGQUIT) is signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Single-threaded torch: tiny matmuls oversubscribe a shared 2-core machine, and step
    timings are far steadier on one thread."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def run_cli():
    """Invoke ``speclens`` in-process; returns (exit code, stdout, stderr)."""
    runner = CliRunner()

    def run(*args: str | Path) -> tuple[int, str, str]:
        try:
            result = runner.invoke(app, [str(a) for a in args])
        finally:
            # The command bound logging to the runner's captured stderr, which is closed now.
            logging.getLogger().handlers.clear()
        return result.exit_code, result.stdout, result.stderr

    return run
