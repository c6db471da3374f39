"""Tokenizers: the byte-level one the embedded dummy models speak, Hugging Face ``tokenizer.json``
directories, and the BPE vocabulary a GGUF file carries in its metadata.

Every tokenizer encodes without adding special tokens unless asked (``add_bos``), decodes skipping
special tokens, and renders chat messages to a prompt string with the model's own template, so the
engine treats them all alike. ``IncrementalDecoder`` turns a growing id stream into text deltas for
streaming without ever emitting half a character.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import jinja2
    import tokenizers
    from gguf import GGUFReader

logger = logging.getLogger(__name__)

REPLACEMENT_CHAR = "\ufffd"


@runtime_checkable
class Tokenizer(Protocol):
    """What the engine needs from a tokenizer."""

    @property
    def name(self) -> str: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def bos_token_id(self) -> int | None: ...

    @property
    def eos_token_id(self) -> int | None: ...

    def encode(self, text: str, add_bos: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str: ...


@cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-to-printable-character table, the spelling of byte-level BPE vocabularies."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


class ByteTokenizer:
    """UTF-8 bytes as tokens: ids 0..255 are the bytes, then BOS, EOS and PAD; the ids up to
    ``vocab_size`` after those are reserved. Needs no files, so the embedded models start at once.

    Special ids never come out of ``encode`` unless asked (``add_bos``): text is bytes, whatever it
    spells. The chat template is plain text, one ``<|role|>`` line per message.
    """

    BOS = 256
    EOS = 257
    PAD = 258
    SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|pad|>")
    CHAT_TEMPLATE = (
        "{% for message in messages %}"
        "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
    )

    def __init__(self, vocab_size: int = 320) -> None:
        if vocab_size < 259:
            raise ValueError(
                f"ByteTokenizer: vocab_size {vocab_size} < 259 (256 bytes + 3 specials)"
            )
        self._vocab_size = vocab_size

    @property
    def name(self) -> str:
        return "byte"

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def bos_token_id(self) -> int:
        return self.BOS

    @property
    def eos_token_id(self) -> int:
        return self.EOS

    @property
    def pad_token_id(self) -> int:
        return self.PAD

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.BOS, *ids] if add_bos else ids

    def decode(self, ids: Sequence[int]) -> str:
        for i in ids:
            if not 0 <= i < self._vocab_size:
                raise ValueError(f"ByteTokenizer: token id {i} outside [0, {self._vocab_size})")
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
        return text + "<|assistant|>\n" if add_generation_prompt else text

    def to_hf(self) -> HFTokenizer:
        """The same tokenizer as a ``tokenizers`` byte-level BPE with no merges, so a saved dummy
        model directory has a ``tokenizer.json`` any Hugging Face tool can read.

        One difference: the HF form matches its special tokens' text (``<|eos|>``) inside the
        input, as every HF tokenizer does; this one never does.
        """
        from tokenizers import AddedToken, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFBackend

        spelling = bytes_to_unicode()
        vocab = {spelling[b]: b for b in range(256)}
        backend = HFBackend(models.BPE(vocab=vocab, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        backend.decoder = decoders.ByteLevel()
        reserved = [f"<|reserved_{i}|>" for i in range(259, self._vocab_size)]
        backend.add_special_tokens(
            [
                AddedToken(t, special=True, normalized=False)
                for t in (*self.SPECIAL_TOKENS, *reserved)
            ]
        )
        return HFTokenizer(
            backend,
            name=self.name,
            bos_token_id=self.BOS,
            eos_token_id=self.EOS,
            chat_template=self.CHAT_TEMPLATE,
        )

    def save(self, directory: str | Path) -> None:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` (see ``to_hf``)."""
        self.to_hf().save(directory)


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` plus what ``transformers`` keeps beside it: the BOS/EOS ids and
    the Jinja chat template, rendered the way ``transformers`` renders it."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        name: str,
        bos_token_id: int | None,
        eos_token_id: int | None,
        chat_template: str | None,
    ) -> None:
        self.backend = backend
        self._name = name
        self._bos = bos_token_id
        self._eos = eos_token_id
        self.chat_template = chat_template
        self._template: jinja2.Template | None = None

    @classmethod
    def from_dir(cls, path: str | Path) -> HFTokenizer:
        """Read ``tokenizer.json`` (required), ``tokenizer_config.json`` and ``config.json``."""
        from tokenizers import Tokenizer as HFBackend

        directory = Path(path)
        file = directory / "tokenizer.json"
        if not file.is_file():
            raise ValueError(f"{file}: missing (a Hugging Face fast tokenizer file is required)")
        try:
            backend = HFBackend.from_file(str(file))
        except Exception as exc:
            raise ValueError(f"{file}: not a readable tokenizers file: {exc}") from exc
        tok_config = _read_json(directory / "tokenizer_config.json")
        model_config = _read_json(directory / "config.json")

        def token_id(key: str) -> int | None:
            token = tok_config.get(key)
            if isinstance(token, dict):
                token = token.get("content")
            if isinstance(token, str):
                found = backend.token_to_id(token)
                if found is None:
                    raise ValueError(
                        f"{directory / 'tokenizer_config.json'}: {key}: {token!r} is not in the "
                        "vocabulary"
                    )
                return int(found)
            value = model_config.get(f"{key}_id")
            if isinstance(value, list):
                value = value[0] if value else None
            return value if isinstance(value, int) else None

        template = tok_config.get("chat_template")
        if isinstance(template, list):  # several named templates: take the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        jinja_file = directory / "chat_template.jinja"
        if template is None and jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        return cls(
            backend,
            name=directory.name,
            bos_token_id=token_id("bos_token"),
            eos_token_id=token_id("eos_token"),
            chat_template=template if isinstance(template, str) else None,
        )

    @property
    def name(self) -> str:
        return self._name

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    @property
    def bos_token_id(self) -> int | None:
        return self._bos

    @property
    def eos_token_id(self) -> int | None:
        return self._eos

    def _token(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.backend.id_to_token(token_id)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        # The batch form releases the GIL while it encodes (``encode`` holds it): a long prompt
        # tokenized on a server thread must not stall the event loop and the engine thread.
        ids: list[int] = self.backend.encode_batch([text], add_special_tokens=False)[0].ids
        if add_bos:
            if self._bos is None:
                raise ValueError(f"tokenizer {self._name!r} has no BOS token")
            ids.insert(0, self._bos)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=True))

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """Render with the model's Jinja template; a template that refuses the messages (its
        ``raise_exception``) or fails to render is a ``ValueError``."""
        if self.chat_template is None:
            raise ValueError(f"tokenizer {self._name!r} has no chat template")
        import jinja2

        try:
            if self._template is None:
                self._template = _jinja_env().from_string(self.chat_template)
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._token(self._bos) or "",
                eos_token=self._token(self._eos) or "",
            )
        except jinja2.TemplateError as exc:  # raise_exception() or a broken template
            raise ValueError(f"chat template of {self._name!r}: {exc}") from exc

    def save(self, directory: str | Path) -> None:
        """Write ``tokenizer.json`` and a ``tokenizer_config.json`` that ``transformers`` reads."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(out / "tokenizer.json"))
        config: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self._token(self._bos),
            "eos_token": self._token(self._eos),
            "add_bos_token": False,
            "clean_up_tokenization_spaces": False,
        }
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


@cache
def _jinja_env() -> jinja2.Environment:
    """The sandboxed environment ``transformers`` renders chat templates in (same options and
    helpers), so templates written for it render identically here."""
    import jinja2.ext
    import jinja2.sandbox

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        value: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


_MISSING: Any = object()


def gguf_value(reader: GGUFReader, key: str, default: Any = _MISSING) -> Any:
    """One metadata value of a GGUF file as a Python value (str, int, float, bool or list);
    a missing key without a default is a ``ValueError`` naming the file and the key."""
    field = reader.fields.get(key)
    if field is None:
        if default is _MISSING:
            raise ValueError(f"{reader.data.filename}: missing GGUF metadata key {key!r}")
        return default
    return field.contents()


# llama.cpp's ``tokenizer.ggml.pre`` names -> how the text is split before BPE, as the matching
# Hugging Face tokenizer.json does it.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT2_PRE = ("gpt-2", "gpt2")
_DIGITS_PRE = ("smollm", "starcoder", "refact", "codeshell", "exaone", "minerva")
_LLAMA3_PRE = ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3")


def _pre_tokenizer(pre: str, file: str) -> Any:
    from tokenizers import Regex, pre_tokenizers

    if pre in _GPT2_PRE:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_PRE:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre in _LLAMA3_PRE:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    supported = ", ".join(_GPT2_PRE + _DIGITS_PRE + _LLAMA3_PRE)
    raise ValueError(
        f"{file}: tokenizer.ggml.pre {pre!r} is not supported (supported: {supported})"
    )


# llama.cpp token types
_CONTROL = 3
_USER_DEFINED = 4


def gguf_tokenizer(reader: GGUFReader) -> HFTokenizer:
    """The byte-level BPE tokenizer (``tokenizer.ggml.model == "gpt2"``) a GGUF file describes:
    vocabulary, merges, the pre-tokenizer its ``tokenizer.ggml.pre`` names, control tokens as
    special tokens, BOS/EOS and the chat template."""
    from tokenizers import AddedToken, decoders, models
    from tokenizers import Tokenizer as HFBackend

    file = str(reader.data.filename)
    kind = gguf_value(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"{file}: tokenizer.ggml.model {kind!r} is not supported (only 'gpt2', byte-level BPE)"
        )
    tokens: list[str] = gguf_value(reader, "tokenizer.ggml.tokens")
    merges: list[str] = gguf_value(reader, "tokenizer.ggml.merges", [])
    types: list[int] = gguf_value(reader, "tokenizer.ggml.token_type", [])
    pre = gguf_value(reader, "tokenizer.ggml.pre", None)
    if pre is None:
        logger.warning("%s: no tokenizer.ggml.pre; splitting text the GPT-2 way", file)
        pre = "gpt-2"

    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError(f"{file}: tokenizer.ggml.tokens has duplicate entries")
    pairs: list[tuple[str, str]] = []
    for merge in merges:
        left, sep, right = merge.partition(" ")
        if not sep:
            raise ValueError(f"{file}: tokenizer.ggml.merges entry {merge!r} is not 'a b'")
        pairs.append((left, right))
    backend = HFBackend(models.BPE(vocab=vocab, merges=pairs))
    backend.pre_tokenizer = _pre_tokenizer(pre, file)
    backend.decoder = decoders.ByteLevel()
    if types:
        backend.add_special_tokens(
            [
                AddedToken(tokens[i], special=True, normalized=False)
                for i, t in enumerate(types)
                if t == _CONTROL
            ]
        )
        backend.add_tokens(
            [
                AddedToken(tokens[i], special=False, normalized=False)
                for i, t in enumerate(types)
                if t == _USER_DEFINED
            ]
        )
    if backend.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise ValueError(f"{file}: tokenizer vocabulary grew past tokenizer.ggml.tokens")

    name = gguf_value(reader, "general.name", None) or Path(file).stem
    return HFTokenizer(
        backend,
        name=str(name),
        bos_token_id=gguf_value(reader, "tokenizer.ggml.bos_token_id", None),
        eos_token_id=gguf_value(reader, "tokenizer.ggml.eos_token_id", None),
        chat_template=gguf_value(reader, "tokenizer.chat_template", None),
    )


class IncrementalDecoder:
    """Turns a stream of token ids into text deltas for streaming.

    Decoding each token alone breaks multi-byte characters and tokenizers that drop a leading
    space at the start of a sequence, so each delta is the text of a window (the previous chunk
    plus the new ids) minus the text of the previous chunk. A delta that ends in U+FFFD is held
    back until the character completes; ``flush`` releases whatever is left at the end.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._decode: Callable[[Sequence[int]], str] = tokenizer.decode
        self._ids: list[int] = []
        self._prefix = 0  # window start: the first id of the last emitted chunk
        self._read = 0  # ids before this have been emitted

    def push(self, ids: Sequence[int]) -> str:
        """Add ``ids``; return the text they complete (possibly empty)."""
        self._ids.extend(ids)
        return self._emit(final=False)

    def flush(self) -> str:
        """Everything not yet returned, incomplete characters included (as U+FFFD)."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        before = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        if not final and (text.endswith(REPLACEMENT_CHAR) or len(text) <= len(before)):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(before) :]
