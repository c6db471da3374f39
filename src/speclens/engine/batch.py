"""Build a padded ``ForwardBatch`` from requests: which tokens each feeds, at which positions,
where their keys and values go, and which cached positions each attends over."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from speclens.engine.model import ForwardBatch, Segment

#: Attention pads every request to the widest query and the longest context unless that computes
#: more than this many times the real work (each request's query rows times its context); then
#: each request attends on its own (``ForwardBatch.segments``). Queries count as well as contexts:
#: a verify step where one of 8 requests drafted 4 padded all 8 to 5 rows, 40 rows of attention
#: for 12, and the wider the batch the likelier one request drafts (benchmarks/README.md,
#: ``attention_layout.py`` and ``replay.py``).
MAX_ATTENTION_PADDING = 1.5


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
    query_valid = torch.arange(q_len).unsqueeze(0) < lengths.unsqueeze(1)
    real = query_valid.reshape(-1).nonzero().squeeze(1) if not query_valid.all() else None
    segments = None
    read_slots = mask = None
    if batch > 1 and batch * q_len * ctx_len > MAX_ATTENTION_PADDING * sum(
        len(t) * end for t, end in zip(tokens, ends, strict=True)
    ):
        segments = _segments(read, starts, tokens, ends, device)
    else:
        context = torch.tensor(ends)
        key_pos = torch.arange(ctx_len)
        causal = key_pos.view(1, 1, ctx_len) <= positions.unsqueeze(2)
        causal &= key_pos.view(1, 1, ctx_len) < context.view(batch, 1, 1)
        # A padded query attends to position 0 only, so its softmax row is never empty.
        causal |= (~query_valid).unsqueeze(2) & (key_pos == 0).view(1, 1, ctx_len)
        mask = causal.unsqueeze(1).to(device)
        read_slots = torch.tensor(read, dtype=torch.int64).to(device)
    first = read[0][0]
    consecutive = batch == 1 and read[0] == list(range(first, first + ctx_len))
    return ForwardBatch(
        read_range=(first, first + ctx_len) if consecutive else None,
        input_ids=torch.tensor(ids, dtype=torch.int64).to(device),
        positions=positions.to(device),
        write_slots=torch.tensor(write, dtype=torch.int64).to(device),
        read_slots=read_slots,
        mask=mask,
        real=None if real is None else real.to(device),
        segments=segments,
    )


def _segments(
    read: list[list[int]],
    starts: Sequence[int],
    tokens: Sequence[Sequence[int]],
    ends: Sequence[int],
    device: torch.device,
) -> tuple[Segment, ...]:
    """Each request's query rows (packed, in request order), context slots and causal mask."""
    out = []
    row = 0
    for slots, start, toks, end in zip(read, starts, tokens, ends, strict=True):
        own = slots[:end]
        first = own[0]
        keys: tuple[int, int] | torch.Tensor
        if own == list(range(first, first + end)):
            keys = (first, first + end)
        else:
            keys = torch.tensor(own, dtype=torch.int64).to(device)
        n = len(toks)
        mask = None
        if n > 1:  # query i sits at position start + i and sees positions 0..start + i
            queries = torch.arange(start, end).unsqueeze(1)
            mask = (torch.arange(end).unsqueeze(0) <= queries).to(device)
        out.append(Segment((row, row + n), keys, mask))
        row += n
    return tuple(out)
