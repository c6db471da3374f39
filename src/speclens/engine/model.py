"""A Llama-family decoder (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU) written
for batched decoding against a paged KV cache that the engine manages.

One forward serves prefill, target verification (K + 1 query tokens per request) and drafting:
every request contributes up to Q query tokens (padded), writes their keys and values into its
cache slots, and attends over its own context, gathered from the pool by slot index. The same
class serves target and drafter; a layer-subset drafter runs only the first ``num_layers``.
"""

from __future__ import annotations

import math
import mmap
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

#: Bounds on what a model file may claim, far above any released Llama (405B: 126 layers, width
#: 16,384, FFN 53,248, vocabulary 128,256; the largest vocabularies are about 262,144), so that a
#: claim of 10^8 layers or 10^12 tokens is refused before anything is built for it.
ARCHITECTURE_BOUNDS = {
    "vocab_size": 1 << 24,
    "hidden_size": 1 << 16,
    "intermediate_size": 1 << 20,
    "num_hidden_layers": 1024,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "max_position_embeddings": 1 << 24,
}
MAX_HEAD_DIM = 1024


class ConfigFieldError(ValueError):
    """One architecture field that is not what ``LlamaModel`` can run: ``field`` names it so a
    reader can say which key of its file holds it."""

    def __init__(self, field: str, expected: str, found: Any) -> None:
        self.field, self.expected, self.found = field, expected, found
        super().__init__(self.describe(field))

    def describe(self, name: str) -> str:
        shown = repr(self.found)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return f"{name}: expected {self.expected}, found {shown}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: Any, low: int, high: int, even: bool = False) -> None:
    if not _is_int(value) or not low <= value <= high or (even and value % 2):
        kind = "an even integer" if even else "an integer"
        raise ConfigFieldError(name, f"{kind} from {low} to {high}", value)


def _check_real(name: str, value: Any, expected: str, ok: Any) -> float:
    """``value`` as a float when it is a finite real number that ``ok`` accepts."""
    if _is_int(value) or isinstance(value, float):
        number = float(value)
        if math.isfinite(number) and ok(number):
            return number
    raise ConfigFieldError(name, expected, value)


def check_token_id(name: str, value: Any, vocab_size: int) -> None:
    """A special token id must name a row of the vocabulary (or be absent)."""
    if value is not None and not (_is_int(value) and 0 <= value < vocab_size):
        raise ConfigFieldError(
            name, f"a token id from 0 to {vocab_size - 1} (inside the vocabulary)", value
        )


@dataclass
class ModelConfig:
    """The architecture, in Hugging Face ``LlamaConfig`` terms. Every field is checked on
    construction (type and bounds), so a file's claim is refused before any tensor exists."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int = 0
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, high in ARCHITECTURE_BOUNDS.items():
            _check_int(name, getattr(self, name), 1, high)
        if not self.head_dim:
            self.head_dim = self.hidden_size // self.num_attention_heads
        _check_int("head_dim", self.head_dim, 2, MAX_HEAD_DIM, even=True)  # rotary halves
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigFieldError(
                "num_key_value_heads",
                f"a divisor of num_attention_heads {self.num_attention_heads}",
                self.num_key_value_heads,
            )
        self.rope_theta = _check_real(
            "rope_theta", self.rope_theta, "a finite number > 0", lambda x: x > 0
        )
        self.rms_norm_eps = _check_real(
            "rms_norm_eps", self.rms_norm_eps, "a finite number in (0, 1)", lambda x: 0 < x < 1
        )
        if not isinstance(self.tie_word_embeddings, bool):
            raise ConfigFieldError("tie_word_embeddings", "a boolean", self.tie_word_embeddings)
        check_token_id("bos_token_id", self.bos_token_id, self.vocab_size)
        check_token_id("eos_token_id", self.eos_token_id, self.vocab_size)

    @classmethod
    def from_hf(cls, data: dict[str, Any]) -> ModelConfig:
        """Read a Hugging Face ``config.json`` mapping of a Llama-architecture model; the values
        are passed on as found, for ``__post_init__`` to check."""
        eos = data.get("eos_token_id")
        stops = eos if isinstance(eos, list) else []  # several stop tokens: the first is ours
        # transformers >= 5 writes rope_theta inside rope_parameters
        parameters = data.get("rope_parameters")
        theta = data.get("rope_theta")
        if theta is None and isinstance(parameters, dict):
            theta = parameters.get("rope_theta")
        config = cls(
            vocab_size=data["vocab_size"],
            hidden_size=data["hidden_size"],
            intermediate_size=data["intermediate_size"],
            num_hidden_layers=data["num_hidden_layers"],
            num_attention_heads=data["num_attention_heads"],
            num_key_value_heads=data.get("num_key_value_heads") or data["num_attention_heads"],
            head_dim=data.get("head_dim") or 0,
            rope_theta=1e4 if theta is None else theta,
            rms_norm_eps=data.get("rms_norm_eps", 1e-5),
            max_position_embeddings=data.get("max_position_embeddings", 2048),
            tie_word_embeddings=data.get("tie_word_embeddings", False),
            bos_token_id=data.get("bos_token_id"),
            eos_token_id=(stops[0] if stops else None) if isinstance(eos, list) else eos,
        )
        for token in stops:  # each must be in the vocabulary
            check_token_id("eos_token_id", token, config.vocab_size)
        return config

    def to_hf(self) -> dict[str, Any]:
        """A Hugging Face ``config.json`` mapping for this architecture."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "torch_dtype": "float32",
        }


