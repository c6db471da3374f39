"""``rejection_sample``: one entry point, three methods, one output layout.

For B requests with drafts padded to K (``num_draft_tokens`` says how many are real), every
method returns ``output_token_ids`` [B, K + 1] (accepted drafts, then one correction or bonus
token, then -1) and ``num_accepted`` [B] (accepted drafts per request, the seed's
``num_bonus_tokens``):

- ``greedy``: accept while the draft equals the target argmax; emit the argmax at the first
  mismatch, the bonus token when every draft is accepted.
- ``probabilistic`` (Leviathan et al., 2023): accept with probability min(1, p/q); on rejection
  emit a sample of norm(max(0, p - q)); the bonus token when every draft is accepted.
- ``synthetic``: accept position i with the forced schedule's conditional rate (with a spread,
  the row's own request's), stopping at the first rejection; accepted positions emit the draft's
  own ids, a rejection the target argmax.

Everything stays on the tensors' device and no op waits for it: no host reads (``.item()``,
``.tolist()``, ``.cpu()``, ``bool(t)``) and no data-dependent shapes (``nonzero``, boolean-mask
indexing, ``unique``); tests/sampling/test_no_host_sync.py runs every method under a guard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from speclens.sampling.synthetic import SyntheticAcceptance

Method = Literal["greedy", "probabilistic", "synthetic"]
METHODS: tuple[Method, ...] = ("greedy", "probabilistic", "synthetic")
PLACEHOLDER = -1


@dataclass(frozen=True)
class SamplerOutput:
    """``output_token_ids`` [B, K + 1] (-1 after the last emitted token); ``num_accepted`` [B]."""

    output_token_ids: torch.Tensor
    num_accepted: torch.Tensor


def _num_accepted(accept: torch.Tensor, num_draft_tokens: torch.Tensor) -> torch.Tensor:
    """Accepted drafts per request: the leading run of accepted positions, padded drafts never
    accepted. ``accept`` is [B, K] bool; the result [B] int64."""
    positions = torch.arange(accept.shape[1], device=accept.device)
    accept = accept & (positions < num_draft_tokens.unsqueeze(1))
    return accept.to(torch.int64).cumprod(dim=1).sum(dim=1)


def _layout(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    num_accepted: torch.Tensor,
    correction: torch.Tensor,
    bonus_token_ids: torch.Tensor,
) -> SamplerOutput:
    """Accepted drafts, then the correction (at a rejection) or the bonus token, then -1."""
    batch, k = draft_token_ids.shape
    positions = torch.arange(k, device=draft_token_ids.device)
    out = torch.full((batch, k + 1), PLACEHOLDER, dtype=torch.int64, device=draft_token_ids.device)
    out[:, :k] = torch.where(positions < num_accepted.unsqueeze(1), draft_token_ids, PLACEHOLDER)
    last = torch.where(num_accepted < num_draft_tokens, correction, bonus_token_ids)
    out.scatter_(1, num_accepted.unsqueeze(1), last.unsqueeze(1).to(torch.int64))
    return SamplerOutput(out, num_accepted)


def _argmax(target_logits: torch.Tensor | None, target_argmax: torch.Tensor | None) -> torch.Tensor:
    if target_argmax is not None:
        return target_argmax
    if target_logits is None:
        raise ValueError("give target_logits or target_argmax")
    return target_logits.argmax(dim=-1)


def _at(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values[b, index[b]]`` for a [B, K + 1] tensor and a [B] index."""
    return values.gather(1, index.unsqueeze(1)).squeeze(1)


Generators = torch.Generator | Sequence[torch.Generator | None] | None


def _draw(out: torch.Tensor, generator: Generators, kind: str) -> torch.Tensor:
    """Fill ``out`` [B, ...] with uniform or Exp(1) draws: from one generator, or row by row
    from each request's own (so a seeded request's draws never depend on its batchmates)."""
    for row, gen in (
        [(out, generator)]
        if not isinstance(generator, Sequence)
        else zip(out, generator, strict=True)
    ):
        if kind == "uniform":
            row.uniform_(generator=gen)
        else:
            row.exponential_(generator=gen)
    return out


