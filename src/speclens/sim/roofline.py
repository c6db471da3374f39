"""Steps priced from physics: a model's architecture on a chip, by a roofline.

A step of T query tokens over C context tokens of R sequences, on P = ``parallel`` chips
(tensor parallel), costs

    overhead + (per_sequence * R + per_token * T) / ranks (a decode step's T; none for a prefill)
    + max(T * (F_dense / peak(T) + F_experts / peak_experts(T)) / e_c,
          weight_bytes_read(T) / (bandwidth * e_m))
    + max(attention_flops(T, C / R) / (peak * e_c),  kv_bytes_per_token * C / (bandwidth * e_m))
    + N_ar * (ring all-reduce of T * hidden activations + latency)           (P > 1)
    + N_a2a * (all-to-all of T tokens' activations to their experts + 2 latencies)  (EP > 1)

each compute and memory term divided over the chips, but the KV cache's reads: those over the
shards the KV splits in, min(P, KV heads) for GQA (a rank past the KV heads keeps a copy of
one), 1 for MLA (every rank holds the whole latent), P under DP attention (each rank keeps its
own sequences'). Attention runs over each sequence's own context: C / R, the batch's mean, not
the batch's total C. peak(T) is the chip's peak at the model's dtype, or, for a chip
``calibrate --host`` measured, its matmul FLOP/s at T tokens (interpolated on the measured
curve); FP4 routed experts (``catalog.with_precision``) run at the chip's FP4 peak, its FP8 peak
where it has none. The weights are read once per step: all of a dense model's, and of a mixture
of experts the shared parts plus the routed experts the T tokens touch (E * (1 - (1 - a / E)^T)
per layer, for uniform routing), so a MoE step's bytes grow with its batch; under DP attention
every rank reads every attention weight. Collectives: two all-reduces a layer (attention's and
the MLP's, N_ar = 2 x layers); under DP attention none for attention; under expert parallelism
(EP > 1) a MoE layer's MLP all-reduce becomes an all-to-all dispatch and combine (N_a2a = MoE
layers), 2 T a (EP - 1) / EP hidden activations through the P chips' links. A collective wider
than the chip's scale-up domain (``ChipSpec.scale_up_domain``, D) runs at its scale-out
bandwidth (``scale_out_gbps``): the all-reduces where P exceeds it; an all-to-all over EP > D
ranks sends (EP - D) / (EP - 1) of a token's remote activations over the network and the rest
over the fabric at once, the slower share setting its pace.
The engine's per-request and per-token work runs on each scheduler at once: ``ranks`` is P
under DP attention (every attention rank schedules its own share), else 1.

A speculating sequence's verify step carries K + 1 query tokens. The drafter runs K forwards
over the d requests that draft: a ``draft_model`` is priced as that model's own step; ``mtp`` on
a model with MTP layers as its own MTP layer (a whole decoder layer: attention, shared experts,
router, ``eh_proj`` and the routed experts the d tokens touch, its collectives and its
attention over the drafting requests' contexts) plus the target's LM head, its weights already
the model's and its one layer of KV a token kept beside the target's; ``eagle``, ``eagle3``,
``dspark`` (and ``mtp`` on a model without MTP layers) as ``draft_layers`` average layers of
the target's width plus its LM head; ``ngram`` is free. A step of chunked prefill mixed with
decodes (``mixed``) reads the weights once for all its tokens. KV capacity is what the chips'
memory holds beyond the weights, each chip holding an equal share of the weights and one shard
of every token's KV (``kv_tokens``); the engine reserves K + 1 slots a sequence in it.

The efficiencies and the overhead are what ``speclens calibrate`` fits; the defaults are a
chip's own (``ChipSpec.efficiency``, fitted on published runs) or, without, typical of a tuned
engine, not measured here. The fast path prices each distinct step shape once: the terms that
depend on the query-token count alone (and the drafter's on the drafting count) are tables,
built lazily to the largest count seen (a call of few shapes against a wide table prices just
its own); the rest is linear in the context.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speclens.sim.catalog import BYTES, ChipSpec, Efficiency, ModelSpec

#: Methods whose drafter is a few extra layers of the target's width (``draft_layers``).
LAYER_DRAFTERS = frozenset({"eagle", "eagle3", "mtp", "dspark"})
#: Methods whose drafter costs no forward pass.
FREE_DRAFTERS = frozenset({"ngram"})
#: Bytes of an activation crossing the interconnect (bf16).
ACTIVATION_BYTES = 2.0

#: KV capacity of a model whose attention keeps no per-token KV.
MAX_KV_TOKENS = 1 << 40

__all__ = ["Efficiency", "Roofline", "Shape"]


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
    full_layers: int  # the layers that keep per-token KV

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
            full_layers=full,
        )

    def dense_part(self) -> float:
        """Parameters every token runs through, but the routed experts: attention, dense MLPs,
        shared experts, routers and the LM head."""
        moe = self.moe_layers * (self.shared * self.expert + self.moe_fixed)
        return self.layers * self.attention + self.dense_layers * self.dense_mlp + moe

    def parameters(self) -> float:
        """Every parameter but the MTP layers' (as model cards count them)."""
        return self.dense_part() + self.embeddings + self.moe_layers * self.routed * self.expert

    def mtp_dense(self) -> float:
        """Parameters of one MTP layer that every token it drafts runs through: a decoder
        layer's attention and MLP (a MoE layer's shared experts and router, its routed experts
        aside; the last layer's kind) and its projection of the embedding and the hidden state
        (``eh_proj``, 2 h x h). Its norms are a few vectors; the embedding and the LM head are
        the target's."""
        mlp = self.shared * self.expert + self.moe_fixed if self.moe_layers else self.dense_mlp
        return self.attention + mlp + 2 * self.hidden * self.hidden

    def mtp_bytes(self) -> float:
        """One MTP layer's weights held in memory: every routed expert of it."""
        routed = self.routed * self.expert * self.expert_bytes if self.moe_layers else 0.0
        return self.mtp_dense() * self.weight_bytes + routed

    def weights_bytes(self) -> float:
        """Every weight held in memory (MTP layers included, each a whole decoder layer)."""
        routed = self.moe_layers * self.routed * self.expert * self.expert_bytes
        dense = (self.dense_part() + self.embeddings) * self.weight_bytes
        return float(dense + routed + self.mtp_layers * self.mtp_bytes())

    def attention_bytes(self) -> float:
        """Every layer's attention weights (what DP attention replicates on each rank)."""
        return self.layers * self.attention * self.weight_bytes

    def kv_bytes_per_layer(self) -> float:
        """One full-attention layer's KV a token (an MTP layer keeps as much while it drafts)."""
        return self.kv_bytes_per_token / self.full_layers if self.full_layers else 0.0

    def pair_per_layer(self) -> float:
        """One full-attention layer's attention FLOPs per query and context token."""
        return self.attention_flops_per_pair / self.full_layers if self.full_layers else 0.0

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


