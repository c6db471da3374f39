"""Steps priced from physics: a model's architecture on a chip, by a roofline.

A step of T query tokens over C context tokens of R sequences, on ``parallel`` chips (tensor
parallel), costs

    overhead + per_sequence * R
    + max(2 * active_params(T) * T / (peak(T) * e_c),  weight_bytes_read(T) / (bandwidth * e_m))
    + max(attention_flops(T, C / R) / (peak * e_c),  kv_bytes_per_token * C / (bandwidth * e_m))
    + 2 * layers * (ring all-reduce of T * hidden activations + latency)      (parallel > 1)

each compute and memory term divided over the chips, but the KV cache's reads: those over the
shards the KV splits in, min(parallel, KV heads) for GQA (a rank past the KV heads keeps a copy
of one) and 1 for MLA (every rank holds the whole latent). Attention runs over each sequence's
own context: C / R, the batch's mean, not the batch's total C. peak(T) is the chip's peak, or,
for a chip ``calibrate --host`` measured, its matmul FLOP/s at T tokens (interpolated on the
measured curve: a CPU reaches its peak only at wide batches). The weights are read once per
step: all of a dense model's, and of a mixture of experts the shared parts plus the routed
experts the T tokens touch (E * (1 - (1 - a / E)^T) per layer, for uniform routing), so a MoE
step's bytes grow with its batch. A speculating sequence's verify step carries K + 1 query
tokens. The drafter runs K forwards over the requests that draft: a ``draft_model`` is priced as
that model's own step; ``eagle``, ``eagle3``, ``mtp`` and ``dspark`` as ``draft_layers`` extra
layers of the target's width plus its LM head; ``ngram`` is free. KV capacity is what the chips'
memory holds beyond the weights, each chip holding an equal share of the weights and one shard
of every token's KV (``kv_tokens``); the engine reserves K + 1 slots a sequence in it.

The efficiencies and the overhead are what ``speclens calibrate`` fits; the defaults are typical
of a tuned engine, not measured here.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from speclens.acceptance.schema import _Model
from speclens.sim.catalog import BYTES, ChipSpec, ModelSpec

#: Methods whose drafter is a few extra layers of the target's width (``draft_layers``).
LAYER_DRAFTERS = frozenset({"eagle", "eagle3", "mtp", "dspark"})
#: Methods whose drafter costs no forward pass.
FREE_DRAFTERS = frozenset({"ngram"})
#: Bytes of an activation crossing the interconnect (bf16).
ACTIVATION_BYTES = 2.0

#: KV capacity of a model whose attention keeps no per-token KV.
MAX_KV_TOKENS = 1 << 40

Fraction = Annotated[float, Field(gt=0, le=1)]
Seconds = Annotated[float, Field(ge=0, le=10)]


class Efficiency(_Model):
    """The share of each peak a step reaches, and what it pays regardless: the roofline's free
    parameters (what ``calibrate`` fits)."""

    compute: Fraction = 0.5
    memory: Fraction = 0.8
    interconnect: Fraction = 0.7
    overhead: Seconds = 1e-3
    #: Per sequence in a step: the engine's own work per request (scheduling, sampling).
    per_sequence: Seconds = 2e-5
    all_reduce_latency: Seconds = 1e-5
    #: The share of memory the engine may fill (weights and KV cache).
    memory_utilization: Fraction = 0.9


@dataclass(frozen=True)
class Shape:
    """What a roofline needs of a model: parameter and byte counts per step, derived from its
    architecture once."""

    layers: int
    hidden: int
    dense_layers: int
    moe_layers: int
    attention: float  # parameters per layer
    dense_mlp: float  # per dense layer
    expert: float  # per expert
    moe_fixed: float  # per MoE layer: router and latent projections
    routed: int
    per_token: int
    shared: int
    lm_head: float
    embeddings: float
    weight_bytes: float  # per parameter, outside the routed experts
    expert_bytes: float
    kv_bytes_per_token: float  # all layers
    #: The most ranks tensor parallelism splits the KV cache over: the KV heads (a rank past
    #: them holds a copy of one); 1 for MLA, whose one latent a token every rank holds whole.
    kv_shards: int
    attention_flops_per_pair: float  # per query token per context token, all layers
    mtp_layers: int

    @classmethod
    def of(cls, m: ModelSpec) -> Shape:
        h, heads, layers = m.hidden_size, m.num_attention_heads, m.num_hidden_layers
        hd = m.head_dim or h // heads
        full = layers if m.full_attention_layers is None else m.full_attention_layers
        kv_bytes = BYTES[m.kv_dtype]
        if m.mla is not None:
            a = m.mla
            qk = a.qk_nope_head_dim + a.qk_rope_head_dim
            q = h * a.q_lora_rank + a.q_lora_rank * heads * qk if a.q_lora_rank else h * heads * qk
            kv = h * (a.kv_lora_rank + a.qk_rope_head_dim)
            kv += a.kv_lora_rank * heads * (a.qk_nope_head_dim + a.v_head_dim)
            attention = q + kv + heads * a.v_head_dim * h
            kv_per_token = full * (a.kv_lora_rank + a.qk_rope_head_dim) * kv_bytes
            # Absorbed MLA: scores over the latent and rope parts, values over the latent.
            pair = full * 2 * heads * (2 * a.kv_lora_rank + a.qk_rope_head_dim)
        else:
            attention = 2 * h * heads * hd + 2 * h * m.num_key_value_heads * hd
            kv_per_token = full * 2 * m.num_key_value_heads * hd * kv_bytes
            pair = full * 4 * heads * hd
        e = m.experts
        moe_layers = layers - e.dense_layers if e is not None else 0
        width = (e.hidden_size or h) if e is not None else h
        return cls(
            layers=layers,
            hidden=h,
            dense_layers=layers - moe_layers,
            moe_layers=moe_layers,
            attention=attention,
            dense_mlp=3 * h * m.intermediate_size,
            expert=3 * width * e.intermediate_size if e is not None else 0.0,
            moe_fixed=(h * e.routed + (2 * h * width if width != h else 0)) if e else 0.0,
            routed=e.routed if e is not None else 0,
            per_token=e.per_token if e is not None else 0,
            shared=e.shared if e is not None else 0,
            lm_head=m.vocab_size * h,
            embeddings=m.vocab_size * h * (1 if m.tie_word_embeddings else 2),
            weight_bytes=BYTES[m.dtype],
            expert_bytes=BYTES[(e.dtype if e is not None else None) or m.dtype],
            kv_bytes_per_token=kv_per_token,
            kv_shards=1 if m.mla is not None else m.num_key_value_heads,
            attention_flops_per_pair=pair,
            mtp_layers=m.mtp_layers,
        )

    def dense_part(self) -> float:
        """Parameters every token runs through, but the routed experts: attention, dense MLPs,
        shared experts, routers and the LM head."""
        moe = self.moe_layers * (self.shared * self.expert + self.moe_fixed)
        return self.layers * self.attention + self.dense_layers * self.dense_mlp + moe

    def parameters(self) -> float:
        """Every parameter but the MTP layers' (as model cards count them)."""
        return self.dense_part() + self.embeddings + self.moe_layers * self.routed * self.expert

    def weights_bytes(self) -> float:
        """Every weight held in memory (MTP layers included)."""
        routed = self.moe_layers * self.routed * self.expert * self.expert_bytes
        dense = (self.dense_part() + self.embeddings) * self.weight_bytes
        return float(dense + routed + self.mtp_layers * self.layer_bytes(1))

    def flops_per_token(self) -> float:
        """Matmul FLOPs of one token through the linear layers (2 per multiply-add)."""
        return 2 * (
            self.dense_part() + self.moe_layers * self.per_token * self.expert + self.lm_head
        )

    @functools.cached_property
    def _miss(self) -> float:
        """The chance a token does not route to a given expert."""
        return 1.0 - self.per_token / self.routed if self.routed else 1.0

    def touched(self, tokens: Any) -> Any:
        """Expected routed experts a layer reads for ``tokens`` tokens (uniform routing): the
        roofline's hot path calls it once per stretch of steps."""
        return self.routed * (1.0 - self._miss ** np.asarray(tokens, dtype=float))

    def read_bytes(self, tokens: Any) -> Any:
        """Weight bytes one step over ``tokens`` query tokens reads (each weight once)."""
        dense = (self.dense_part() + self.lm_head) * self.weight_bytes
        return dense + self.moe_layers * self.touched(tokens) * self.expert * self.expert_bytes

    def layer_bytes(self, tokens: Any) -> Any:
        """One average decoder layer's weight bytes read over ``tokens`` tokens."""
        return (self.read_bytes(tokens) - self.lm_head * self.weight_bytes) / self.layers


