"""Export any model speclens loads (``dummy``, ``smollm2``, a ``.gguf``, a directory) as a Hugging
Face directory, so the very weights speclens runs also run in vLLM, transformers or SGLang.

The weights come from the loaded ``LlamaModel``, whose parameter names are already
``LlamaForCausalLM``'s and whose Q/K rows are already back in Hugging Face's rotate-half order (the
GGUF loader undoes llama.cpp's permutation); a quantized GGUF is written dequantized, exactly the
values speclens computes with. The tokenizer is written as ``tokenizer.json`` with the chat
template in ``tokenizer_config.json``; the byte tokenizer of the dummy models becomes a byte-level
BPE without merges that encodes text to the same ids (see ``ByteTokenizer.to_hf``).

Nothing is half-written: the files go to a hidden sibling directory first and are moved in at the
end. A directory that already holds anything is refused unless ``force``; then only the files a
model directory consists of are replaced, so stale shards cannot mix with the new weights.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from speclens.engine.config import ConfigError
from speclens.engine.model import LlamaModel
from speclens.engine.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer
from speclens.engine.weights import load_model
from speclens.engine.weights_hf import save_hf_dir

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

#: Files that make up a Hugging Face model directory. ``--force`` removes these (and only these)
#: before moving the export in, so an old shard index or ``chat_template.jinja`` cannot shadow it.
MODEL_FILE_PATTERNS = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "pytorch_model*.bin",
    "*.bin.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)


class ExportError(ConfigError):
    """An export refused before anything was written (the output directory)."""


def check_out_dir(out_dir: Path, force: bool) -> None:
    """Refuse an output path that is not a directory, or a non-empty one without ``force``."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"{out_dir}: exists and is not a directory")
    if out_dir.is_dir() and not force:
        entries = sum(1 for _ in out_dir.iterdir())
        if entries:
            raise ExportError(
                f"{out_dir}: not empty ({entries} entries); pass --force to replace its model files"
            )


def hf_tokenizer(tokenizer: Tokenizer) -> HFTokenizer:
    """The tokenizer in its Hugging Face form (the byte tokenizer converted)."""
    if isinstance(tokenizer, ByteTokenizer):
        return tokenizer.to_hf()
    if isinstance(tokenizer, HFTokenizer):
        return tokenizer
    raise TypeError(f"cannot export a {type(tokenizer).__name__}")


def write_hf_dir(model: LlamaModel, tokenizer: Tokenizer, directory: Path) -> None:
    """Config, weights and tokenizer files that transformers and vLLM load as they are."""
    hf = hf_tokenizer(tokenizer)
    save_hf_dir(model, directory, tokenizer=hf)
    config = model.config
    tokens = {
        key: hf.backend.id_to_token(token_id)
        for key, token_id in (("bos_token", hf.bos_token_id), ("eos_token", hf.eos_token_id))
        if token_id is not None
    }
    tok_config_file = directory / "tokenizer_config.json"
    tok_config = json.loads(tok_config_file.read_text(encoding="utf-8"))
    tok_config["add_eos_token"] = False
    tok_config["model_max_length"] = config.max_position_embeddings
    _write_json(tok_config_file, tok_config)
    _write_json(directory / "special_tokens_map.json", tokens)
    # ids only: sampling defaults here would silently change vLLM's and transformers' defaults
    _write_json(
        directory / "generation_config.json",
        {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id},
    )


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def export_model(
    spec: str, out_dir: str | Path, *, dtype: str = "float32", force: bool = False, seed: int = 0
) -> list[Path]:
    """Load ``spec`` as the engine would (``seed`` picks the dummy weights, as ``serve --seed``
    does) and write it to ``out_dir`` in ``dtype``; returns the files written. Raises
    ``ExportError`` for the output directory and ``ModelLoadError`` for the model."""
    if dtype not in DTYPES:
        raise ExportError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    out = Path(out_dir)
    check_out_dir(out, force)  # before loading: refusing costs nothing
    model, tokenizer = load_model(spec, seed, dtype=DTYPES[dtype])
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    except OSError as exc:
        raise ExportError(f"{out}: cannot write here: {exc.strerror or exc}") from exc
    try:
        write_hf_dir(model, tokenizer, staging)
        mode = (staging / "config.json").stat().st_mode  # the umask's; safetensors writes 0600
        for file in staging.iterdir():
            file.chmod(mode)
        check_out_dir(out, force)  # again: it may have been filled while the weights loaded
        out.mkdir(exist_ok=True)
        for pattern in MODEL_FILE_PATTERNS:
            for stale in out.glob(pattern):
                if stale.is_file() or stale.is_symlink():
                    stale.unlink()
        return [file.replace(out / file.name) for file in sorted(staging.iterdir())]
    except OSError as exc:  # a full disk, a read-only directory: one line, no half-export
        raise ExportError(f"{out}: cannot write the export: {exc.strerror or exc}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