class KVPool:
    """Paged key/value storage for one model: ``num_blocks * block_size`` slots per layer, plus
    one scratch slot (the last) that padded query tokens write into."""

    def __init__(
        self,
        config: ModelConfig,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        kv_heads: int | None = None,
    ) -> None:
        """``kv_heads``: the key/value heads this process holds (a tensor-parallel shard's)."""
        self.block_size = block_size
        self.num_slots = num_blocks * block_size
        heads = config.num_key_value_heads if kv_heads is None else kv_heads
        shape = (num_layers, self.num_slots + 1, heads, config.head_dim)
        self.k = lazy_zeros(shape, dtype, device)
        self.v = lazy_zeros(shape, dtype, device)

    @property
    def scratch_slot(self) -> int:
        return self.num_slots


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros that cost nothing until written. On a CPU, a private anonymous mapping: the OS hands
    out zeroed pages as they are first touched, so a pool sized for the worst case neither takes
    seconds to fill nor holds memory it never uses (SmolLM2's default 131,072-token pool is 6 GB:
    ``torch.zeros`` took 10 to 20 s and kept all of it resident). Elsewhere ``torch.zeros``."""
    private = getattr(mmap, "MAP_PRIVATE", None)
    if device.type != "cpu" or private is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    count = math.prod(shape)
    memory = mmap.mmap(-1, max(count * dtype.itemsize, 1), flags=private)
    return torch.frombuffer(memory, dtype=dtype, count=count).view(shape)  # keeps memory alive


@dataclass
class Segment:
    """One request's share of a forward attended on its own (``ForwardBatch.segments``): its
    query rows ``rows`` (start, stop) in the flat layout, the cache slots of its context
    (``keys``: a (start, stop) range read in place, or a tensor of slots to gather) and, for more
    than one query row, the [rows, context] causal mask (None: every row sees the whole context)."""

    rows: tuple[int, int]
    keys: tuple[int, int] | torch.Tensor
    mask: torch.Tensor | None = None


@dataclass
class ForwardBatch:
    """One padded forward: B requests, up to Q query tokens each, contexts up to L tokens.

    ``input_ids``/``positions``/``write_slots`` are [B, Q] (pads: position 0, scratch slot);
    ``read_slots`` is [B, L], the cache slots of positions 0..L-1 of each request's context;
    ``mask`` is [B, 1, Q, L], True where query i may attend to context position j.
    ``read_range`` (start, stop): when B is 1 and ``read_slots`` are consecutive, attention reads
    the pool's slice in place instead of gathering a copy of the context every layer.
    ``real``: when some query rows are padding, the flat indices (b * Q + i) of the real ones.
    Everything but attention then runs on the real rows alone (a verify step where one request
    drafted 4 and seven drafted nothing computes 12 rows, not 40); attention scatters them into
    the padded [B, Q] layout and gathers them back.
    ``segments``: when queries or contexts differ so much in length that padding every request
    to the widest and longest would waste most of attention's work, each request attends over
    its own context alone (one attention call per request and layer) and ``read_slots``/``mask``
    are not built (None).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    write_slots: torch.Tensor
    read_slots: torch.Tensor | None
    mask: torch.Tensor | None
    read_range: tuple[int, int] | None = None
    real: torch.Tensor | None = None
    segments: tuple[Segment, ...] | None = None


