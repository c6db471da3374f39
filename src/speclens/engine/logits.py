"""Turn raw logits into each request's sampling distribution, and sample from it.

Temperature 0 is greedy: the row keeps only its argmax, so the probabilistic rejection sampler
treats a greedy request exactly as greedy decoding does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from speclens.engine.request import SamplingParams


def process(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Apply each request's temperature, top-k and top-p to ``logits`` [B, ..., V] (float32).

    Removed tokens get -inf; a greedy row keeps only its argmax (at logit 0).
    """
    logits = logits.float()
    shape = logits.shape
    batch, vocab = shape[0], shape[-1]
    flat = logits.reshape(batch, -1, vocab)
    out = torch.empty_like(flat)
    for b, p in enumerate(params):
        rows = flat[b]
        if p.greedy:
            top = rows.argmax(dim=-1, keepdim=True)
            out[b] = torch.full_like(rows, float("-inf")).scatter_(-1, top, 0.0)
            continue
        rows = rows / p.temperature
        if 0 < p.top_k < vocab:
            kth = rows.topk(p.top_k, dim=-1).values[..., -1:]
            rows = rows.masked_fill(rows < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_rows, order = rows.sort(dim=-1, descending=True)
            cumulative = sorted_rows.softmax(dim=-1).cumsum(dim=-1)
            drop = cumulative - sorted_rows.softmax(dim=-1) >= p.top_p  # keep the first crossing
            sorted_rows = sorted_rows.masked_fill(drop, float("-inf"))
            rows = torch.empty_like(rows).scatter_(-1, order, sorted_rows)
        out[b] = rows
    return out.reshape(shape)


def sample(
    processed: torch.Tensor,
    generators: Sequence[torch.Generator | None],
    default: torch.Generator | None,
) -> torch.Tensor:
    """One token per row of ``processed`` [B, V], each row drawn with its request's generator
    (or ``default``). Uses the exponential race: argmax(p / Exp(1)) is a sample of p."""
    probs = processed.softmax(dim=-1)
    noise = torch.empty_like(probs)
    for b, gen in enumerate(generators):
        noise[b].exponential_(generator=gen or default)
    return (probs / noise).argmax(dim=-1)
