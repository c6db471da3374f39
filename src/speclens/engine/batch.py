"""Build a padded ``ForwardBatch`` from requests: which tokens each feeds, at which positions,
where their keys and values go, and which cached positions each attends over."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from speclens.engine.model import ForwardBatch


def build_batch(
    block_tables: Sequence[Sequence[int]],
    starts: Sequence[int],
    tokens: Sequence[Sequence[int]],
    block_size: int,
    scratch_slot: int,
    device: torch.device,
) -> ForwardBatch:
    """Request b feeds ``tokens[b]`` at positions ``starts[b]..`` and attends over positions
    ``0..starts[b] + len(tokens[b]) - 1`` of its own context."""
    batch = len(tokens)
    q_len = max(len(t) for t in tokens)
    ctx_len = max(s + len(t) for s, t in zip(starts, tokens, strict=True))
    input_ids = torch.zeros((batch, q_len), dtype=torch.int64)
    positions = torch.zeros((batch, q_len), dtype=torch.int64)
    write_slots = torch.full((batch, q_len), scratch_slot, dtype=torch.int64)
    read_slots = torch.full((batch, ctx_len), scratch_slot, dtype=torch.int64)
    context = torch.zeros(batch, dtype=torch.int64)
    for b, (table, start, toks) in enumerate(zip(block_tables, starts, tokens, strict=True)):
        n = len(toks)
        end = start + n
        blocks = torch.tensor(table, dtype=torch.int64)
        pos = torch.arange(end, dtype=torch.int64)
        slots = blocks[pos // block_size] * block_size + pos % block_size
        read_slots[b, :end] = slots
        write_slots[b, :n] = slots[start:end]
        input_ids[b, :n] = torch.tensor(toks, dtype=torch.int64)
        positions[b, :n] = pos[start:end]
        context[b] = end
    key_pos = torch.arange(ctx_len)
    query_valid = torch.arange(q_len).unsqueeze(0) < torch.tensor(
        [len(t) for t in tokens]
    ).unsqueeze(1)
    mask = key_pos.view(1, 1, ctx_len) <= positions.unsqueeze(2)  # causal
    mask &= key_pos.view(1, 1, ctx_len) < context.view(batch, 1, 1)
    # A padded query attends to position 0 only, so its softmax row is never empty.
    mask |= (~query_valid).unsqueeze(2) & (key_pos == 0).view(1, 1, ctx_len)
    return ForwardBatch(
        input_ids=input_ids.to(device),
        positions=positions.to(device),
        write_slots=write_slots.to(device),
        read_slots=read_slots.to(device),
        mask=mask.unsqueeze(1).to(device),
    )