def _matmul_dtype(chip: ChipSpec, dtype: str) -> str:
    """The dtype matmuls over ``dtype`` weights run at on ``chip``: their own where the chip has a
    peak for it, FP4 at FP8 where it has no FP4 peak, else bf16 (every chip has it)."""
    if dtype in chip.tflops:
        return dtype
    if dtype == "fp4" and "fp8" in chip.tflops:
        return "fp8"
    return "bf16"


def _peak_of(chip: ChipSpec, dtype: str) -> tuple[float, tuple[np.ndarray, np.ndarray] | None]:
    """The chip's peak FLOP/s at ``dtype``, and, for a chip ``calibrate --host`` measured, the
    curve of its matmul TFLOP/s by log tokens."""
    raw = ((chip.measured or {}).get("matmul_tflops_by_tokens") or {}).get(dtype)
    curve = None
    if raw:
        widths = sorted(int(w) for w in raw)
        curve = (np.log(widths), np.array([float(raw[str(w)]) for w in widths]))
    return 1e12 * float(chip.tflops[dtype]), curve  # type: ignore[index]


@dataclass(frozen=True)
class _Constants:
    """A roofline's numbers, worked out once: the fast path prices a stretch of steps per call,
    many thousand calls a run."""

    peak: float  # FLOP/s (the datasheet's, or the measured curve's best)
    curve: tuple[np.ndarray, np.ndarray] | None  # log tokens, TFLOP/s: a measured chip's curve
    #: The routed experts' matmuls' peak and curve where they run at another dtype (None: ``peak``).
    expert_peak: float | None
    expert_curve: tuple[np.ndarray, np.ndarray] | None
    compute: float  # e_c x chips
    memory: float  # bandwidth x e_m x chips
    kv_memory: float  # bandwidth x e_m x the shards the chips split the KV cache in
    flops: float  # per token through the linear layers
    expert_flops: float  # the routed experts' share of ``flops``
    dense_read: float  # bytes read once a step but the routed experts
    expert_read: float  # bytes of one routed expert, over every MoE layer
    pair: float  # attention FLOPs per query and context token
    kv_bytes: float  # per context token
    wire: float  # collective seconds per token, every layer
    latency: float  # collective latency, every layer
    draft_flops: float  # a layer drafter's forward, per token
    draft_expert_flops: float
    draft_dense_read: float
    draft_expert_read: float  # bytes of one routed expert over the drafter's layers
    draft_scale: float  # the drafter's collectives: draft_scale x (draft_wire x r + draft_latency)
    draft_wire: float
    draft_latency: float
    draft_pair: float  # an MTP drafter's attention FLOPs per query and context token
    draft_kv: float  # an MTP drafter's KV bytes per context token

    @classmethod
    def of(cls, roof: Roofline) -> _Constants:
        s, e, tp, chip = roof.shape, roof.efficiency, roof.parallel, roof.chip
        ep, dpa = roof.expert_parallel, roof.dp_attention
        peak, curve = _peak_of(chip, roof.dtype)
        expert_peak, expert_curve = None, None
        if roof.expert_dtype != roof.dtype:
            expert_peak, expert_curve = _peak_of(chip, roof.expert_dtype)
        bandwidth = 1e12 * chip.memory_bandwidth_tbps
        # A collective over more chips than one scale-up fabric joins runs at the network's
        # pace: the all-reduce over the ``tp`` chips, the all-to-all over the ``ep`` ranks.
        link = 1e9 * chip.link_gbps(tp) * e.interconnect
        a2a_link = 1e9 * _a2a_gbps(chip, ep) * e.interconnect
        many = tp > 1
        # Collectives: attention's all-reduce (none under DP attention) and each MLP's, but a
        # MoE layer's under expert parallelism: its all-to-all dispatch and combine instead.
        a2a_layers = s.moe_layers if ep > 1 else 0
        ar_layers = (0 if dpa else s.layers) + s.layers - a2a_layers
        ring = ar_layers * 2 * (tp - 1) / tp * s.hidden * ACTIVATION_BYTES / link
        a2a = _a2a(s, ep, tp) / a2a_link
        layer_flops = (s.flops_per_token() - 2 * s.lm_head) / s.layers
        layer_dense = (s.dense_part() * s.weight_bytes) / s.layers
        lm_read = s.lm_head * s.weight_bytes
        expert_flops = 2 * s.moe_layers * s.per_token * s.expert
        expert_read = s.moe_layers * s.expert * s.expert_bytes
        dense_read = (s.dense_part() + s.lm_head) * s.weight_bytes
        replicated = (tp - 1) * s.attention * s.weight_bytes  # a layer's, DP attention
        if dpa:  # every rank reads every attention weight
            dense_read += s.layers * replicated
        n = roof.draft_layers
        if roof.mtp_drafter:  # the model's own MTP layer: a whole decoder layer, and the LM head
            moe = s.moe_layers > 0
            expert = 2 * s.per_token * s.expert if moe else 0.0
            mtp_a2a = 1 if ep > 1 and moe else 0
            mtp_ar = (0 if dpa else 1) + 1 - mtp_a2a
            draft = dict(
                draft_flops=n * (2 * s.mtp_dense() + expert) + 2 * s.lm_head,
                draft_expert_flops=n * expert,
                draft_dense_read=n * (s.mtp_dense() * s.weight_bytes + dpa * replicated) + lm_read,
                draft_expert_read=n * s.expert * s.expert_bytes if moe else 0.0,
                draft_scale=float(n),
                draft_wire=(mtp_ar * 2 * (tp - 1) / tp * s.hidden * ACTIVATION_BYTES / link
                            + mtp_a2a * _a2a(s, ep, tp) / max(s.moe_layers, 1) / a2a_link),
                draft_latency=(mtp_ar + 2 * mtp_a2a) * e.all_reduce_latency if many else 0.0,
                draft_pair=n * s.pair_per_layer(),
                draft_kv=n * s.kv_bytes_per_layer(),
            )  # fmt: skip
        else:  # draft_layers average layers of the target's width
            layers = n / s.layers
            draft = dict(
                draft_flops=n * layer_flops + 2 * s.lm_head,
                draft_expert_flops=layers * expert_flops,
                draft_dense_read=n * layer_dense + lm_read + (n * replicated if dpa else 0.0),
                draft_expert_read=layers * expert_read,
                draft_scale=layers,
                draft_wire=ring + a2a,
                draft_latency=(ar_layers + 2 * a2a_layers) * e.all_reduce_latency if many else 0.0,
                draft_pair=0.0,
                draft_kv=0.0,
            )
        return cls(
            peak=peak,
            curve=curve,
            expert_peak=expert_peak,
            expert_curve=expert_curve,
            compute=e.compute * tp,
            memory=bandwidth * e.memory * tp,
            kv_memory=bandwidth * e.memory * roof.kv_shards,
            flops=s.flops_per_token(),
            expert_flops=expert_flops,
            dense_read=dense_read,
            expert_read=expert_read,
            pair=s.attention_flops_per_pair,
            kv_bytes=s.kv_bytes_per_token,
            wire=ring + a2a,
            latency=(ar_layers + 2 * a2a_layers) * e.all_reduce_latency if many else 0.0,
            **draft,
        )


