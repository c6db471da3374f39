"""Rank 0's watch over a tensor-parallel group that stops answering (issue 29, item 20), in
process: the monitor calls a collective that outlasts the timeout wedged and kills the other
ranks; a collective that then fails raises ``RankDied`` with the reason; an idle rank 0 pings
the ranks every ``HEARTBEAT_S`` and a follower answers. The real TP-2 server with a stopped rank
is ``tests/hostile/test_hostile_tp_wedged.py``."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from starlette.testclient import TestClient

from speclens.engine import Engine, EngineConfig
from speclens.engine.parallel import HEARTBEAT_S, Rank, _Group, _watch, follow
from speclens.engine.parallel_comm import RankDied
from speclens.server import EngineRunner, ServerSettings, create_app


@pytest.fixture
def group() -> Iterator[tuple[Rank, subprocess.Popen[bytes]]]:
    """Rank 0 of 2 whose rank 1 is a process that never answers (it sleeps)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    rank = Rank(0, 2, torch.device("cpu"))
    rank.group = _Group(store=None, processes=[process])
    rank.timeout_s = 0.5
    try:
        yield rank, process
    finally:
        assert rank.group is not None
        rank.group.closing = True
        if process.poll() is None:
            process.kill()
        process.wait()


def watching(rank: Rank) -> threading.Thread:
    thread = threading.Thread(target=_watch, args=(rank,), daemon=True)
    thread.start()
    return thread


def test_a_collective_past_the_timeout_is_wedged_and_the_ranks_are_killed(
    group: tuple[Rank, subprocess.Popen[bytes]],
) -> None:
    rank, process = group
    monitor = watching(rank)
    time.sleep(1.0)  # idle (no collective) for twice the timeout: nothing happens
    assert rank.dead is None and process.poll() is None
    rank.comm.waiting = ("all_reduce", time.monotonic())
    time.sleep(0.2)  # in a collective, under the timeout: nothing yet
    assert rank.dead is None and process.poll() is None
    monitor.join(timeout=5)
    assert not monitor.is_alive()
    assert process.wait(timeout=5) == -9
    message = rank.dead
    assert message is not None and rank.comm.failure == message
    assert message.startswith(
        "tensor-parallel ranks did not complete a collective (all_reduce) within 0.5 s "
        "(--collective-timeout): a rank is stopped or hung; stopping the other ranks (pids "
    )
    assert str(process.pid) in message
    with pytest.raises(RankDied, match="did not complete a collective"):
        rank.check()


def test_a_collective_that_fails_after_the_monitor_spoke_raises_its_reason(
    group: tuple[Rank, subprocess.Popen[bytes]],
) -> None:
    """The collective rank 0 waits in fails once the ranks are killed (gloo: a closed
    connection); what the engine, the requests and the log see is the monitor's reason."""
    rank, _ = group
    rank.comm.failure = "tensor-parallel ranks did not complete a collective (plan) within 2 s"
    refused = pytest.raises(RankDied, match=r"^tensor-parallel ranks did not complete")
    with refused as caught, rank.comm._timed("plan"):
        raise RuntimeError("Connection closed by peer")
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert rank.comm.waiting is None
    rank.comm.failure = None  # no reason given: the error as it came, after a short wait
    with pytest.raises(RuntimeError, match="Connection closed by peer"), rank.comm._timed("plan"):
        raise RuntimeError("Connection closed by peer")


def test_an_idle_rank_0_pings_the_ranks_every_heartbeat(
    group: tuple[Rank, subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    rank, _ = group
    sent: list[Any] = []
    monkeypatch.setattr(rank.comm, "broadcast_json", lambda message, device: sent.append(message))
    monkeypatch.setattr(
        rank.comm, "all_reduce", lambda tensor, kind="all_reduce", op=None: sent.append(kind)
    )
    rank.comm.last_done = time.monotonic()
    rank.heartbeat()
    assert sent == []  # a collective ended under HEARTBEAT_S ago
    rank.comm.last_done = time.monotonic() - HEARTBEAT_S
    rank.heartbeat()
    assert sent == [{"op": "ping"}, "ping"]
    rank.dead = "tensor-parallel rank 1 exited with code -9"
    with pytest.raises(RankDied, match="exited with code -9"):
        rank.heartbeat()


def test_a_follower_answers_a_ping(monkeypatch: pytest.MonkeyPatch) -> None:
    rank = Rank(1, 2, torch.device("cpu"))
    plans = iter([{"op": "ping"}, {"op": "ping"}, {"op": "stop"}])
    answered: list[str] = []
    monkeypatch.setattr(rank, "receive", lambda: next(plans))
    monkeypatch.setattr(
        rank.comm, "all_reduce", lambda tensor, kind="all_reduce", op=None: answered.append(kind)
    )
    follow(None, rank)  # type: ignore[arg-type]  # a ping never reaches the engine
    assert answered == ["ping", "ping"]


def test_an_idle_engine_check_pings_through_rank_0_only() -> None:
    """``Engine.check_alive`` (the idle runner's call) raises a dead group's reason, and has rank
    0, not a follower, send the heartbeat."""
    calls: list[str] = []
    rank = SimpleNamespace(
        check=lambda: calls.append("check"), heartbeat=lambda: calls.append("ping")
    )
    Engine.check_alive(SimpleNamespace(parallel=rank, _leader=True))  # type: ignore[arg-type]
    assert calls == ["check", "ping"]
    calls.clear()
    Engine.check_alive(SimpleNamespace(parallel=rank, _leader=False))  # type: ignore[arg-type]
    assert calls == ["check"]


def test_health_fails_as_soon_as_the_group_is_wedged() -> None:
    """``/health`` answers 503 once the monitor has given its reason, before the engine thread
    has failed with it."""
    engine = Engine(EngineConfig(executor="sim", kv_cache_tokens=1024, max_model_len=256))
    runner = EngineRunner(engine)
    with TestClient(create_app(runner, ServerSettings(served_model_name="dummy"))) as client:
        assert client.get("/health").status_code == 200
        engine.parallel = SimpleNamespace(dead="tensor-parallel ranks did not complete")  # type: ignore[assignment]
        try:
            assert client.get("/health").status_code == 503
        finally:
            engine.parallel = None
