"""Time bounds for tests that run ``speclens`` in a child process.

A refusal "at once" is judged by the CPU seconds the child used where the tests' start-up server
forked it (``launch``): its own work, which a loaded machine does not stretch the way it
stretches wall time (a CI run saw a refusal of 0.2 CPU-s take 9 s of wall). A child run fresh
must end within a margin of its own start-up, measured once per test process as
``speclens --version`` in the same environment. The unbounded work these tests guard against
takes minutes either way."""

from __future__ import annotations

import dataclasses
import functools
import subprocess
import sys
import time

import launch


@functools.cache
def startup_s() -> float:
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "speclens", "--version"], capture_output=True, check=True)
    return time.monotonic() - start


def within(margin_s: float) -> float:
    """How long a child that does ``margin_s`` of work at most may take: twice its start-up
    (the machine's load moves both), plus the margin."""
    return 2 * startup_s() + margin_s


@dataclasses.dataclass(frozen=True)
class Took:
    """How long a child took: wall seconds, and the CPU seconds of its own work where known (a
    forked child, or one that measured itself after its imports)."""

    wall_s: float
    cpu_s: float | None = None

    def __str__(self) -> str:
        cpu = "" if self.cpu_s is None else f"{self.cpu_s:.2f} CPU-s, "
        return f"{cpu}{self.wall_s:.1f} s of wall (start-up {startup_s():.1f} s)"


def took(done: launch.Completed, wall_s: float) -> Took:
    return Took(wall_s, done.cpu_s)


def assert_quick(took: Took, margin_s: float) -> None:
    """The child did at most ``margin_s`` of work: in CPU seconds where known, else in wall
    seconds beyond its start-up."""
    if took.cpu_s is not None:
        assert took.cpu_s < margin_s, f"took {took}"
    else:
        assert took.wall_s < within(margin_s), f"took {took}"