def _a2a_gbps(chip: ChipSpec, ep: int) -> float:
    """The bandwidth an all-to-all over ``ep`` ranks runs at: the scale-up fabric's within one
    domain; past it a token's remote experts sit on another node for (EP - D) / (EP - 1) of
    them, which cross the network while the rest stay on the fabric, both at once: the slower
    share sets the pace."""
    domain, out = chip.scale_up_domain, chip.scale_out_gbps
    if domain is None or out is None or ep <= domain:
        return chip.interconnect_gbps
    crossing = (ep - domain) / (ep - 1)
    return 1.0 / max((1 - crossing) / chip.interconnect_gbps, crossing / out)


def _a2a(s: Shape, ep: int, tp: int) -> float:
    """Bytes through each chip's link a token, every MoE layer, under expert parallelism: the
    step's tokens' activations dispatched to their experts' ranks and combined back (2 x), each
    token to its ``per_token`` experts, (EP - 1) / EP of them on another rank, the sending spread
    over the ``tp`` chips."""
    if ep <= 1:
        return 0.0
    return s.moe_layers * 2 * s.per_token * s.hidden * ACTIVATION_BYTES * (ep - 1) / ep / tp


def _plain(value: Any) -> Any:
    """A float for one step (as ``StepCost`` gives), the array for many."""
    return float(value) if np.ndim(value) == 0 else value