@dataclass(frozen=True)
class _Constants:
    """A roofline's numbers, worked out once: the fast path prices a stretch of steps per call,
    many thousand calls a run."""

    peak: float  # FLOP/s (the datasheet's, or the measured curve's best)
    curve: tuple[np.ndarray, np.ndarray] | None  # log tokens, TFLOP/s: a measured chip's curve
    compute: float  # e_c x chips
    memory: float  # bandwidth x e_m x chips
    kv_memory: float  # bandwidth x e_m x the shards the chips split the KV cache in
    flops: float  # per token through the linear layers
    dense_read: float  # bytes read once a step but the routed experts
    expert_read: float  # bytes of one routed expert, over every MoE layer
    pair: float  # attention FLOPs per query and context token
    kv_bytes: float  # per context token
    wire: float  # all-reduce seconds per token, every layer
    latency: float  # all-reduce latency, every layer
    draft_flops: float  # a layer drafter's forward, per token
    draft_dense_read: float

    @classmethod
    def of(cls, roof: Roofline) -> _Constants:
        s, e, tp, chip = roof.shape, roof.efficiency, roof.parallel, roof.chip
        dtype = roof.dtype
        raw = ((chip.measured or {}).get("matmul_tflops_by_tokens") or {}).get(dtype)
        curve = None
        if raw:
            widths = sorted(int(w) for w in raw)
            curve = (np.log(widths), np.array([float(raw[str(w)]) for w in widths]))
        bandwidth = 1e12 * chip.memory_bandwidth_tbps
        link = 1e9 * chip.interconnect_gbps * e.interconnect
        many = tp > 1
        layer_flops = (s.flops_per_token() - 2 * s.lm_head) / s.layers
        layer_dense = (s.dense_part() * s.weight_bytes) / s.layers
        lm_read = s.lm_head * s.weight_bytes
        return cls(
            peak=1e12 * float(chip.tflops[dtype]),  # type: ignore[index]
            curve=curve,
            compute=e.compute * tp,
            memory=bandwidth * e.memory * tp,
            kv_memory=bandwidth * e.memory * roof.kv_shards,
            flops=s.flops_per_token(),
            dense_read=(s.dense_part() + s.lm_head) * s.weight_bytes,
            expert_read=s.moe_layers * s.expert * s.expert_bytes,
            pair=s.attention_flops_per_pair,
            kv_bytes=s.kv_bytes_per_token,
            wire=2 * s.layers * 2 * (tp - 1) / tp * s.hidden * ACTIVATION_BYTES / link,
            latency=2 * s.layers * e.all_reduce_latency if many else 0.0,
            draft_flops=roof.draft_layers * layer_flops + 2 * s.lm_head,
            draft_dense_read=roof.draft_layers * layer_dense + lm_read,
        )