Angles = tuple[torch.Tensor, torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(dtype)


class Rotary:
    """Rotary position embeddings (the rotate-half form Hugging Face Llama uses)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        self.head_dim = head_dim
        self.inv_freq = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        )
        self._cos = torch.empty(0)
        self._sin = torch.empty(0)

    def _tables(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self._cos.shape[0] < length or self._cos.device != device:
            size = max(length, 2 * self._cos.shape[0], 256)
            t = torch.arange(size, dtype=torch.float32)
            freqs = torch.outer(t, self.inv_freq)
            emb = torch.cat([freqs, freqs], dim=-1)
            self._cos, self._sin = emb.cos().to(device), emb.sin().to(device)
        return self._cos, self._sin

    def angles(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [..., 1, D] of ``positions`` [...] ([B, Q] or the [N] real rows); computed
        once per forward."""
        cos_t, sin_t = self._tables(int(positions.max()) + 1, positions.device)
        return cos_t[positions].unsqueeze(-2).to(dtype), sin_t[positions].unsqueeze(-2).to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _rotate_half(x) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


#: Up to this many rows, ``linear`` multiplies weight @ x.T (see ``linear``).
NARROW_ROWS = 2
#: Up to this many rows (and above ``NARROW_ROWS``), ``linear`` runs oneDNN on packed weights.
PACKED_ROWS = 256


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` for ``x`` [..., in], fast when ``x`` has few rows (decode and verify).

    With a handful of rows, MKL's ``x @ W.T`` (``F.linear``) is slow on a CPU: one row runs a
    single-threaded gemv, and 2 to 8 rows cost 1.2 to 2x one row. Measured on SmolLM2's 30
    layers, 2 threads (benchmarks/README.md):

    - 1 or 2 rows: ``W @ x.T`` streams the weights once for both (16 ms, against 35 to 54 ms
      through ``F.linear``); one row is fed as two (a zero row beside it). The result is made
      contiguous: later ops on the transposed view cost more than the copy.
    - 3 to ``PACKED_ROWS`` rows: oneDNN on the weights packed once into its blocked layout
      (``packed``): 17 to 22 ms for 3 to 8 rows, against 23 to 38 ms for ``W @ x.T`` and 36 to
      64 ms for ``F.linear``. Its values for a row do not depend on the other rows.
    - More rows (prefill), another device, a dtype other than float32, or a build without
      oneDNN: ``F.linear``.

    The values agree with ``F.linear`` to float32 rounding, not bit for bit.
    """
    rows = x.numel() // x.shape[-1]
    if rows > PACKED_ROWS or x.device.type != "cpu":
        return F.linear(x, weight)
    if x.dtype == torch.bfloat16:  # oneDNN's bf16 kernels at every width (see ``packed``)
        pack = packed(weight)
        if pack is None:
            return F.linear(x, weight)
        return torch.ops.mkldnn._linear_pointwise(x, pack, None, "none", [None], "")
    if rows > NARROW_ROWS:
        pack = packed(weight) if x.dtype == torch.float32 else None
        if pack is None:
            return F.linear(x, weight)
        return torch.ops.mkldnn._linear_pointwise(x, pack, None, "none", [None], "")
    flat = x.reshape(rows, x.shape[-1])
    if rows == 1:
        flat = torch.cat([flat, torch.zeros_like(flat)])
    out = torch.mm(weight, flat.t())[:, :rows].t().contiguous()
    return out.reshape(*x.shape[:-1], weight.shape[0])


_ONEDNN = hasattr(torch.ops.mkldnn, "_linear_pointwise") and bool(
    torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
)


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX-512 BF16 or AMX): only there does
    oneDNN's bf16 matmul beat float32 (elsewhere it converts, and runs slower)."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return _ONEDNN and any(bool(getattr(torch.cpu, name, lambda: False)()) for name in checks)


_NATIVE_BF16 = native_bf16()
#: id(weight) -> (the weight, weakly; its version and data pointer when packed; the packed copy).
_PACKED: dict[int, tuple[weakref.ref[torch.Tensor], int, int, torch.Tensor]] = {}


def packed(weight: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's packed copy of a CPU ``weight`` [out, in] (float32, or bfloat16 where the CPU
    multiplies it natively), made on first use and made again when the weight is changed in place
    (its version counter moves) or its data replaced; dropped with the weight. None where oneDNN
    is not available or the dtype is not one of those."""
    kinds = (torch.float32, torch.bfloat16) if _NATIVE_BF16 else (torch.float32,)
    if not _ONEDNN or weight.dtype not in kinds or weight.device.type != "cpu":
        return None
    key = id(weight)
    try:
        version = weight._version
    except RuntimeError:  # an inference tensor keeps no version: it cannot change outside one
        version = -1
    hit = _PACKED.get(key)
    # The data pointer catches what the version does not: ``module.to(dtype)`` swapping a
    # parameter's data (a float32 pack handed bf16 rows fails inside oneDNN).
    if hit is not None and hit[0]() is weight and hit[1:3] == (version, weight.data_ptr()):
        return hit[3]
    with torch.no_grad():
        pack = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
    gone = weakref.ref(weight, lambda _: _PACKED.pop(key, None))
    _PACKED[key] = (gone, version, weight.data_ptr(), pack)
    return pack


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        self.scale = 1.0 / math.sqrt(self.head_dim)

    def forward(
        self, x: torch.Tensor, batch: ForwardBatch, kv: KVPool, angles: Angles
    ) -> torch.Tensor:
        """``x`` is [B, Q, hidden], or [N, hidden] of the real rows when ``batch.real`` is set."""
        rows = x.shape[:-1]
        q = linear(x, self.q_proj.weight).view(*rows, self.num_heads, self.head_dim)
        k = linear(x, self.k_proj.weight).view(*rows, self.num_kv_heads, self.head_dim)
        v = linear(x, self.v_proj.weight).view(*rows, self.num_kv_heads, self.head_dim)
        cos, sin = angles
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        b, q_len = batch.input_ids.shape
        slots = batch.write_slots.reshape(-1)
        if batch.real is not None:
            slots = slots[batch.real]
        cached = kv.k.dtype  # float32 on a CPU under bf16 weights (``Engine.kv_dtype``)
        kv.k[self.layer].index_copy_(
            0, slots, k.reshape(-1, self.num_kv_heads, self.head_dim).to(cached)
        )
        kv.v[self.layer].index_copy_(
            0, slots, v.reshape(-1, self.num_kv_heads, self.head_dim).to(cached)
        )
        if batch.segments is not None:
            out = self._segments(q.reshape(-1, self.num_heads, self.head_dim), batch.segments, kv)
            return linear(out.view(*rows, -1), self.o_proj.weight)
        if batch.real is not None:
            padded = q.new_zeros((b * q_len, self.num_heads, self.head_dim))
            padded[batch.real] = q
            q = padded.view(b, q_len, self.num_heads, self.head_dim)
        assert batch.mask is not None and batch.read_slots is not None
        if batch.read_range is not None:
            start, stop = batch.read_range
            keys = kv.k[self.layer][start:stop].unsqueeze(0)  # [1, L, Hkv, D], no copy
            values = kv.v[self.layer][start:stop].unsqueeze(0)
        else:
            keys = kv.k[self.layer][batch.read_slots]  # [B, L, Hkv, D]
            values = kv.v[self.layer][batch.read_slots]
        # One query row of one request sees its whole context: no mask to apply.
        mask = None if b == 1 and q_len == 1 else batch.mask
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2).to(keys.dtype),  # bf16 queries over a float32 cache attend in it
            keys.transpose(1, 2),
            values.transpose(1, 2),
            attn_mask=mask,
            scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        out = out.transpose(1, 2).reshape(b, q_len, -1).to(x.dtype)
        if batch.real is not None:
            out = out.reshape(b * q_len, -1)[batch.real]
        return linear(out, self.o_proj.weight)

    def _segments(self, q: torch.Tensor, segments: tuple[Segment, ...], kv: KVPool) -> torch.Tensor:
        """Attention request by request over the flat query rows ``q`` [N, H, D]: [N, H * D]."""
        keys, values = kv.k[self.layer], kv.v[self.layer]
        out = []
        for seg in segments:
            start, stop = seg.rows
            if isinstance(seg.keys, tuple):
                k, v = keys[seg.keys[0] : seg.keys[1]], values[seg.keys[0] : seg.keys[1]]
            else:
                k, v = keys[seg.keys], values[seg.keys]
            o = F.scaled_dot_product_attention(
                q[start:stop].transpose(0, 1).unsqueeze(0).to(k.dtype),  # [1, H, n, D]
                k.transpose(0, 1).unsqueeze(0),  # [1, Hkv, L, D]
                v.transpose(0, 1).unsqueeze(0),
                attn_mask=seg.mask,
                scale=self.scale,
                enable_gqa=self.num_heads != self.num_kv_heads,
            )
            out.append(o[0].transpose(0, 1).reshape(stop - start, -1))
        return torch.cat(out).to(q.dtype)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = linear(x, self.gate_proj.weight), linear(x, self.up_proj.weight)
        return linear(F.silu(gate) * up, self.down_proj.weight)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, batch: ForwardBatch, kv: KVPool, angles: Angles
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), batch, kv, angles)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """Embeddings, decoder layers and the final norm (Hugging Face's ``model.`` prefix)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaModel(nn.Module):
    """The decoder stack plus the LM head. Parameter names follow Hugging Face's
    ``LlamaForCausalLM`` (``model.layers.0.self_attn.q_proj.weight``, ``lm_head.weight``, ...)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = Rotary(config.head_dim, config.rope_theta)
        #: Key/value heads this process computes (fewer on a tensor-parallel rank).
        self.num_local_kv_heads = config.num_key_value_heads

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    def pack(self) -> None:
        """Pack every projection and the LM head for oneDNN now (``packed``), so the first
        multi-row forward of a request does not pay for it (about 0.3 s for SmolLM2)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                packed(module.weight)

    def forward(
        self, batch: ForwardBatch, kv: KVPool, num_layers: int | None = None
    ) -> torch.Tensor:
        """Hidden states [B, Q, hidden] after the final norm, running the first ``num_layers``
        (0 at padded query rows when ``batch.real`` is set)."""
        ids, positions = batch.input_ids, batch.positions
        if batch.real is not None:
            ids, positions = ids.reshape(-1)[batch.real], positions.reshape(-1)[batch.real]
        x = self.model.embed_tokens(ids)
        angles = self.rotary.angles(positions, x.dtype)
        for layer in self.model.layers[: num_layers or self.num_layers]:
            x = layer(x, batch, kv, angles)
        x = self.model.norm(x)
        if batch.real is None:
            return x
        b, q_len = batch.input_ids.shape
        out = x.new_zeros((b * q_len, x.shape[-1]))
        out[batch.real] = x
        return out.view(b, q_len, -1)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return linear(hidden, self.lm_head.weight).float()


def parameter_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shape of each parameter ``LlamaModel(config)`` has, by name (a tied LM head is listed
    once, as ``named_parameters`` lists it), computed without building it: a loader compares a
    file's tensors with these before allocating anything for what the config claims."""
    hidden, inner = config.hidden_size, config.intermediate_size
    q_rows = config.num_attention_heads * config.head_dim
    kv_rows = config.num_key_value_heads * config.head_dim
    layer = {
        "self_attn.q_proj.weight": (q_rows, hidden),
        "self_attn.k_proj.weight": (kv_rows, hidden),
        "self_attn.v_proj.weight": (kv_rows, hidden),
        "self_attn.o_proj.weight": (hidden, q_rows),
        "mlp.gate_proj.weight": (inner, hidden),
        "mlp.up_proj.weight": (inner, hidden),
        "mlp.down_proj.weight": (hidden, inner),
        "input_layernorm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
    }
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, hidden)}
    for i in range(config.num_hidden_layers):
        shapes |= {f"model.layers.{i}.{name}": shape for name, shape in layer.items()}
    shapes["model.norm.weight"] = (hidden,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    return shapes