#: The largest query-token count the fast path keeps a price table for (past it: the formula).
MAX_TABLE = 1 << 17
#: A call whose counts number under 1/FEW_SHAPES of the table it would need prices just their
#: distinct counts instead of building the table.
FEW_SHAPES = 8
#: Distinct rooflines whose tables a process keeps: the points of a sweep or a K schedule price
#: with equal rooflines (K aside, which the tables take per call), each built anew, and share
#: their tables through this; a fit trying new efficiencies evicts the oldest.
SHARED_TABLES = 4
_SCALARS = (int, float, np.integer, np.floating)
_shared: dict[str, list[_Tables]] = {}


class _Tables:
    """Each distinct step shape's terms priced once: by query-token count (the forward's linear
    layers, its collectives and the step overhead; attention's compute per mean-context token)
    and by drafting-request count (K drafter forwards). Grown lazily to the largest count seen;
    or, for one call of few shapes, over just their counts (``counts``: looked up by position,
    ``index``)."""

    def __init__(self, roof: Roofline, size: int, counts: np.ndarray | None = None) -> None:
        k, e = roof._k, roof.efficiency
        n = np.arange(size) if counts is None else counts
        q = n.astype(float)
        peak = roof._peak(q)
        self.size = size
        self.counts = counts
        self.base = e.overhead + (
            roof._linear(q, k.flops, k.expert_flops, k.dense_read, k.expert_read, peak)
            + (k.wire * q + k.latency)
        )
        self.attention = k.pair * q / (peak * k.compute)
        self.kv: float = k.kv_bytes / k.kv_memory
        self.draft = (n > 0) * roof.draft(q)
        self.mtp = None
        if k.draft_pair or k.draft_kv:
            self.mtp = (n > 0) * roof._draft_attention(q, 1.0)
        self.by_k: dict[int, tuple[np.ndarray, np.ndarray | None, list[float], list[float]]] = {}
        self.base_list: list[float] = self.base.tolist()
        self.attention_list: list[float] = self.attention.tolist()

    def index(self, values: np.ndarray) -> np.ndarray:
        """Where each count's terms are: the count itself, or its position among ``counts``."""
        return values if self.counts is None else np.searchsorted(self.counts, values)

    def for_k(self, k: int) -> tuple[np.ndarray, np.ndarray | None, list[float], list[float]]:
        found = self.by_k.get(k)
        if found is None:
            draft = k * self.draft
            mtp = k * self.mtp if self.mtp is not None else None
            mtp_list = mtp.tolist() if mtp is not None else []
            found = self.by_k[k] = (draft, mtp, draft.tolist(), mtp_list)
        return found


def _count(value: Any) -> int | None:
    """``value`` as a table index where it is a whole number of tokens (else None)."""
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return int(value)
    return None


def _counts(value: np.ndarray) -> np.ndarray | None:
    """``value`` as an array of table indexes where every element is a whole number >= 0."""
    if value.dtype.kind in "iu":
        return value
    if value.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            whole = value.astype(np.int64)
        if (whole == value).all():
            return whole
    return None