def _plain(value: Any) -> Any:
    """A float for one step (as ``StepCost`` gives), the array for many."""
    return float(value) if np.ndim(value) == 0 else value


@dataclass(frozen=True)
class Roofline:
    """A step cost (the interface ``StepCost`` has) priced from a model on a chip."""

    model: ModelSpec
    chip: ChipSpec
    parallel: int = 1
    method: str | None = None
    draft_layers: int = 1
    drafter: Roofline | None = None  # a draft_model's own roofline
    efficiency: Efficiency = field(default_factory=Efficiency)

    @functools.cached_property
    def shape(self) -> Shape:
        return Shape.of(self.model)

    @property
    def dtype(self) -> str:
        """The dtype the matmuls run in: the model's, where the chip has a peak for it."""
        return self.model.dtype if self.model.dtype in self.chip.tflops else "bf16"

    def problems(self) -> list[str]:
        return []

    def describe(self) -> dict[str, Any]:
        """How steps are priced, for a run's output: the entries, with their sources."""
        return {
            "kind": "roofline",
            "model": self.model.name,
            "model_source": self.model.source,
            "chip": self.chip.name,
            "chip_source": self.chip.source,
            "parallel": self.parallel,
            "method": self.method,
            "draft_model": self.drafter.model.name if self.drafter is not None else None,
            "draft_layers": self.draft_layers if self.method in LAYER_DRAFTERS else None,
            "efficiency": self.efficiency.model_dump(),
            "weights_gb": self.weights_bytes() / 1e9,
            "kv_cache_tokens": self.kv_tokens(),
        }

    @functools.cached_property
    def _k(self) -> _Constants:
        return _Constants.of(self)

    def _peak(self, tokens: Any) -> Any:
        k = self._k
        if k.curve is None:
            return k.peak
        t = np.log(np.maximum(tokens, 1.0))
        return 1e12 * np.interp(t, k.curve[0], k.curve[1])

    def _linear(
        self, tokens: Any, flops: float, dense_read: float, expert_read: float, peak: Any
    ) -> Any:
        """The matmuls of one forward over ``tokens`` tokens: max of compute and reading each
        weight once (the routed experts the tokens touch)."""
        k = self._k
        read = dense_read + expert_read * self.shape.touched(tokens)
        return np.maximum(flops * tokens / (peak * k.compute), read / k.memory)

    def _all_reduce(self, tokens: Any) -> Any:
        """Two ring all-reduces a layer of ``tokens`` activations (none on one chip)."""
        k = self._k
        return k.wire * tokens + k.latency

    def forward(self, query_tokens: Any, requests: Any, context_tokens: Any) -> Any:
        """One target forward, without the step's overheads."""
        k = self._k
        q = np.asarray(query_tokens, dtype=float)
        c = np.asarray(context_tokens, dtype=float)
        mean_context = c / np.maximum(requests, 1.0)
        peak = self._peak(q)
        linear = self._linear(q, k.flops, k.dense_read, k.expert_read, peak)
        attention = np.maximum(
            k.pair * q * mean_context / (peak * k.compute), k.kv_bytes * c / k.kv_memory
        )
        return linear + attention + self._all_reduce(q)

    def verify(self, query_tokens: Any, requests: Any, context_tokens: Any) -> Any:
        e = self.efficiency
        return _plain(
            e.overhead
            + e.per_sequence * np.asarray(requests, dtype=float)
            + self.forward(query_tokens, requests, context_tokens)
        )

    def prefill(self, query_tokens: Any, requests: Any, context_tokens: Any) -> Any:
        return self.verify(query_tokens, requests, context_tokens)

    def draft(self, requests: Any) -> Any:
        """One drafter forward over ``requests`` drafting requests (one query token each)."""
        r = np.asarray(requests, dtype=float)
        if self.method in FREE_DRAFTERS or self.method is None:
            return _plain(0.0 * r)
        if self.drafter is not None:
            return _plain(self.drafter.forward(r, r, 0.0))
        k = self._k
        layers = self.draft_layers / self.shape.layers
        linear = self._linear(
            r, k.draft_flops, k.draft_dense_read, layers * k.expert_read, self._peak(r)
        )
        return _plain(linear + layers * self._all_reduce(r))

    def decode(
        self, query_tokens: Any, requests: Any, context_tokens: Any, drafting: Any, k: int
    ) -> Any:
        """A decode step: the verify forward, and K drafter forwards over its ``drafting``
        requests, none when no request drafts."""
        drafter = k * (np.asarray(drafting) > 0) * self.draft(drafting)
        return _plain(self.verify(query_tokens, requests, context_tokens) + drafter)

    def weights_bytes(self) -> float:
        draft = self.drafter.shape.weights_bytes() if self.drafter is not None else 0.0
        layers = (
            self.draft_layers * self.shape.layer_bytes(1) if self.method in LAYER_DRAFTERS else 0
        )
        return self.shape.weights_bytes() + draft + layers

    @property
    def kv_shards(self) -> int:
        """The pieces the chips split a token's KV into: each chip holds and reads one. GQA
        splits by KV head, up to its KV heads (past them a rank keeps a copy of one head); MLA's
        latent is one piece every rank holds whole."""
        return min(self.parallel, self.shape.kv_shards)

    def kv_tokens(self) -> int:
        """Tokens of KV cache the chips hold beyond the weights (0 when the weights do not
        fit): each chip holds an equal share of the weights and one shard of every token's KV."""
        tp = self.parallel
        free = self.chip.memory_gb * 1e9 * self.efficiency.memory_utilization * tp
        free -= self.weights_bytes()
        per_token = self.shape.kv_bytes_per_token * tp / self.kv_shards
        if free <= 0:
            return 0
        return math.floor(free / per_token) if per_token > 0 else MAX_KV_TOKENS
