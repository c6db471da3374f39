"""Tokenizers: the byte tokenizer and its tokenizer.json form, Hugging Face directories, the BPE
vocabulary of a GGUF file (SmolLM2's), chat templates and incremental decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from speclens.engine.tokenizer import (
    ByteTokenizer,
    HFTokenizer,
    IncrementalDecoder,
    Tokenizer,
    gguf_tokenizer,
)
from speclens.engine.weights_gguf import smollm2_gguf_path

TEXTS = ["", "hello", "naïve café", "東京 🙂 👩‍💻", "tabs\tand\nnewlines  \n", "<|user|> literal"]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi!"},
]


# --- ByteTokenizer --------------------------------------------------------------------------


def test_byte_tokenizer_ids() -> None:
    tok = ByteTokenizer()
    assert isinstance(tok, Tokenizer)
    assert tok.encode("Aé") == [65, 0xC3, 0xA9]
    assert tok.encode("A", add_bos=True) == [256, 65]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (256, 257, 258)
    assert tok.vocab_size == 320 and tok.name == "byte"


def test_byte_tokenizer_decode_skips_specials_and_replaces_bad_bytes() -> None:
    tok = ByteTokenizer()
    assert tok.decode([256, 104, 105, 257, 258, 300]) == "hi"
    assert tok.decode([0xC3]) == "\ufffd"
    with pytest.raises(ValueError, match="outside"):
        tok.decode([320])


@given(st.text())
def test_byte_tokenizer_round_trips(text: str) -> None:
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(text, add_bos=True)) == text


def test_byte_chat_template() -> None:
    tok = ByteTokenizer()
    assert tok.apply_chat_template(MESSAGES) == (
        "<|system|>\nBe brief.\n<|user|>\nHi!\n<|assistant|>\n"
    )
    assert tok.apply_chat_template(MESSAGES, add_generation_prompt=False).endswith("Hi!\n")


def test_byte_tokenizer_as_tokenizer_json_is_the_same_tokenizer(tmp_path: Path) -> None:
    byte = ByteTokenizer()
    byte.save(tmp_path)
    hf = HFTokenizer.from_dir(tmp_path)
    assert isinstance(hf, Tokenizer)
    assert (hf.vocab_size, hf.bos_token_id, hf.eos_token_id) == (320, 256, 257)
    for text in TEXTS:
        assert hf.encode(text, add_bos=True) == byte.encode(text, add_bos=True)
        assert hf.decode([*byte.encode(text), 257, 300]) == text
    for add in (True, False):
        assert hf.apply_chat_template(MESSAGES, add) == byte.apply_chat_template(MESSAGES, add)


def test_transformers_reads_the_saved_byte_tokenizer(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    ByteTokenizer().save(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    byte = ByteTokenizer()
    assert len(theirs) == 320 and theirs.eos_token_id == 257
    for text in TEXTS[:-1]:  # HF matches special tokens' text; plain text is bytes in both
        assert theirs.encode(text, add_special_tokens=False) == byte.encode(text)
    rendered = theirs.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert rendered == byte.apply_chat_template(MESSAGES)


# --- HFTokenizer ----------------------------------------------------------------------------


def test_hf_tokenizer_needs_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"tokenizer\.json: missing"):
        HFTokenizer.from_dir(tmp_path)


def test_hf_tokenizer_reads_bos_eos_and_template_like_transformers(tmp_path: Path) -> None:
    ByteTokenizer().save(tmp_path)
    config_file = tmp_path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["bos_token"] = {"content": "<|pad|>", "special": True}  # the AddedToken form
    del config["eos_token"]  # falls back to config.json
    config["chat_template"] = (
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'tool' %}"
        "{{ raise_exception('no tools') }}{% endif %}"
        "[{{ m['role'] }}] {{ m['content'] | tojson }}\n"
        "{% endfor %}{% if add_generation_prompt %}{{ eos_token }}{% endif %}"
    )
    config_file.write_text(json.dumps(config))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [257, 258]}))
    tok = HFTokenizer.from_dir(tmp_path)
    assert (tok.bos_token_id, tok.eos_token_id) == (258, 257)
    rendered = tok.apply_chat_template([{"role": "user", "content": "ça"}])
    assert rendered == '<|pad|>[user] "ça"\n<|eos|>'  # trim_blocks, non-ASCII tojson
    with pytest.raises(ValueError, match="no tools"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])


def test_hf_tokenizer_without_template_refuses(tmp_path: Path) -> None:
    ByteTokenizer().save(tmp_path)
    config_file = tmp_path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    del config["chat_template"]
    config_file.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no chat template"):
        HFTokenizer.from_dir(tmp_path).apply_chat_template(MESSAGES)


def test_unknown_bos_token_is_refused(tmp_path: Path) -> None:
    ByteTokenizer().save(tmp_path)
    config_file = tmp_path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["bos_token"] = "<s>"
    config_file.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"tokenizer_config\.json: bos_token: '<s>'"):
        HFTokenizer.from_dir(tmp_path)


# --- IncrementalDecoder ---------------------------------------------------------------------


def test_incremental_decoder_holds_back_partial_characters() -> None:
    tok = ByteTokenizer()
    decoder = IncrementalDecoder(tok)
    assert decoder.push(tok.encode("a")) == "a"
    euro = tok.encode("€")  # three bytes
    assert decoder.push(euro[:1]) == ""
    assert decoder.push(euro[1:2]) == ""
    assert decoder.push(euro[2:] + tok.encode("b")) == "€b"
    assert decoder.push([257]) == ""  # specials add no text
    assert decoder.push(tok.encode("c")) == "c"
    assert decoder.push(euro[:2]) == ""
    assert decoder.flush() == "\ufffd"
    assert decoder.flush() == ""


@given(st.text(), st.data())
def test_incremental_decoder_reassembles_any_chunking(text: str, data: st.DataObject) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    decoder = IncrementalDecoder(tok)
    pieces, i = [], 0
    while i < len(ids):
        n = data.draw(st.integers(1, 4))
        pieces.append(decoder.push(ids[i : i + n]))
        i += n
    pieces.append(decoder.flush())
    assert "".join(pieces) == text
    if "\ufffd" not in text:
        assert all("\ufffd" not in p for p in pieces)


# --- GGUF (SmolLM2) -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_tokenizer() -> HFTokenizer:
    gguf = pytest.importorskip("gguf")
    try:
        path = smollm2_gguf_path()
    except ValueError as exc:
        pytest.skip(str(exc))
    return gguf_tokenizer(gguf.GGUFReader(path))


@pytest.mark.slow
def test_smollm2_tokenizer_basics(smollm2_tokenizer: HFTokenizer) -> None:
    tok = smollm2_tokenizer
    assert isinstance(tok, Tokenizer)
    assert tok.vocab_size == 49152
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)  # <|im_start|>, <|im_end|>
    ids = tok.encode("Hello world")
    assert [tok.backend.id_to_token(i) for i in ids] == ["Hello", "Ġworld"]  # GPT-2 style
    assert ids == [19556, 905]
    # SmolLM splits digits one by one, before the byte-level regex
    assert [tok.decode([i]) for i in tok.encode("in 2024")] == ["in", " ", "2", "0", "2", "4"]


@pytest.mark.slow
@pytest.mark.parametrize("text", [*TEXTS, "def f(x):\n    return x ** 2  # squared", "A" * 300])
def test_smollm2_tokenizer_round_trips(smollm2_tokenizer: HFTokenizer, text: str) -> None:
    assert smollm2_tokenizer.decode(smollm2_tokenizer.encode(text)) == text


@pytest.mark.slow
def test_smollm2_special_tokens(smollm2_tokenizer: HFTokenizer) -> None:
    tok = smollm2_tokenizer
    ids = tok.encode("<|im_start|>user\nHi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2 and len(ids) == 5
    assert tok.decode(ids) == "user\nHi"  # specials skipped
    assert tok.encode("x", add_bos=True)[0] == 1


@pytest.mark.slow
def test_smollm2_chat_template(smollm2_tokenizer: HFTokenizer) -> None:
    tok = smollm2_tokenizer
    assert tok.apply_chat_template([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    rendered = tok.apply_chat_template(MESSAGES, add_generation_prompt=False)
    assert rendered == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"


@pytest.mark.slow
def test_smollm2_incremental_decoding(smollm2_tokenizer: HFTokenizer) -> None:
    tok = smollm2_tokenizer
    text = "Streaming 東京 🙂 text, one token at a time."
    decoder = IncrementalDecoder(tok)
    pieces = [decoder.push([i]) for i in tok.encode(text)]
    assert "".join(pieces) + decoder.flush() == text
    assert all("\ufffd" not in p for p in pieces)


@pytest.mark.model
def test_smollm2_tokenizer_matches_transformers_gguf_reader(
    smollm2_tokenizer: HFTokenizer,
) -> None:
    """transformers builds its own tokenizer from the same GGUF metadata: same ids for text
    without digits (transformers ignores SmolLM's one-digit split)."""
    transformers = pytest.importorskip("transformers")
    path = smollm2_gguf_path()
    theirs = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for text in [*TEXTS, "Don't stop -- it's   fine!\tOK?", "<|im_start|>user\nHi<|im_end|>"]:
        assert smollm2_tokenizer.encode(text) == theirs.encode(text, add_special_tokens=False)


def test_gguf_tokenizer_refuses_sentencepiece(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(tmp_path / "spm.gguf", "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<unk>", "<s>", "</s>"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"spm\.gguf: tokenizer\.ggml\.model 'llama'"):
        gguf_tokenizer(gguf.GGUFReader(tmp_path / "spm.gguf"))
