"""Fixtures that run a REAL ``speclens serve``: ``[sys.executable, "-m", "speclens", "serve",
*args, "--port", PORT]`` on 127.0.0.1 (a free port), polled on ``GET /health`` until 200, its
stdout and stderr captured to files, and always stopped (SIGTERM, wait, SIGKILL on timeout).

Each yields ``ServerProcess`` objects (see ``serverkit``): ``.url`` is the base URL, ``.proc`` the
``Popen``, ``.log()`` what it wrote.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from serverkit import ServerProcess, running_servers

Serve = Callable[..., list[ServerProcess]]


@contextlib.contextmanager
def _serving(log_dir: Callable[[], Path]) -> Iterator[Serve]:
    with contextlib.ExitStack() as stack:

        def serve(*arg_lists: Sequence[str]) -> list[ServerProcess]:
            """Start one server per argument list (their start-ups overlap); all healthy."""
            return stack.enter_context(running_servers(log_dir(), *arg_lists))

        yield serve


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    """Servers that live for the module: ``serve([args], [args], ...) -> [ServerProcess, ...]``."""
    with _serving(lambda: tmp_path_factory.mktemp("serve")) as start:
        yield start


@pytest.fixture
def serve_once(tmp_path: Path) -> Iterator[Serve]:
    """The same, stopped at the end of the test (for tests that signal or kill them)."""
    with _serving(lambda: tmp_path) as start:
        yield start
