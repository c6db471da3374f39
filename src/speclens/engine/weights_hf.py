"""Hugging Face model directories: ``config.json`` (refusing what ``LlamaModel`` does not
implement) and safetensors files or shards, whose headers are read and bounded before a tensor is;
and writing such a directory from a model."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import torch

from speclens.engine.model import LlamaModel, ModelConfig
from speclens.engine.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer
from speclens.engine.weights_base import (
    Located,
    Shape,
    check_shape,
    check_tensors,
    empty_model,
    rope_scaling,
)


def save_hf_dir(model: LlamaModel, path: str | Path, tokenizer: Tokenizer | None = None) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (and the tokenizer's files when given), so
    a dummy model becomes a directory ``transformers`` and ``load_hf_dir`` both load."""
    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    config = model.config.to_hf()
    config["torch_dtype"] = str(model.lm_head.weight.dtype).removeprefix("torch.")
    scaling = rope_scaling(model.config)
    if scaling is not None:
        config["rope_scaling"] = scaling
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {
        name: tensor.detach().to("cpu").contiguous()
        for name, tensor in model.state_dict().items()
        if not (model.config.tie_word_embeddings and name == "lm_head.weight")
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer is not None:
        if not isinstance(tokenizer, ByteTokenizer | HFTokenizer):
            raise TypeError(f"cannot save a {type(tokenizer).__name__}'s files")
        tokenizer.save(out)
    return out


_SUPPORTED_ROPE = ("default", "linear", "llama3")
_ROPE_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


def _check_rope_numbers(where: str, kind: str, scaling: dict[str, Any]) -> None:
    """Each scaling number finite and positive (llama3: low_freq_factor below high), so that the
    rotary frequencies are numbers rather than NaN."""
    for key in _ROPE_KEYS.get(kind, ()):
        value = scaling[key]
        ok = type(value) in (int, float) and math.isfinite(value) and value > 0
        if not ok:
            raise ValueError(
                f"{where}: rope_scaling.{key}: expected a finite number > 0, found {value!r:.60}"
            )
    if kind == "llama3" and not scaling["low_freq_factor"] < scaling["high_freq_factor"]:
        raise ValueError(
            f"{where}: rope_scaling.low_freq_factor: expected less than high_freq_factor "
            f"{scaling['high_freq_factor']!r}, found {scaling['low_freq_factor']!r}"
        )


def hf_config(data: dict[str, Any], file: str | Path = "config.json") -> ModelConfig:
    """A ``ModelConfig`` from a ``config.json`` mapping, refusing what ``LlamaModel`` does not
    implement (another architecture, biases, another activation, quantization, rope scalings
    other than linear and llama3) rather than running it wrongly."""
    where = str(file)
    archs = data.get("architectures") or []
    model_type = data.get("model_type")
    if (archs and "LlamaForCausalLM" not in archs) or model_type not in (None, "llama"):
        raise ValueError(
            f"{where}: architecture {archs or model_type!r} is not Llama "
            "(LlamaForCausalLM, model_type 'llama')"
        )
    for key in ("attention_bias", "mlp_bias"):
        if data.get(key):
            raise ValueError(f"{where}: {key}: true is not supported (the model has no biases)")
    act = data.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{where}: hidden_act {act!r} is not supported (only 'silu')")
    if data.get("quantization_config"):
        raise ValueError(f"{where}: quantized checkpoints are not supported")
    # transformers >= 5 writes the scaling (and rope_theta, which from_hf reads) in rope_parameters
    scaling = data.get("rope_scaling") or data.get("rope_parameters") or {}
    if not isinstance(scaling, dict):
        raise ValueError(f"{where}: rope_scaling: expected an object, found {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in _SUPPORTED_ROPE:
        raise ValueError(
            f"{where}: rope_scaling type {kind!r} is not supported "
            f"(supported: none, {', '.join(_SUPPORTED_ROPE)})"
        )
    lacking = [k for k in _ROPE_KEYS.get(kind, ()) if k not in scaling]
    if lacking:
        raise ValueError(f"{where}: rope_scaling ({kind}) lacks {', '.join(lacking)}")
    _check_rope_numbers(where, kind, scaling)
    try:
        config = ModelConfig.from_hf(data)
    except KeyError as exc:
        raise ValueError(f"{where}: missing key {exc.args[0]!r}") from exc
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from exc
    if kind in _ROPE_KEYS:
        config.extra["rope_scaling"] = {"rope_type": kind} | {
            k: scaling[k] for k in _ROPE_KEYS[kind]
        }
    return config


#: safetensors' own limit on a header; a header is also bounded by the file that holds it.
MAX_SAFETENSORS_HEADER = 100 * 2**20
_SAFETENSORS_ITEM_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
    "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
}  # fmt: skip


def safetensors_header(file: Path) -> dict[str, Shape]:
    """The tensor shapes a safetensors file's header states, read without touching its data:
    an 8-byte little-endian length, then that many bytes of JSON. The length is bounded by the
    file, and each tensor's bytes must lie inside the file and match its shape."""
    size = file.stat().st_size
    with file.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{file}: not a safetensors file: {size} bytes, no header length")
        (length,) = struct.unpack("<Q", head)
        if length > min(size - 8, MAX_SAFETENSORS_HEADER):
            raise ValueError(
                f"{file}: not a safetensors file: its header claims {length} bytes, but the "
                f"file holds {size - 8} after the length (and a header is at most "
                f"{MAX_SAFETENSORS_HEADER})"
            )
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{file}: not a safetensors file: its header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise ValueError(f"{file}: not a safetensors file: its header: expected a JSON object")
    data_bytes = size - 8 - length
    return {
        name: _header_shape(file, name, entry, data_bytes)
        for name, entry in header.items()
        if name != "__metadata__"
    }


def _header_shape(file: Path, name: str, entry: Any, data_bytes: int) -> Shape:
    """One header entry's shape, when its dtype, shape and offsets are well formed and its
    bytes lie within the file's ``data_bytes`` and hold exactly that shape."""
    entry = entry if isinstance(entry, dict) else {}
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    ints = (
        isinstance(shape, list)
        and isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(v) is int and v >= 0 for v in [*shape, *offsets])
    )
    if ints and offsets[0] <= offsets[1] <= data_bytes:
        item = _SAFETENSORS_ITEM_BYTES.get(str(entry.get("dtype")))
        if item is None or offsets[1] - offsets[0] == math.prod(shape) * item:
            return tuple(shape)
    raise ValueError(
        f"{file}: {name}: header entry: expected a dtype, a shape and data_offsets of exactly "
        f"that many bytes within the file's {data_bytes} data bytes"
    )


