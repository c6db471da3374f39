"""Model files a user controls: ``config.json``, safetensors headers and GGUF metadata are checked
against sane bounds and against each other before anything is built or allocated, and every
refusal names the file, the field and what was expected.

Each case runs under ``bounded``: before the checks, a claimed 10^8 layers or a 2^40-element GGUF
array grew memory without end, so a refusal has to come within seconds and without memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import launch
from serverkit import child_env, free_port, serve_command
from speclens.engine.config import ConfigError, EngineConfig
from speclens.engine.model import ModelConfig
from speclens.engine.weights import check_models, load_model, model_config
from speclens.engine.weights_dummy import dummy_model
from speclens.engine.weights_gguf import load_gguf
from speclens.engine.weights_hf import load_hf_dir, save_hf_dir

#: A refusal must come well within this (the checks read a few kilobytes).
BOUND_S = 5.0
#: ... and hold no more than this much more memory while it is being decided.
BOUND_BYTES = 256 * 2**20

TINY = ModelConfig(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=64,
    bos_token_id=1,
    eos_token_id=2,
)


def _resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def bounded(seconds: float = BOUND_S, growth: int = BOUND_BYTES) -> Iterator[None]:
    """Fail (rather than hang) past ``seconds``, and fail when resident memory grew by more than
    ``growth`` at any moment (sampled every 10 ms)."""
    before, peak, done = _resident(), [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            peak[0] = max(peak[0], _resident() - before)

    def expire(*_: Any) -> None:
        raise TimeoutError(f"not refused within {seconds} s")

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        done.set()
        sampler.join()
    assert peak[0] < growth, f"resident memory grew by {peak[0] / 2**20:.0f} MiB"


def refusal(read: Any, path: Path, *fragments: str) -> str:
    """``read(path)`` refuses, bounded, with a message holding every fragment."""
    with bounded(), pytest.raises(ValueError) as info:
        read(str(path) if read in (model_config, load_model) else path)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


@pytest.fixture
def hf_dir(tmp_path: Path) -> Path:
    return save_hf_dir(dummy_model(TINY, seed=0), tmp_path / "tiny")


def edit_config(directory: Path, **changes: Any) -> Path:
    file = directory / "config.json"
    file.write_text(json.dumps(json.loads(file.read_text()) | changes))
    return directory


# --- item 3: config.json against bounds and the safetensors header ----------------------------


@pytest.mark.parametrize("read", [load_hf_dir, model_config, load_model])
def test_a_hundred_million_layers_refused_before_building(hf_dir: Path, read: Any) -> None:
    edit_config(hf_dir, num_hidden_layers=100_000_000)
    refusal(read, hf_dir, "config.json", "num_hidden_layers", "expected an integer from 1 to")


@pytest.mark.parametrize("read", [load_hf_dir, model_config])
def test_a_trillion_token_vocabulary_refused_before_allocating(hf_dir: Path, read: Any) -> None:
    edit_config(hf_dir, vocab_size=10**12)
    refusal(read, hf_dir, "config.json", "vocab_size", "expected an integer from 1 to")


@pytest.mark.parametrize("read", [load_hf_dir, model_config])
def test_a_config_its_header_contradicts_refused_before_allocating(hf_dir: Path, read: Any) -> None:
    """Within the bounds, but 4 TiB of embeddings that the file does not hold: the header's
    shapes refuse it before torch is asked for the memory."""
    edit_config(hf_dir, vocab_size=2**24, hidden_size=2**16, num_attention_heads=64, head_dim=8)
    refusal(
        read, hf_dir, "model.safetensors", "model.embed_tokens.weight", "expected [16777216, 65536]"
    )


def _write_safetensors_header(file: Path, length: int, header: bytes) -> None:
    file.write_bytes(struct.pack("<Q", length) + header)


@pytest.mark.parametrize(
    ("length", "header", "fragment"),
    [
        (2**62, b"{}", "header claims 4611686018427387904 bytes"),
        (5, b"[1,2]", "header: expected a JSON object"),
        (7, b"{not js", "header is not JSON"),
    ],
    ids=["length-beyond-file", "not-an-object", "not-json"],
)
def test_a_safetensors_header_is_bounded_by_its_file(
    hf_dir: Path, length: int, header: bytes, fragment: str
) -> None:
    _write_safetensors_header(hf_dir / "model.safetensors", length, header)
    refusal(model_config, hf_dir, "model.safetensors", fragment)


# --- item 5: values that were accepted and then served as garbage -----------------------------

BAD_VALUES = [
    ("rms_norm_eps", float("nan"), "rms_norm_eps: expected a finite number in (0, 1)"),
    ("rope_theta", -1, "rope_theta: expected a finite number > 0"),
    ("eos_token_id", 10**6, "eos_token_id: expected a token id from 0 to 31"),
    ("eos_token_id", [2, 99], "eos_token_id: expected a token id from 0 to 31"),
    ("bos_token_id", -1, "bos_token_id: expected a token id from 0 to 31"),
    ("tie_word_embeddings", "yes", "tie_word_embeddings: expected a boolean"),
    ("hidden_size", "256", "hidden_size: expected an integer from 1 to"),
    ("num_attention_heads", 0, "num_attention_heads: expected an integer from 1 to"),
    ("head_dim", 7, "head_dim: expected an even integer from 2 to"),
    ("rope_scaling", {"rope_type": "linear", "factor": "x"}, "rope_scaling.factor: expected"),
]


@pytest.mark.parametrize(
    ("field", "value", "fragment"), BAD_VALUES, ids=[f"{f}={v!r}" for f, v, _ in BAD_VALUES]
)
def test_an_invalid_config_value_refused_by_name(
    hf_dir: Path, field: str, value: Any, fragment: str
) -> None:
    edit_config(hf_dir, **{field: value})
    refusal(load_hf_dir, hf_dir, "config.json", fragment)


def test_max_model_len_beyond_the_models_positions_refused(hf_dir: Path) -> None:
    edit_config(hf_dir, max_position_embeddings=1)
    with bounded(), pytest.raises(ConfigError) as info:
        check_models(EngineConfig(model=str(hf_dir), max_model_len=2048))
    assert "--max-model-len 2048" in str(info.value)
    assert "max_position_embeddings 1" in str(info.value)


def test_max_model_len_defaults_to_the_models_positions(hf_dir: Path) -> None:
    from speclens.engine.weights import default_max_model_len

    assert default_max_model_len("dummy") == 2048
    edit_config(hf_dir, max_position_embeddings=600)
    assert default_max_model_len(str(hf_dir)) == 600
    check_models(EngineConfig(model=str(hf_dir), max_model_len=600))


# --- item 4: GGUF counts bounded by the file's size -------------------------------------------

GGUF_UINT32, GGUF_STRING, GGUF_ARRAY = 4, 8, 9


def _gguf_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def gguf_bytes(kvs: bytes, kv_count: int = 1, tensor_count: int = 0, tensors: bytes = b"") -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensor_count, kv_count) + kvs + tensors


#: 68 bytes: one metadata array that claims 2^40 uint32 elements.
HUGE_ARRAY = gguf_bytes(
    _gguf_string("tokenizer.ggml.token") + struct.pack("<IIQ", GGUF_ARRAY, GGUF_UINT32, 2**40)
)
ARCH = _gguf_string("general.architecture") + struct.pack("<I", GGUF_STRING) + _gguf_string("llama")

GGUF_CASES = [
    ("array-2^40", HUGE_ARRAY, "'tokenizer.ggml.token': an array of 1099511627776 elements"),
    (
        "string-array-2^40",
        gguf_bytes(_gguf_string("t") + struct.pack("<IIQ", GGUF_ARRAY, GGUF_STRING, 2**40)),
        "'t': an array of 1099511627776 elements",
    ),
    (
        "key-length-2^60",
        gguf_bytes(struct.pack("<Q", 2**60) + bytes(16)),
        "a metadata key's length claims 1152921504606846976 bytes",
    ),
    (
        "string-length-2^60",
        gguf_bytes(_gguf_string("k") + struct.pack("<IQ", GGUF_STRING, 2**60)),
        "'k': a string's length claims 1152921504606846976 bytes",
    ),
    ("kv-count-2^60", gguf_bytes(b"", kv_count=2**60), "claims 1152921504606846976 metadata"),
    (
        "tensor-count-2^60",
        gguf_bytes(ARCH, tensor_count=2**60),
        "claims 1152921504606846976 tensors",
    ),
    (
        "tensor-dims-5",
        gguf_bytes(
            ARCH, tensor_count=1, tensors=_gguf_string("x") + struct.pack("<I", 5) + bytes(24)
        ),
        "tensor 'x': 5 dimensions",
    ),
    (
        "tensor-beyond-file",
        gguf_bytes(
            ARCH,
            tensor_count=1,
            tensors=_gguf_string("x") + struct.pack("<IQQIQ", 2, 2**20, 2**20, 0, 0),
        ),
        "tensor 'x': its 4398046511104 bytes at offset 0 lie beyond the file",
    ),
]


@pytest.mark.parametrize(("name", "data", "fragment"), GGUF_CASES, ids=[c[0] for c in GGUF_CASES])
@pytest.mark.parametrize("read", [load_gguf, model_config, load_model])
def test_gguf_counts_are_bounded_by_the_file(
    tmp_path: Path, read: Any, name: str, data: bytes, fragment: str
) -> None:
    assert len(HUGE_ARRAY) == 68  # the report's file
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(data)
    refusal(read, path, path.name, "not a readable GGUF file", fragment)


def _gguf_metadata(path: Path, **llama: int) -> Path:
    """A GGUF of llama metadata only (no tensors, no tokenizer)."""
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(path, "llama")
    fields = {
        "vocab_size": 32, "block_count": 1, "context_length": 64, "embedding_length": 16,
        "feed_forward_length": 32, "attention.head_count": 2, "attention.head_count_kv": 1,
    } | llama  # fmt: skip
    for key, value in fields.items():
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def test_gguf_a_hundred_million_layers_refused_by_key(tmp_path: Path) -> None:
    path = _gguf_metadata(tmp_path / "deep.gguf", block_count=100_000_000)
    refusal(load_gguf, path, "deep.gguf", "llama.block_count", "expected an integer from 1 to")


def test_gguf_a_config_its_tensors_contradict_refused_before_allocating(tmp_path: Path) -> None:
    path = _gguf_metadata(
        tmp_path / "wide.gguf",
        vocab_size=2**24,
        embedding_length=2**16,
        **{"attention.key_length": 8},
    )
    refusal(load_gguf, path, "wide.gguf", "missing tensors", "model.embed_tokens.weight")


# --- the server: one line, fast, no traceback --------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "args", "message"),
    [
        (
            {"num_hidden_layers": 100_000_000},
            [],
            "num_hidden_layers: expected an integer from 1 to 1024, found 100000000",
        ),
        (
            {"max_position_embeddings": 1},
            ["--max-model-len", "2048"],
            "refused: --max-model-len 2048:",
        ),
    ],
    ids=["layers-1e8", "max-model-len-beyond-positions"],
)
def test_serve_refuses_in_one_line(
    hf_dir: Path, edit: dict[str, Any], args: list[str], message: str
) -> None:
    edit_config(hf_dir, **edit)
    started = time.monotonic()
    proc = launch.run(
        serve_command(["--model", str(hf_dir), *args], free_port()),
        timeout=120,
        env=child_env(),
    )
    assert proc.returncode == 1, proc.stderr
    assert time.monotonic() - started < 60
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
