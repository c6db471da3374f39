"""What every model source shares: the empty model it fills (built on the meta device, rotary
scaling applied) and the checks that its tensors are the ones, and of the shapes, the config's
model has, made before a parameter is allocated or copied."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from speclens.engine.model import LlamaModel, ModelConfig, Rotary, parameter_shapes


def rope_scaling(config: ModelConfig) -> dict[str, Any] | None:
    scaling = config.extra.get("rope_scaling")
    return scaling if isinstance(scaling, dict) else None


def _scaled_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Hugging Face's ``linear`` and ``llama3`` rotary frequency scaling."""
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv_freq / factor
    low = float(scaling["low_freq_factor"])
    high = float(scaling["high_freq_factor"])
    original = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, smoothed, scaled)


def empty_model(config: ModelConfig, dtype: torch.dtype, device: str | torch.device) -> LlamaModel:
    """A model with uninitialised parameters on ``device``: built on the meta device so no random
    init runs (it costs time and would advance the global RNG)."""
    with torch.device("meta"):
        model = LlamaModel(config)
    model.to(dtype=dtype)
    model.to_empty(device=device)
    if config.tie_word_embeddings:  # to_empty gives every parameter its own storage
        embed = model.model.embed_tokens
        assert isinstance(embed, torch.nn.Embedding)
        model.lm_head.weight = embed.weight
    model.rotary = Rotary(config.head_dim, config.rope_theta)  # its tables were built on meta
    scaling = rope_scaling(config)
    if scaling is not None:
        model.rotary.inv_freq = _scaled_inv_freq(model.rotary.inv_freq, scaling)
    return model


Shape = tuple[int, ...]
Located = dict[str, tuple[Path, Shape]]
"""Tensor name -> (the file holding it, its shape as the file's header states it)."""


def check_tensors(config: ModelConfig, located: Located, lack: str) -> None:
    """Refuse, before a parameter is allocated, tensors the config's model lacks or does not
    have, and any whose shape differs from the config's; ``lack`` begins the missing message."""
    expected = parameter_shapes(config)
    missing = [name for name in expected if name not in located]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ValueError(f"{lack} {', '.join(missing[:5])}{more}")
    unexpected = sorted(
        name
        for name in set(located) - set(expected)
        if not name.endswith(_IGNORED_SUFFIXES)
        and not (config.tie_word_embeddings and name == "lm_head.weight")
    )
    if unexpected:
        raise ValueError(
            f"{located[unexpected[0]][0]}: unexpected tensors for this config: "
            + ", ".join(unexpected[:5])
        )
    for name, shape in expected.items():
        file, found = located[name]
        if found != shape:
            raise ValueError(f"{file}: {name}: shape {list(found)}, expected {list(shape)}")


_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers older checkpoints saved


def check_shape(file: str | Path, name: str, shape: tuple[int, ...], param: torch.Tensor) -> None:
    if shape != tuple(param.shape):
        raise ValueError(f"{file}: {name}: shape {list(shape)}, expected {list(param.shape)}")
