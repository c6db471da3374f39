"""Prompt text to token ids, off the event loop, with a length bound checked first.

Tokenizing and rendering a chat template are linear in the text but not cheap: three 7.8 MB
prompts to SmolLM2 took 19 to 47 s each, and on the event loop they stalled every other request,
``/health`` included. So:

- a text longer in UTF-8 bytes than ``max_model_len * max_token_bytes(tokenizer)`` is refused
  before any tokenizer sees it: no token stands for more than ``max_token_bytes`` bytes of input,
  so such a text has more than ``max_model_len`` tokens and would be refused anyway;
- the rest is rendered and tokenized on a small thread pool (an HF tokenizer releases the GIL
  while it encodes), so the loop keeps answering.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from speclens.engine.tokenizer import ByteTokenizer, Tokenizer
from speclens.server.protocol import ApiError

#: Threads that tokenize: a huge prompt does not hold up the small ones behind it, and the engine
#: thread keeps its cores.
TOKENIZE_THREADS = 2
#: Input bytes one token may stand for, for a tokenizer whose vocabulary cannot be read here.
FALLBACK_MAX_TOKEN_BYTES = 256


def max_token_bytes(tokenizer: Tokenizer) -> int:
    """An upper bound on the input bytes one token stands for.

    The byte tokenizer: 1 (one token a byte). An HF tokenizer: the longest spelling in its
    vocabulary, added tokens included, in UTF-8 bytes; a byte-level spelling takes 2 bytes for
    some single bytes (``Ġ`` for a space), so the bound is generous, never short. (A normalizer
    that deletes input could make a text that fits look too long; no shipped tokenizer has one.)
    """
    if isinstance(tokenizer, ByteTokenizer):
        return 1
    get_vocab = getattr(getattr(tokenizer, "backend", None), "get_vocab", None)
    if get_vocab is None:
        return FALLBACK_MAX_TOKEN_BYTES
    vocab: dict[str, int] = get_vocab(with_added_tokens=True)
    return max((len(token.encode("utf-8")) for token in vocab), default=1) or 1


class PromptEncoder:
    """Renders and encodes prompts on its own threads; refuses a text too long by its bytes."""

    def __init__(self, tokenizer: Tokenizer, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.bytes_per_token = max_token_bytes(tokenizer)
        self.max_bytes = max_model_len * self.bytes_per_token
        self._pool: ThreadPoolExecutor | None = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    async def _run(self, fn: Any, *args: Any) -> Any:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(TOKENIZE_THREADS, thread_name_prefix="speclens-tok")
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def check_length(self, text: str, param: str) -> None:
        """Refuse a text with more bytes than ``max_model_len`` tokens can stand for. Counting
        UTF-8 bytes is cheap: ``len(text)`` bounds them from below, ``4 * len(text)`` above."""
        if len(text) <= self.max_bytes // 4:
            return
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > self.max_bytes:
            raise ApiError(
                400,
                f"this model's maximum context length is {self.max_model_len} tokens; the "
                f"prompt has {size} bytes, more than {self.max_model_len} tokens of at most "
                f"{self.bytes_per_token} bytes each can spell ({self.max_bytes} bytes)",
                param,
            )

    async def encode(self, text: str, param: str = "prompt") -> list[int]:
        self.check_length(text, param)
        ids: list[int] = await self._run(self.tokenizer.encode, text)
        return ids

    async def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Render the chat template, then encode; a template that refuses the messages is a 400.
        The rendered text is what is checked (a template may add text, or drop some)."""
        try:
            text: str = await self._run(self.tokenizer.apply_chat_template, messages)
        except ValueError as exc:
            raise ApiError(400, str(exc), "messages") from None
        return await self.encode(text, "messages")
