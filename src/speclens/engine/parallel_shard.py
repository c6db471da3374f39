"""The model's shards: how a tensor-parallel rank splits the model (Megatron: column-parallel
q/k/v and gate/up, row-parallel o_proj and down, each followed by one all-reduce; the LM head
replicated), and why a model cannot be split over a number of ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from speclens.engine.model import DecoderLayer, LlamaModel, ModelConfig

if TYPE_CHECKING:
    from speclens.engine.parallel_comm import Comm


def split(total: int, parts: int, index: int) -> tuple[int, int]:
    """The ``index``-th of ``parts`` contiguous, balanced ranges of ``range(total)``."""
    base, extra = divmod(total, parts)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


def shard_problem(config: ModelConfig, size: int, what: str = "--model") -> str | None:
    """Why ``config`` cannot be split over ``size`` ranks, or None.

    Ranks split the model by key/value head group (each query head stays with its KV head) and
    the MLP by intermediate column, in balanced contiguous ranges; a rank must get at least one
    of each. When ``size`` does not divide the groups the split is uneven (SmolLM2's 3 KV groups
    over 2 ranks: 2 and 1), which is correct but leaves the larger share on the critical path.
    """
    if size > config.num_key_value_heads:
        return (
            f"--tensor-parallel-size {size}: {what} has {config.num_key_value_heads} key/value "
            f"heads (num_key_value_heads), expected at most one rank per key/value head"
        )
    if size > config.intermediate_size:
        return (
            f"--tensor-parallel-size {size}: {what} has intermediate_size "
            f"{config.intermediate_size}, expected at least one column per rank"
        )
    return None


def shard_model(model: LlamaModel, rank: int, size: int, comm: Comm) -> None:
    """Keep rank ``rank``'s share of every projection, in place, and all-reduce the row-parallel
    outputs. Norms, embeddings and the LM head stay whole (replicated)."""
    config = model.config
    group = config.num_attention_heads // config.num_key_value_heads
    kv_start, kv_stop = split(config.num_key_value_heads, size, rank)
    d = config.head_dim
    q_rows = slice(kv_start * group * d, kv_stop * group * d)
    kv_rows = slice(kv_start * d, kv_stop * d)
    cols = slice(*split(config.intermediate_size, size, rank))
    for layer in model.model.layers:
        assert isinstance(layer, DecoderLayer)
        attn, mlp = layer.self_attn, layer.mlp
        _keep(attn.q_proj, attn.q_proj.weight[q_rows])
        _keep(attn.k_proj, attn.k_proj.weight[kv_rows])
        _keep(attn.v_proj, attn.v_proj.weight[kv_rows])
        _keep(attn.o_proj, attn.o_proj.weight[:, q_rows])
        attn.num_heads, attn.num_kv_heads = (kv_stop - kv_start) * group, kv_stop - kv_start
        _keep(mlp.gate_proj, mlp.gate_proj.weight[cols])
        _keep(mlp.up_proj, mlp.up_proj.weight[cols])
        _keep(mlp.down_proj, mlp.down_proj.weight[:, cols])
        for module in (attn, mlp):
            module.register_forward_hook(_reducer(comm))
    model.num_local_kv_heads = kv_stop - kv_start


def _keep(linear: nn.Linear, weight: torch.Tensor) -> None:
    linear.weight = nn.Parameter(weight.contiguous().clone(), requires_grad=False)


def _reducer(comm: Comm) -> Callable[..., torch.Tensor]:
    def hook(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        comm.all_reduce(output)
        return output

    return hook
