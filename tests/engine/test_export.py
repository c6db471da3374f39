"""``speclens export``: the Hugging Face directory it writes is loaded by transformers itself
(``AutoModelForCausalLM``/``AutoTokenizer``, ``local_files_only``), which then generates the same
greedy tokens as speclens's engine, tokenizes text to the same ids and renders the chat template
to the same prompt. The model class is transformers' ``models/llama/modeling_llama.py``
(``LlamaForCausalLM``): matching its greedy tokens checks the parameter names and the rotary Q/K
order (llama.cpp's ``convert_hf_to_gguf.py`` permutes them; the GGUF loader undoes it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from enginekit import prefill_logits
from speclens.engine import Engine, EngineConfig, SamplingParams
from speclens.engine.export import export_model, write_hf_dir
from speclens.engine.model import LlamaModel
from speclens.engine.tokenizer import ByteTokenizer, Tokenizer
from speclens.engine.weights import load_model
from speclens.engine.weights_gguf import smollm2_gguf_path

transformers = pytest.importorskip("transformers")

SPEC_BENCH = Path(__file__).parents[2] / ".." / "shared" / "data" / "spec-bench" / "question.jsonl"
CATEGORIES = ("writing", "coding", "translation")  # short first prompts, three kinds of text
MAX_TOKENS = 32
CONFIG_KEYS = (
    "architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
    "max_position_embeddings", "vocab_size", "tie_word_embeddings", "bos_token_id",
    "eos_token_id", "torch_dtype",
)  # fmt: skip


def spec_bench() -> list[dict[str, Any]]:
    if not SPEC_BENCH.exists():
        pytest.fail(f"the Spec-Bench prompts are missing: {SPEC_BENCH}")
    return [json.loads(line) for line in SPEC_BENCH.read_text(encoding="utf-8").splitlines()]


def prompts() -> list[str]:
    """The first prompt of each of ``CATEGORIES``."""
    rows = spec_bench()
    return [next(r["turns"][0] for r in rows if r["category"] == c) for c in CATEGORIES]


def hf_load(directory: Path) -> tuple[Any, Any]:
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return model.eval(), tokenizer


def assert_same_as_speclens(
    spec: str, model: LlamaModel, tokenizer: Tokenizer, directory: Path
) -> None:
    """transformers on the export = speclens on the original: config, chat template, prompt ids,
    prefill logits and ``MAX_TOKENS`` greedy tokens (stopping at EOS as each side's config says)."""
    config = json.loads((directory / "config.json").read_text())
    assert set(CONFIG_KEYS) <= set(config), set(CONFIG_KEYS) - set(config)
    hf_model, hf_tokenizer = hf_load(directory)
    engine = Engine(EngineConfig(model=spec), target=model, tokenizer=tokenizer)
    for prompt in prompts():
        messages = [{"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages)
        hf_text = hf_tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        assert hf_text == text
        ids = tokenizer.encode(text)
        assert hf_tokenizer(text)["input_ids"] == ids
        with torch.no_grad():
            hf_logits = hf_model(torch.tensor([ids])).logits[0]
        torch.testing.assert_close(hf_logits, prefill_logits(model, ids), atol=2e-4, rtol=0)
        ours = engine.generate([ids], SamplingParams(max_tokens=MAX_TOKENS, temperature=0))
        with torch.no_grad():
            theirs = hf_model.generate(
                torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False
            )[0, len(ids) :].tolist()
        assert theirs == ours[0].outputs[0].token_ids, prompt
        assert hf_tokenizer.decode(theirs, skip_special_tokens=True) == ours[0].outputs[0].text
    # and speclens reads its own export back: the same tensors, prompt and ids
    reloaded, reloaded_tokenizer = load_model(str(directory))
    original = model.state_dict()
    assert all(torch.equal(t, original[n]) for n, t in reloaded.state_dict().items())
    assert reloaded_tokenizer.apply_chat_template(messages) == text
    assert reloaded_tokenizer.encode(text) == ids


# --- dummy ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dummy_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("dummy") / "export"
    export_model("dummy", directory, seed=3)
    return directory


def test_dummy_export_runs_in_transformers_as_in_speclens(dummy_export: Path) -> None:
    model, tokenizer = load_model("dummy", seed=3)  # --seed picks the same weights as serve's
    assert_same_as_speclens("dummy", model, tokenizer, dummy_export)
    files = {p.name for p in dummy_export.iterdir()}
    assert files == {
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
        "generation_config.json", "special_tokens_map.json",
    }  # fmt: skip
    generation = transformers.GenerationConfig.from_pretrained(dummy_export, local_files_only=True)
    assert (generation.bos_token_id, generation.eos_token_id) == (256, 257)
    # ids only: a sampling default here would change vLLM's defaults (its --generation-config auto)
    assert json.loads((dummy_export / "generation_config.json").read_text()) == {
        "bos_token_id": 256,
        "eos_token_id": 257,
    }


@pytest.fixture(scope="module")
def hf_bytes(dummy_export: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(dummy_export, local_files_only=True)


#: Texts that spell a special token are the one documented difference (``ByteTokenizer.to_hf``).
plain_text = st.text().filter(lambda s: "<|" not in s)


@settings(max_examples=200, deadline=None)
@given(text=plain_text)
def test_dummy_tokenizer_encodes_as_the_byte_tokenizer(hf_bytes: Any, text: str) -> None:
    assert hf_bytes(text)["input_ids"] == ByteTokenizer().encode(text)


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(0, 319), max_size=40))
def test_dummy_tokenizer_decodes_as_the_byte_tokenizer(hf_bytes: Any, ids: list[int]) -> None:
    """Any ids, broken UTF-8 and special or reserved ids included: the same text."""
    assert hf_bytes.decode(ids, skip_special_tokens=True) == ByteTokenizer().decode(ids)


def test_dummy_tokenizer_reads_special_spellings_as_specials(hf_bytes: Any) -> None:
    """The one difference: like every Hugging Face tokenizer (and vLLM, which uses it), the export
    reads ``<|eos|>`` in text as the EOS token; ``ByteTokenizer`` keeps it as bytes."""
    assert hf_bytes("a<|eos|>b")["input_ids"] == [97, 257, 98]
    assert ByteTokenizer().encode("a<|eos|>b") == list(b"a<|eos|>b")


def test_bfloat16_export_is_the_float32_weights_rounded(tmp_path: Path) -> None:
    export_model("dummy", tmp_path / "bf16", dtype="bfloat16")
    config = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16"
    full = load_model("dummy")[0].state_dict()
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
        assert set(names) == set(full)
        for name in names:
            tensor = f.get_tensor(name)
            assert tensor.dtype == torch.bfloat16
            assert torch.equal(tensor, full[name].to(torch.bfloat16)), name


# --- the command ------------------------------------------------------------------------------


def test_cli_writes_then_refuses_a_non_empty_directory(run_cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, stdout, _ = run_cli("export", "dummy", out)
    assert code == 0 and "model.safetensors" in stdout
    weights = (out / "model.safetensors").read_bytes()
    assert oct((out / "model.safetensors").stat().st_mode & 0o777) == oct(
        (out / "config.json").stat().st_mode & 0o777
    )  # readable like the other files (safetensors itself writes 0600)

    code, _, stderr = run_cli("export", "dummy", out, "--seed", "1")
    assert code == 1
    assert stderr.strip().splitlines() == [
        f"refused: OUT_DIR {out}: not empty (6 entries); pass --force to replace its model files"
    ]
    assert (out / "model.safetensors").read_bytes() == weights  # untouched

    (out / "model-00002-of-00002.safetensors").write_bytes(b"stale shard")
    (out / "notes.txt").write_text("mine")
    code, _, _ = run_cli("export", "dummy", out, "--seed", "1", "--force")
    assert code == 0
    assert {p.name for p in out.iterdir()} == {
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
        "generation_config.json", "special_tokens_map.json", "notes.txt",
    }  # fmt: skip
    assert (out / "model.safetensors").read_bytes() != weights  # seed 1's weights
    assert (out / "notes.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging directory left


@pytest.mark.parametrize(
    ("args", "code", "line"),
    [
        (["--dtype", "int8"], 2, "command line: --dtype: expected float32, bfloat16 or float16, "
         "got 'int8'"),
        (["--seed", "-1"], 2, "command line: --seed: expected an integer in [0, 2**63 - 1], got -1"),
    ],
)  # fmt: skip
def test_cli_refuses_bad_options(
    run_cli: Any, tmp_path: Path, args: list[str], code: int, line: str
) -> None:
    result = run_cli("export", "dummy", tmp_path / "out", *args)
    assert result[0] == code and result[2].strip().splitlines() == [line]
    assert not (tmp_path / "out").exists()


def test_cli_refuses_a_missing_model_and_a_file_as_out_dir(run_cli: Any, tmp_path: Path) -> None:
    code, _, stderr = run_cli("export", str(tmp_path / "none.gguf"), tmp_path / "out")
    assert code == 1
    assert stderr.strip().splitlines() == [f"refused: MODEL {tmp_path / 'none.gguf'}: no such file"]
    assert not (tmp_path / "out").exists()
    (tmp_path / "file").write_text("x")
    code, _, stderr = run_cli("export", "dummy", tmp_path / "file", "--force")
    assert code == 1
    assert stderr.strip().splitlines() == [
        f"refused: OUT_DIR {tmp_path / 'file'}: exists and is not a directory"
    ]


# --- SmolLM2 ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, Path]]:
    try:
        smollm2_gguf_path()
    except ValueError as exc:
        pytest.skip(str(exc))
    model, tokenizer = load_model("smollm2")
    directory = tmp_path_factory.mktemp("smollm2")
    write_hf_dir(model, tokenizer, directory)  # what export_model writes, without a second load
    yield model, tokenizer, directory


@pytest.mark.model
def test_smollm2_export_runs_in_transformers_as_in_speclens(smollm2: Any) -> None:
    model, tokenizer, directory = smollm2
    assert_same_as_speclens("smollm2", model, tokenizer, directory)
    with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
    assert "lm_head.weight" not in names  # tied, as the GGUF (no output.weight) says
    assert len(names) == 2 + 9 * 30


@pytest.mark.model
def test_smollm2_tokenizer_encodes_every_spec_bench_prompt_alike(smollm2: Any) -> None:
    _, tokenizer, directory = smollm2
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    texts = [turn for row in spec_bench() for turn in row["turns"]]
    assert len(texts) > 480
    for text in texts:
        ids = tokenizer.encode(text)
        assert hf_tokenizer(text)["input_ids"] == ids, text[:80]
        assert hf_tokenizer.decode(ids, skip_special_tokens=True) == tokenizer.decode(ids)
    assert hf_tokenizer.eos_token == "<|im_end|>" and hf_tokenizer.bos_token == "<|im_start|>"