def _probabilistic(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    generator: Generators,
) -> SamplerOutput:
    batch, k = draft_token_ids.shape
    p = torch.softmax(target_logits[:, :k].float(), dim=-1)  # [B, K, V]
    q = draft_probs.float()
    index = draft_token_ids.clamp(0, p.shape[-1] - 1).unsqueeze(-1)  # padding may be any id
    p_draft = p.gather(-1, index).squeeze(-1)
    q_draft = q.gather(-1, index).squeeze(-1)
    u = _draw(torch.empty((batch, k), device=p.device), generator, "uniform")
    num_accepted = _num_accepted(u * q_draft < p_draft, num_draft_tokens)  # u < min(1, p/q)
    # Recover a token from norm(max(0, p - q)) at the first rejection. The exponential race
    # (argmax of weight / Exp(1)) samples proportionally to the weight with no host round trip.
    at = num_accepted.clamp(max=k - 1).view(batch, 1, 1).expand(batch, 1, p.shape[-1])
    p_at, q_at = p.gather(1, at).squeeze(1), q.gather(1, at).squeeze(1)
    residual = (p_at - q_at).clamp(min=0)
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p_at)  # p == q
    race = _draw(torch.empty_like(residual), generator, "exponential")
    correction = (residual / race).argmax(dim=-1)
    return _layout(draft_token_ids, num_draft_tokens, num_accepted, correction, bonus_token_ids)


def rejection_sample(
    method: Method,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    *,
    target_logits: torch.Tensor | None = None,
    target_argmax: torch.Tensor | None = None,
    draft_probs: torch.Tensor | None = None,
    synthetic: SyntheticAcceptance | None = None,
    generator: Generators = None,
    request_keys: Sequence[str] | None = None,
) -> SamplerOutput:
    """Decide which drafts each request keeps and what it emits this step.

    Args:
        method: ``greedy``, ``probabilistic`` or ``synthetic``.
        draft_token_ids: [B, K] int64 draft ids, padded (any value) past each request's count.
        num_draft_tokens: [B] int64, the real drafts per request (0..K).
        bonus_token_ids: [B] int64, the token each request emits when all its drafts are
            accepted (sampled by the caller from the target at position ``num_draft_tokens``).
        target_logits: [B, K + 1, V] target logits (temperature, top-k/top-p already applied).
        target_argmax: [B, K + 1] target argmax, in place of ``target_logits`` for greedy and
            synthetic.
        draft_probs: [B, K, V] the drafter's probabilities (probabilistic only).
        synthetic: the forced schedule and its lockstep stream (synthetic only).
        generator: the random stream for probabilistic: one generator, or one per request
            (None entries draw from the default stream).
        request_keys: synthetic with a spread: each row's request id, whose own schedule its
            row is drawn against.
    """
    if draft_token_ids.dim() != 2:
        raise ValueError(f"draft_token_ids must be [B, K], got {tuple(draft_token_ids.shape)}")
    batch, k = draft_token_ids.shape
    if method == "probabilistic":
        if target_logits is None or draft_probs is None:
            raise ValueError("the probabilistic method needs target_logits and draft_probs")
        return _probabilistic(
            draft_token_ids,
            num_draft_tokens,
            target_logits,
            draft_probs,
            bonus_token_ids,
            generator,
        )
    argmax = _argmax(target_logits, target_argmax)
    if method == "greedy":
        accept = draft_token_ids == argmax[:, :k]
    elif method == "synthetic":
        if synthetic is None:
            raise ValueError("the synthetic method needs a SyntheticAcceptance schedule")
        accept = synthetic.accept(batch, k, draft_token_ids.device, request_keys)
    else:
        raise ValueError(f"unknown rejection-sampling method {method!r}; use one of {METHODS}")
    num_accepted = _num_accepted(accept, num_draft_tokens)
    correction = _at(argmax, num_accepted)
    return _layout(draft_token_ids, num_draft_tokens, num_accepted, correction, bonus_token_ids)