@dataclass(frozen=True, init=False)
class Roofline:
    """A step cost (the interface ``StepCost`` has) priced from a model on a chip.

    ``parallel`` chips split each step (tensor parallel; with ``dp_attention``, attention runs
    data parallel: each rank its own share of the batch over its own KV, the attention weights
    replicated); ``expert_parallel`` > 1 spreads the routed experts over that many ranks, whose
    MoE layers trade the all-reduce for an all-to-all. ``efficiency`` None takes the chip's
    defaults (``ChipSpec.efficiency``), else the global ones."""

    model: ModelSpec
    chip: ChipSpec
    parallel: int = 1
    method: str | None = None
    draft_layers: int = 1
    drafter: Roofline | None = None  # a draft_model's own roofline
    efficiency: Efficiency = field(default_factory=Efficiency)
    expert_parallel: int = 1
    dp_attention: bool = False

    def __init__(
        self,
        model: ModelSpec,
        chip: ChipSpec,
        parallel: int = 1,
        method: str | None = None,
        draft_layers: int = 1,
        drafter: Roofline | None = None,
        efficiency: Efficiency | None = None,
        expert_parallel: int = 1,
        dp_attention: bool = False,
    ) -> None:
        if efficiency is None:  # the chip's defaults, else the global ones
            efficiency = chip.efficiency or Efficiency()
        values = dict(model=model, chip=chip, parallel=parallel, method=method,
                      draft_layers=draft_layers, drafter=drafter, efficiency=efficiency,
                      expert_parallel=expert_parallel, dp_attention=dp_attention)  # fmt: skip
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @functools.cached_property
    def shape(self) -> Shape:
        return Shape.of(self.model)

    @property
    def dtype(self) -> str:
        """The dtype the matmuls run in: the model's, where the chip has a peak for it."""
        return _matmul_dtype(self.chip, self.model.dtype)

    @property
    def expert_dtype(self) -> str:
        """The dtype the routed experts' matmuls run in: an FP4 checkpoint's at the chip's FP4
        peak (its FP8 peak where it has none), else as the rest of the model."""
        e = self.model.experts
        if e is None or e.matmul_dtype is None:
            return self.dtype
        return _matmul_dtype(self.chip, e.matmul_dtype)

    @property
    def mtp_drafter(self) -> bool:
        """Whether the drafter is the model's own MTP layer (method ``mtp`` on a model that has
        one): one whole decoder layer and the target's LM head, its weights the model's."""
        return self.method == "mtp" and self.shape.mtp_layers > 0

    def problems(self) -> list[str]:
        found = []
        if not 1 <= self.expert_parallel <= self.parallel:
            found.append(f"expert_parallel: expected 1..{self.parallel} (parallel), got "
                         f"{self.expert_parallel}")  # fmt: skip
        elif self.expert_parallel > 1 and not self.shape.moe_layers:
            found.append(f"expert_parallel: {self.model.name} has no routed experts to spread")
        return found

    def describe(self) -> dict[str, Any]:
        """How steps are priced, for a run's output: the entries, with their sources."""
        return {
            "kind": "roofline",
            "model": self.model.name,
            "model_source": self.model.source,
            "chip": self.chip.name,
            "chip_source": self.chip.source,
            "parallel": self.parallel,
            "expert_parallel": self.expert_parallel,
            "dp_attention": self.dp_attention,
            "dtype": self.dtype,
            "expert_dtype": self.expert_dtype if self.shape.moe_layers else None,
            "method": self.method,
            "draft_model": self.drafter.model.name if self.drafter is not None else None,
            "draft_layers": self.draft_layers if self.method in LAYER_DRAFTERS else None,
            "efficiency": self.efficiency.model_dump(),
            "efficiency_source": (
                "chip"
                if self.efficiency == self.chip.efficiency
                else "default"
                if self.efficiency == Efficiency()
                else "stated"
            ),
            "weights_gb": self.weights_bytes() / 1e9,
            "kv_cache_tokens": self.kv_tokens(),
        }

    @property
    def _ranks(self) -> int:
        """The schedulers a step's per-request work runs on at once: each DP-attention rank
        runs its own (its share of the requests), else one for the whole step."""
        return self.parallel if self.dp_attention else 1

    @property
    def _seq(self) -> float:
        return self.efficiency.per_sequence / self._ranks

    @functools.cached_property
    def _k(self) -> _Constants:
        return _Constants.of(self)

    def _peak(self, tokens: Any) -> Any:
        k = self._k
        if k.curve is None:
            return k.peak
        t = np.log(np.maximum(tokens, 1.0))
        return 1e12 * np.interp(t, k.curve[0], k.curve[1])

    def _expert_peak(self, tokens: Any) -> Any:
        k = self._k
        if k.expert_curve is None:
            return k.expert_peak
        t = np.log(np.maximum(tokens, 1.0))
        return 1e12 * np.interp(t, k.expert_curve[0], k.expert_curve[1])

    def _linear(
        self,
        tokens: Any,
        flops: float,
        expert_flops: float,
        dense_read: float,
        expert_read: float,
        peak: Any,
    ) -> Any:
        """The matmuls of one forward over ``tokens`` tokens: max of compute (the routed
        experts' share at their own peak where it differs) and reading each weight once (the
        routed experts the tokens touch)."""
        k = self._k
        read = dense_read + expert_read * self.shape.touched(tokens)
        if k.expert_peak is None:
            compute = flops * tokens / (peak * k.compute)
        else:
            per_token = (flops - expert_flops) / peak + expert_flops / self._expert_peak(tokens)
            compute = per_token * tokens / k.compute
        return np.maximum(compute, read / k.memory)

    def _collectives(self, tokens: Any) -> Any:
        """Every layer's collectives over ``tokens`` activations (none on one chip): two ring
        all-reduces a layer (attention's, none under DP attention, and the MLP's), a MoE
        layer's all-to-all dispatch and combine instead under expert parallelism."""
        k = self._k
        return k.wire * tokens + k.latency

    def forward(self, query_tokens: Any, requests: Any, context_tokens: Any) -> Any:
        """One target forward, without the step's overheads."""
        k = self._k
        q = np.asarray(query_tokens, dtype=float)
        c = np.asarray(context_tokens, dtype=float)
        mean_context = c / np.maximum(requests, 1.0)
        peak = self._peak(q)
        linear = self._linear(q, k.flops, k.expert_flops, k.dense_read, k.expert_read, peak)
        attention = np.maximum(
            k.pair * q * mean_context / (peak * k.compute), k.kv_bytes * c / k.kv_memory
        )
        return linear + attention + self._collectives(q)

    # ------------------------------------------------------------ the formulas, plainly
    def _verify_formula(
        self, query_tokens: Any, requests: Any, context_tokens: Any, per_token: float
    ) -> Any:
        e = self.efficiency
        return _plain(
            e.overhead
            + self._seq * np.asarray(requests, dtype=float)
            + per_token / self._ranks * np.asarray(query_tokens, dtype=float)
            + self.forward(query_tokens, requests, context_tokens)
        )

    def _draft_attention(self, drafting: Any, mean_context: Any) -> Any:
        """An MTP drafter forward's attention: ``drafting`` query tokens over their own
        contexts (``mean_context`` each), one layer's FLOPs and one layer's KV read (0 for
        other drafters)."""
        k = self._k
        d = np.asarray(drafting, dtype=float)
        return np.maximum(
            k.draft_pair * d * mean_context / (self._peak(d) * k.compute),
            k.draft_kv * d * mean_context / k.kv_memory,
        )

    def _drafter_formula(self, requests: Any, context_tokens: Any, drafting: Any, k: int) -> Any:
        """K drafter forwards over the step's ``drafting`` requests (none when none drafts)."""
        d = np.asarray(drafting)
        price = self.draft(drafting)
        if self._k.draft_pair or self._k.draft_kv:
            mean_context = np.asarray(context_tokens, dtype=float) / np.maximum(requests, 1.0)
            price = price + self._draft_attention(d, mean_context)
        return k * (d > 0) * price

    def _decode_formula(
        self, query_tokens: Any, requests: Any, context_tokens: Any, drafting: Any, k: int
    ) -> Any:
        drafter = self._drafter_formula(requests, context_tokens, drafting, k)
        verify = self._verify_formula(
            query_tokens, requests, context_tokens, self.efficiency.per_token
        )
        return _plain(verify + drafter)

    def terms(
        self, query_tokens: float, requests: float, context_tokens: float, drafting: float, k: int
    ) -> dict[str, float]:
        """A decode step's price split into the terms ``decode``'s formula adds (their sum is
        that formula's price; nothing here changes a price): ``verify_width`` the verify
        forward's weights, matmuls, collectives and overheads for its ``query_tokens``;
        ``kv_reads`` its attention over ``context_tokens`` (KV read or pair FLOPs, the larger);
        ``drafter`` the K drafter forwards."""
        kk, e = self._k, self.efficiency
        q, r, c = float(query_tokens), float(requests), float(context_tokens)
        peak = self._peak(q)
        linear = self._linear(q, kk.flops, kk.expert_flops, kk.dense_read, kk.expert_read, peak)
        attention = np.maximum(
            kk.pair * q * (c / max(r, 1.0)) / (peak * kk.compute), kk.kv_bytes * c / kk.kv_memory
        )
        width = (e.overhead + self._seq * r + e.per_token / self._ranks * q + linear
                 + self._collectives(q))  # fmt: skip
        drafter = self._drafter_formula(r, c, drafting, k)
        return {
            "verify_width": float(width),
            "kv_reads": float(attention),
            "drafter": float(drafter),
        }

    # ------------------------------------------------------------ priced by table
    @functools.cached_property
    def _cache(self) -> list[_Tables]:
        """The tables, shared with every equal roofline this process built lately (the last
        ``SHARED_TABLES``): they are a function of what it was built from."""
        key = self._key
        found = _shared.pop(key, None)
        _shared[key] = found if found is not None else []
        while len(_shared) > SHARED_TABLES:
            del _shared[next(iter(_shared))]
        return _shared[key]

    @functools.cached_property
    def _key(self) -> str:
        """What the roofline was built from, as text."""
        parts = [self.model.model_dump_json(), self.chip.model_dump_json(), str(self.parallel),
                 str(self.method), str(self.draft_layers), self.efficiency.model_dump_json(),
                 str(self.expert_parallel), str(self.dp_attention),
                 self.drafter._key if self.drafter is not None else ""]  # fmt: skip
        return "\n".join(parts)

    def _tables(self, largest: int) -> _Tables | None:
        """The tables, grown to hold ``largest`` (None past ``MAX_TABLE``: the formula)."""
        cache = self._cache
        if cache and largest < cache[0].size:
            return cache[0]
        if largest >= MAX_TABLE or largest < 0:
            return None
        size = 1 << max(8, int(largest).bit_length())
        cache[:] = [_Tables(self, size)]
        return cache[0]

    def _fast(self, q: Any, r: Any, c: Any, d: Any, k: int, per_token: float) -> Any:
        """The price from the tables: a float, an array, or None where they cannot price it
        (counts that are not whole numbers, past ``MAX_TABLE``, or not all arrays or all
        scalars); ``d`` None prices no drafter; ``per_token`` a query token's price beyond the
        roofline (a decode step's; 0 for a prefill). Counts are >= 0, as everywhere."""
        if type(q) is np.ndarray:
            if type(r) is not np.ndarray or type(c) is not np.ndarray or not q.size:
                return None
            if q.dtype.kind not in "iu" and (q := _counts(q)) is None:
                return None
            largest = q.max()
            drafts = d is not None and k != 0
            if drafts:
                if type(d) is not np.ndarray:
                    return None
                if d.dtype.kind not in "iu" and (d := _counts(d)) is None:
                    return None
                largest = max(largest, d.max())
            cache = self._cache
            table: _Tables | None
            if cache and largest < cache[0].size:
                table = cache[0]
            elif (q.size + (d.size if drafts else 0)) * FEW_SHAPES < largest < MAX_TABLE:
                # Few shapes against a table this wide (a fit's new roofline per trial, pricing
                # a few hundred stretches once): their own terms, no table kept.
                shapes = np.unique(np.concatenate([q, d]) if drafts else q)
                table = _Tables(self, len(shapes), shapes)
            else:
                table = self._tables(int(largest))
            if table is None:
                return None
            qx = table.index(q)
            requests = np.maximum(r, 1)
            if not drafts:
                return (
                    table.base[qx]
                    + self._seq * r
                    + per_token / self._ranks * q
                    + c * np.maximum(table.attention[qx] / requests, table.kv)
                )
            draft, mtp, _, _ = table.for_k(k)
            dx = table.index(d)
            if mtp is None:
                return (
                    table.base[qx]
                    + self._seq * r
                    + per_token / self._ranks * q
                    + c * np.maximum(table.attention[qx] / requests, table.kv)
                    + draft[dx]
                )
            mean_context = c / requests
            return (
                table.base[qx]
                + self._seq * r
                + per_token / self._ranks * q
                + np.maximum(table.attention[qx] * mean_context, table.kv * c)
                + (draft[dx] + mtp[dx] * mean_context)
            )
        plain = d is None or k == 0 or (type(d) is int and d >= 0)
        if type(q) is int and type(r) is int and type(c) is int and q >= 0 and plain:
            return self._scalar(q, r, c, d if k != 0 else None, k, per_token)  # the common call
        if not isinstance(q, _SCALARS) or not isinstance(r, _SCALARS):
            return None
        if not isinstance(c, _SCALARS):
            return None
        drafts = d is not None and k != 0
        qi, di = _count(q), (_count(d) if drafts and isinstance(d, _SCALARS) else 0)
        if qi is None or di is None or qi < 0 or di < 0:
            return None
        t = self._tables(max(qi, di))
        if t is None:
            return None
        context: float = float(c) / max(float(r), 1.0)  # a sequence's, the batch's mean
        price: float = (
            t.base_list[qi]
            + self._seq * float(r)
            + per_token / self._ranks * qi
            + max(t.attention_list[qi] * context, t.kv * float(c))
        )
        if drafts:
            _, mtp, draft_list, mtp_list = t.for_k(k)
            price += draft_list[di]
            if mtp is not None:
                price += mtp_list[di] * context
        return price

    def _scalar(
        self, q: int, r: int, c: int, d: int | None, k: int, per_token: float
    ) -> float | None:
        """``_fast`` on whole numbers >= 0 (``d`` None: no drafter), as its scalar branch prices
        them, without its checks: a stretch of a few decode steps is priced a step at a time."""
        cache = self._cache
        largest = q if d is None or d < q else d
        t = cache[0] if cache and largest < cache[0].size else self._tables(largest)
        if t is None:
            return None
        context = c / (r if r > 1 else 1.0)  # a sequence's, the batch's mean
        price: float = (
            t.base_list[q]
            + self._seq_price * r
            + per_token / self._ranks * q
            + max(t.attention_list[q] * context, t.kv * c)
        )
        if d is not None:
            _, mtp, draft_list, mtp_list = t.for_k(k)
            price += draft_list[d]
            if mtp is not None:
                price += mtp_list[d] * context
        return price

    def decode_rows(self, rows: list[list[int]], k: int) -> list[float]:
        """``decode`` of each step of ``rows`` (its requests, context tokens and drafting
        requests: whole numbers >= 0), the same floats its scalar branch gives, in one call: a
        short stretch's steps would each pay ``decode``'s checks and three calls."""
        cache = self._cache
        prices = self._rows_priced(cache[0], rows, k) if cache else None
        if prices is None:  # a count past the tables: grow them, or price by the formula
            t = self._tables(max(s + k * d for s, _, d in rows))  # query tokens, never below d
            if t is None:
                return [float(self.decode(s + k * d, s, c, d, k)) for s, c, d in rows]
            prices = self._rows_priced(t, rows, k)
            assert prices is not None
        return prices

    def _rows_priced(self, t: _Tables, rows: list[list[int]], k: int) -> list[float] | None:
        """``decode_rows`` from table ``t``; None where a count lies past it."""
        base, attention, kv, size = t.base_list, t.attention_list, t.kv, t.size
        seq, per = self._seq_price, self._per_token_price
        _, mtp, draft, mtp_list = t.for_k(k) if k else (None, None, [], [])
        prices = []
        for s, c, d in rows:
            q = s + k * d
            if q >= size:
                return None
            context = c / (s if s > 1 else 1.0)  # a sequence's, the batch's mean
            price = base[q] + seq * s + per * q + max(attention[q] * context, kv * c)
            if k:
                price += draft[d]
                if mtp is not None:
                    price += mtp_list[d] * context
            prices.append(price)
        return prices

    @functools.cached_property
    def _per_token_price(self) -> float:
        return self.efficiency.per_token / self._ranks

    @functools.cached_property
    def _seq_price(self) -> float:
        return self._seq

    # ------------------------------------------------------------ the Pricing interface
    def verify(self, query_tokens: Any, requests: Any, context_tokens: Any) -> Any:
        return self._forward_step(query_tokens, requests, context_tokens, self.efficiency.per_token)

    def prefill(self, query_tokens: Any, requests: Any, context_tokens: Any) -> Any:
        """A prefill step: a verify step's price without ``per_token`` (prompt tokens run in
        wide matmuls: the roofline prices them)."""
        return self._forward_step(query_tokens, requests, context_tokens, 0.0)

    def _forward_step(self, q: Any, r: Any, c: Any, per_token: float) -> Any:
        fast = self._fast(q, r, c, None, 0, per_token)
        if fast is not None:
            return fast
        return self._verify_formula(q, r, c, per_token)

    def draft(self, requests: Any) -> Any:
        """One drafter forward over ``requests`` drafting requests (one query token each), its
        attention over their contexts aside (``decode`` adds an MTP layer's)."""
        r = np.asarray(requests, dtype=float)
        if self.method in FREE_DRAFTERS or self.method is None:
            return _plain(0.0 * r)
        if self.drafter is not None:
            return _plain(self.drafter.forward(r, r, 0.0))
        k = self._k
        linear = self._linear(
            r, k.draft_flops, k.draft_expert_flops, k.draft_dense_read, k.draft_expert_read,
            self._peak(r),
        )  # fmt: skip
        return _plain(linear + k.draft_scale * (k.draft_wire * r + k.draft_latency))

    def decode(
        self, query_tokens: Any, requests: Any, context_tokens: Any, drafting: Any, k: int
    ) -> Any:
        """A decode step: the verify forward, and K drafter forwards over its ``drafting``
        requests, none when no request drafts (an MTP layer's with its attention over their
        contexts)."""
        fast = self._fast(
            query_tokens, requests, context_tokens, drafting, k, self.efficiency.per_token
        )
        if fast is not None:
            return fast
        return self._decode_formula(query_tokens, requests, context_tokens, drafting, k)

    def mixed(
        self,
        decode_tokens: Any,
        decode_requests: Any,
        decode_context: Any,
        prefill_tokens: Any,
        prefill_requests: Any,
        prefill_context: Any,
        drafting: Any,
        k: int,
    ) -> Any:
        """A step of chunked prefill mixed with decodes: the verify tokens of
        ``decode_requests`` decoding sequences over ``decode_context`` context tokens in all,
        and a prompt chunk of ``prefill_tokens`` tokens of ``prefill_requests`` sequences, each
        with ``prefill_context`` prompt tokens already in its KV (their mean). The weights are
        read once for all the step's tokens; attention sums the decodes' pairs (their tokens x
        their mean context) and the chunk's (causal: p x (prefill_context + p / 2) a prompt);
        its KV read is the decodes' context and the chunks' prompts. Then the overheads, per
        sequence for all of them and per token for the decodes' (``per_token``), and the K
        drafter forwards ``decode`` prices. With no prefill it is ``decode``."""
        kk, e = self._k, self.efficiency
        qd = np.asarray(decode_tokens, dtype=float)
        rd = np.asarray(decode_requests, dtype=float)
        cd = np.asarray(decode_context, dtype=float)
        qp = np.asarray(prefill_tokens, dtype=float)
        rp = np.asarray(prefill_requests, dtype=float)
        cp = np.asarray(prefill_context, dtype=float)
        q = qd + qp
        peak = self._peak(q)
        linear = self._linear(q, kk.flops, kk.expert_flops, kk.dense_read, kk.expert_read, peak)
        pairs = qd * (cd / np.maximum(rd, 1.0)) + qp * (cp + qp / (2 * np.maximum(rp, 1.0)))
        kv_read = cd + (rp * cp + qp)
        attention = np.maximum(
            kk.pair * pairs / (peak * kk.compute), kk.kv_bytes * kv_read / kk.kv_memory
        )
        forward = linear + attention + self._collectives(q)
        verify = e.overhead + self._seq * (rd + rp) + e.per_token / self._ranks * qd + forward
        drafter = self._drafter_formula(rd, cd, drafting, k)
        return _plain(verify + drafter)

    # ------------------------------------------------------------ capacity
    def weights_bytes(self) -> float:
        """The weights the chips hold: the model's (its MTP layers included), a draft model's,
        and the layers a layer drafter adds (none for the model's own MTP layers)."""
        s = self.shape
        draft = self.drafter.shape.weights_bytes() if self.drafter is not None else 0.0
        layers = 0.0
        if self.mtp_drafter:
            layers = max(0, self.draft_layers - s.mtp_layers) * s.mtp_bytes()
        elif self.method in LAYER_DRAFTERS:
            layers = self.draft_layers * s.layer_bytes(1)
        return s.weights_bytes() + draft + layers

    @property
    def kv_shards(self) -> int:
        """The pieces the chips split a token's KV into: each chip holds and reads one. GQA
        splits by KV head, up to its KV heads (past them a rank keeps a copy of one head); MLA's
        latent is one piece every rank holds whole; under DP attention each rank keeps only its
        own sequences' KV."""
        if self.dp_attention:
            return self.parallel
        return min(self.parallel, self.shape.kv_shards)

    def kv_bytes_per_token(self) -> float:
        """KV bytes a token, all shards: the model's, and while an MTP layer drafts, its one
        layer of latent (the engine keeps the draft layer's KV beside the target's)."""
        return self.shape.kv_bytes_per_token + self._k.draft_kv

    def kv_tokens(self) -> int:
        """Tokens of KV cache the chips hold beyond the weights (0 when the weights do not
        fit): each chip holds an equal share of the weights (the attention weights whole under
        DP attention) and one shard of every token's KV."""
        tp, s = self.parallel, self.shape
        free = self.chip.memory_gb * 1e9 * self.efficiency.memory_utilization * tp
        free -= self.weights_bytes()
        if self.dp_attention:  # every rank holds every attention weight
            free -= (tp - 1) * (s.layers + s.mtp_layers) * s.attention * s.weight_bytes
        per_token = self.kv_bytes_per_token() * tp / self.kv_shards
        if free <= 0:
            return 0
        return math.floor(free / per_token) if per_token > 0 else MAX_KV_TOKENS