def _plain_name(index: Path, name: Any) -> str:
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
        raise ValueError(f"{index}: weight_map: expected plain file names, found {name!r:.60}")
    return name


def _safetensors_files(directory: Path) -> Located:
    """Each tensor's file and shape, from the headers (and the shard index when there is one)."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{index}: not a safetensors index (no weight_map): {exc}") from exc
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: weight_map: expected an object of tensor -> file")
        files = {name: directory / _plain_name(index, f) for name, f in weight_map.items()}
        headers: dict[Path, dict[str, Shape]] = {}
        for file in set(files.values()):
            if not file.is_file():
                raise ValueError(f"{index}: names shard {file.name}, which is missing")
            headers[file] = safetensors_header(file)
        for name, file in files.items():
            if name not in headers[file]:
                raise ValueError(f"{index}: places {name} in {file.name}, whose header lacks it")
        return {name: (file, headers[file][name]) for name, file in files.items()}
    found = sorted(directory.glob("*.safetensors"))
    if not found:
        raise ValueError(
            f"{directory}: no *.safetensors file (and no model.safetensors.index.json)"
        )
    return {
        name: (file, shape) for file in found for name, shape in safetensors_header(file).items()
    }


#: A ``config.json`` is a few kilobytes; one far larger is not a model config.
MAX_CONFIG_BYTES = 1 << 20


def _read_config(directory: Path) -> dict[str, Any]:
    """A model directory's ``config.json`` as a mapping."""
    config_file = directory / "config.json"
    if not directory.is_dir():
        raise ValueError(f"{directory}: not a directory")
    if not config_file.is_file():
        raise ValueError(f"{config_file}: missing (a Hugging Face model directory needs one)")
    if config_file.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"{config_file}: larger than {MAX_CONFIG_BYTES} bytes: not a model config")
    try:
        data = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{config_file}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{config_file}: expected a JSON object")
    return data


def checked_hf_dir(directory: Path) -> tuple[ModelConfig, Located]:
    """A directory's config, checked against its safetensors headers: no tensor is read."""
    config = hf_config(_read_config(directory), directory / "config.json")
    located = _safetensors_files(directory)
    check_tensors(config, located, f"{directory}: the safetensors files lack")
    return config, located


def load_hf_dir(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> LlamaModel:
    """A Llama model from a Hugging Face directory: ``config.json`` plus one safetensors file or
    shards listed in ``model.safetensors.index.json``; tied embeddings need no ``lm_head``. The
    config is checked against the headers' shapes before the model is built."""
    from safetensors import safe_open

    config, located = checked_hf_dir(Path(path))
    model = empty_model(config, dtype, device)
    params = dict(model.named_parameters())  # a tied lm_head is listed once, as embed_tokens
    by_file: dict[Path, list[str]] = {}
    for name in params:
        by_file.setdefault(located[name][0], []).append(name)
    with torch.no_grad():
        for file, names in by_file.items():
            try:
                opened = safe_open(str(file), framework="pt")
            except Exception as exc:
                raise ValueError(f"{file}: not a readable safetensors file: {exc}") from exc
            with opened as f:
                for name in names:
                    shape = tuple(f.get_slice(name).get_shape())
                    check_shape(file, name, shape, params[name])
                    params[name].copy_(f.get_tensor(name))
    return model.eval()
