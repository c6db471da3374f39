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
    ends = [s + len(t) for s, t in zip(starts, tokens, strict=True)]
    ctx_len = max(ends)
    ids, pos, write, read = [], [], [], []
    for table, start, toks, end in zip(block_tables, starts, tokens, ends, strict=True):
        slots = [table[p // block_size] * block_size + p % block_size for p in range(end)]
        pad_q = q_len - len(toks)
        ids.append([*toks, *[0] * pad_q])
        pos.append([*range(start, end), *[0] * pad_q])
        write.append([*slots[start:end], *[scratch_slot] * pad_q])
        read.append([*slots, *[scratch_slot] * (ctx_len - end)])
    positions = torch.tensor(pos, dtype=torch.int64)
    lengths = torch.tensor([len(t) for t in tokens])
    context = torch.tensor(ends)
    key_pos = torch.arange(ctx_len)
    query_valid = torch.arange(q_len).unsqueeze(0) < lengths.unsqueeze(1)
    mask = key_pos.view(1, 1, ctx_len) <= positions.unsqueeze(2)  # causal
    mask &= key_pos.view(1, 1, ctx_len) < context.view(batch, 1, 1)
    # A padded query attends to position 0 only, so its softmax row is never empty.
    mask |= (~query_valid).unsqueeze(2) & (key_pos == 0).view(1, 1, ctx_len)
    real = query_valid.reshape(-1).nonzero().squeeze(1) if not query_valid.all() else None
    first = read[0][0]
    consecutive = batch == 1 and read[0] == list(range(first, first + ctx_len))
    return ForwardBatch(
        read_range=(first, first + ctx_len) if consecutive else None,
        input_ids=torch.tensor(ids, dtype=torch.int64).to(device),
        positions=positions.to(device),
        write_slots=torch.tensor(write, dtype=torch.int64).to(device),
        read_slots=torch.tensor(read, dtype=torch.int64).to(device),
        mask=mask.unsqueeze(1).to(device),
        real=None if real is None else real.to(device),
    )
