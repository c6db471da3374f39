"""The collectives a tensor-parallel rank runs (``torch.distributed``: gloo on a CPU, NCCL on
CUDA), each counted and timed, and the error when one fails because a rank died.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from speclens.engine.lockstep import LockstepError

#: Bound on a broadcast plan (bytes).
MAX_PLAN_BYTES = 1 << 28


class RankDied(RuntimeError):
    """A rank process ended, or stopped answering, while the engine was running; the engine
    cannot go on."""


@dataclass
class Comm:
    """The collectives a rank runs, each counted by kind (``calls``) and timed (``seconds``,
    host time: meaningful on a CPU, where gloo collectives block). ``listeners`` see each kind
    as it runs (tests count collectives per step with them)."""

    rank: int
    size: int
    calls: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    listeners: list[Callable[[str], None]] = field(default_factory=list)
    #: The collective in progress (its kind, and when it began on the monotonic clock), read by
    #: rank 0's monitor; and when the last one ended.
    waiting: tuple[str, float] | None = None
    last_done: float = field(default_factory=time.monotonic)
    #: Set by rank 0's monitor when a rank died or stopped answering: a collective that fails
    #: afterwards raises ``RankDied`` with it.
    failure: str | None = None

    @contextlib.contextmanager
    def _timed(self, kind: str) -> Iterator[None]:
        self.calls[kind] += 1
        for listener in self.listeners:
            listener(kind)
        started = time.perf_counter()
        self.waiting = (kind, time.monotonic())
        try:
            yield
        except RuntimeError as exc:
            raise self._failed(exc) from exc
        finally:
            self.waiting = None
            self.last_done = time.monotonic()
            self.seconds += time.perf_counter() - started

    def _failed(self, exc: RuntimeError) -> RuntimeError:
        """A failed collective as ``RankDied`` with what rank 0's monitor saw (it polls every
        0.1 s, so a peer's closed connection may be seen here first), else as it came."""
        deadline = time.monotonic() + 1.0
        while self.failure is None and self.rank == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        return RankDied(self.failure) if self.failure is not None else exc

    def all_reduce(self, tensor: torch.Tensor, kind: str = "all_reduce", op: Any = None) -> None:
        with self._timed(kind):
            dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM)

    def broadcast(self, tensor: torch.Tensor, kind: str) -> torch.Tensor:
        """``tensor`` from rank 0 (in place on every rank; ``tensor`` must be contiguous)."""
        with self._timed(kind):
            dist.broadcast(tensor, 0)
        return tensor

    def broadcast_json(self, message: Any, device: torch.device) -> Any:
        """A JSON value from rank 0 (two broadcasts: its length, then its bytes). JSON, not
        pickle: nothing a rank receives can run code."""
        data = json.dumps(message).encode() if self.rank == 0 else b""
        length = torch.tensor([len(data)], dtype=torch.int64, device=device)
        self.broadcast(length, "plan")
        size = int(length.item())
        if not 0 <= size <= MAX_PLAN_BYTES:
            raise LockstepError(
                f"rank {self.rank}: a plan of {size} bytes, expected at most {MAX_PLAN_BYTES}"
            )
        if self.rank == 0:
            buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
        else:
            buffer = torch.empty(size, dtype=torch.uint8, device=device)
        self.broadcast(buffer, "plan")
        return message if self.rank == 0 else json.loads(bytes(buffer.cpu().tolist()))
