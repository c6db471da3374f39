"""Independent calls run side by side: a sweep's points, a calibration's closed loops.

``run(fn, calls, jobs, ray_address=...)`` returns ``[fn(call) for call in calls]``, in order,
computed in one of three places:

- this process: one job, or one call;
- ``jobs`` fresh processes of this machine (spawned, never forked: each call is a pure function
  of its argument, so the results are those of one process);
- Ray tasks, with ``ray_address``: ``"local"`` starts a Ray on this machine for the run
  (``jobs`` CPUs, no dashboard, the workers' output not copied to this process, every process
  of it listening on loopback only) and stops it after; any other address (``HOST:PORT``,
  ``ray://HOST:PORT``, ``auto``) joins the cluster there (``ray.init(address=...)``), which
  keeps running after. Each call is one task of one CPU; a cluster's nodes need speclens
  installed, at the driver's version.

The same calls give the same results in all three: nothing a call computes depends on where it
runs (every draw is seeded from its arguments). ``fn`` is a module-level function (a process or a
Ray worker imports it by name) and its argument and result pickle.

Ray is an optional dependency (``pip install 'speclens[ray]'``): it is imported only when a run
asks for it, and ``require_ray`` says how to install it where it is missing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

A = TypeVar("A")
R = TypeVar("R")

#: The address that starts a Ray on this machine for the run instead of joining a cluster.
LOCAL = "local"
#: The only address a local Ray's processes listen on.
LOCAL_IP = "127.0.0.1"
#: How to install the optional dependency.
INSTALL = "pip install 'speclens[ray]'"
#: A cluster address: HOST:PORT (the head's GCS), ray://HOST:PORT (Ray Client), or auto (the
#: cluster ``ray start`` runs on this machine).
ADDRESS = re.compile(r"(?:ray://)?[A-Za-z0-9._\-\[\]:]*[A-Za-z0-9.\-\]]:(\d{1,5})|auto")


class FanoutError(Exception):
    """Ray is missing, or its cluster cannot be joined: one line."""


def address_problem(address: str) -> str | None:
    """Why ``address`` is not one ``run`` takes (None: it is ``local``, ``auto``, HOST:PORT or
    ray://HOST:PORT with a port in 1..65535)."""
    if address == LOCAL:
        return None
    match = ADDRESS.fullmatch(address)
    if match is None or (match.group(1) is not None and not 1 <= int(match.group(1)) <= 65535):
        return (f"expected a Ray address (HOST:PORT, ray://HOST:PORT or auto), or none to start a "
                f"local Ray, got {address!r}")  # fmt: skip
    return None


def require_ray() -> Any:
    """The ``ray`` module, or ``FanoutError`` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise FanoutError(f"Ray is not installed; install it with: {INSTALL}") from None
    return ray


def cores() -> int:
    """The cores this process may run on (its affinity where the system reports one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def simulate_point(call: dict[str, Any]) -> dict[str, Any]:
    """One sweep point: ``speclens.sim.simulate.simulate(**call)``."""
    from speclens.sim.simulate import simulate

    return simulate(**call)


def in_process(calls: int, jobs: int, in_flight: int | None = None) -> bool:
    """Whether ``run`` computes ``calls`` calls in this process (without Ray)."""
    return min(jobs, calls, in_flight or jobs) <= 1


def run(
    fn: Callable[[A], R], calls: Sequence[A], jobs: int, *, ray_address: str | None = None,
    on_result: Callable[[int, R], R] | None = None, in_flight: int | None = None,
) -> list[R]:  # fmt: skip
    """``[fn(call) for call in calls]`` (see the module): in this process, in ``jobs`` spawned
    processes, or as Ray tasks with ``ray_address``. ``on_result(i, result)`` takes each result
    as it arrives (in any order) and returns what is kept; at most ``in_flight`` calls run or
    wait for it at once. A call's exception is raised here, as itself."""
    take: Callable[[int, R], R] = on_result or (lambda _i, result: result)
    if ray_address is not None:
        return _on_ray(fn, calls, jobs, ray_address, take, in_flight)
    results: list[Any] = [None] * len(calls)
    workers = min(jobs, len(calls), in_flight or jobs)
    if workers <= 1:
        for i, call in enumerate(calls):
            results[i] = take(i, fn(call))
        return results
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

    context = multiprocessing.get_context("spawn")
    todo = list(enumerate(calls))[::-1]
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        running: dict[Future[R], int] = {}
        while todo or running:
            while todo and len(running) < workers:
                i, call = todo.pop()
                running[pool.submit(fn, call)] = i
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                i = running.pop(future)
                results[i] = take(i, future.result())
    return results


@contextmanager
def _one_machine(ray: Any) -> Iterator[None]:
    """While a local Ray starts, its node address stays ``LOCAL_IP``. On Linux Ray swaps a
    loopback node address for the machine's routable one (it expects other nodes to join), and
    its GCS server, raylet, agents and workers then listen on every interface, with no
    authentication; told the machine is a Ray of its own, as it takes macOS and Windows to be,
    it keeps loopback, and they listen there only."""
    constants = ray._private.ray_constants
    before = constants.ENABLE_RAY_CLUSTER
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = before


def _on_ray(
    fn: Callable[[A], R], calls: Sequence[A], jobs: int, address: str,
    take: Callable[[int, R], R], in_flight: int | None,
) -> list[R]:  # fmt: skip
    """``run`` as Ray tasks: a local Ray of ``jobs`` CPUs for the run, or the cluster at
    ``address``; at most ``in_flight`` tasks submitted at once (every one without a bound)."""
    import logging

    ray = require_ray()
    quiet: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
    try:
        if address == LOCAL:
            # address "local" starts a new Ray even where RAY_ADDRESS names a cluster
            with _one_machine(ray):
                ray.init(address=LOCAL, num_cpus=jobs, include_dashboard=False,
                         _node_ip_address=LOCAL_IP, **quiet)  # fmt: skip
        else:
            ray.init(address=address, **quiet)
    except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError, ...
        where = "start a local Ray" if address == LOCAL else f"join the Ray cluster at {address}"
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FanoutError(f"cannot {where}: {reason}") from None
    results: list[Any] = [None] * len(calls)
    pending: dict[Any, int] = {}
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(fn)
        todo = list(enumerate(calls))[::-1]
        bound = in_flight or len(calls)
        while todo or pending:
            while todo and len(pending) < bound:
                i, call = todo.pop()
                pending[task.remote(call)] = i
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                i = pending.pop(ref)
                try:
                    value = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:
                    cause = exc.cause
                    raise (cause if isinstance(cause, Exception) else exc) from None
                results[i] = take(i, value)
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        ray.shutdown()
    return results


@dataclass(frozen=True)
class Fanout:
    """Where a library function runs its independent calls (``run``'s ``jobs`` and
    ``ray_address``): one process by default."""

    jobs: int = 1
    ray_address: str | None = None

    def map(self, fn: Callable[[A], R], calls: Sequence[A]) -> list[R]:
        return run(fn, calls, self.jobs, ray_address=self.ray_address)
