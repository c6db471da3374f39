"""KV cache capacity: fixed-size blocks handed to requests, and the slot arithmetic over them.

Target and drafter keep their keys and values in separate pools with the same geometry, so one
block table per request addresses both. A speculating request reserves room for its K + 1 verify
slots before each step, which is what admission and preemption account for.
"""

from __future__ import annotations

from collections import deque

from speclens.engine.request import Request


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    """A free list of KV blocks."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use."""
        return 1.0 - self.num_free / self.num_blocks if self.num_blocks else 0.0

    def missing(self, request: Request, num_tokens: int) -> int:
        """Blocks ``request`` still needs to hold ``num_tokens`` positions."""
        return max(0, blocks_for(num_tokens, self.block_size) - len(request.block_table))

    def can_hold(self, request: Request, num_tokens: int) -> bool:
        return self.missing(request, num_tokens) <= self.num_free

    def reserve(self, request: Request, num_tokens: int) -> None:
        """Grow the request's block table to cover ``num_tokens`` positions."""
        need = self.missing(request, num_tokens)
        if need > self.num_free:
            raise RuntimeError("KV cache exhausted; the scheduler should have preempted")
        request.block_table.extend(self._free.popleft() for _ in range(need))

    def free(self, request: Request) -> None:
        """Return every block of the request and forget what it had computed."""
        self._free.extend(request.block_table)
        request.block_table = []
        request.num_computed = 0
        request.num_draft_computed = 0

    def slot(self, request: Request, position: int) -> int:
        return request.block_table[position // self.block_size] * self.block_size + (
            position % self.block_size
        )
