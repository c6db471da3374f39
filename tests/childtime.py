"""Time bounds for tests that run ``speclens`` in a child process.

A refusal "at once" must come within a margin of the child's own start-up, measured once per
test process as ``speclens --version`` in the same environment: on a shared machine running the
suite in parallel the start-up alone can take seconds, while the unbounded work these tests
guard against takes minutes."""

from __future__ import annotations

import functools
import subprocess
import sys
import time


@functools.cache
def startup_s() -> float:
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "speclens", "--version"], capture_output=True, check=True)
    return time.monotonic() - start


def within(margin_s: float) -> float:
    """How long a child that does ``margin_s`` of work at most may take: twice its start-up
    (the machine's load moves both), plus the margin."""
    return 2 * startup_s() + margin_s
