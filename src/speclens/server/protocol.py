"""The OpenAI-compatible wire format: request bodies, and the per-request speculative-decoding
payloads in both shapes engines put on the wire.

- per choice, ``speculative_decoding_stats``: the histogram as a map with string keys;
- at the response root, vLLM's ``metrics.speculative_decoding``: the histogram as a dense list,
  index j = steps that accepted exactly j drafts, length K + 1.

``summary`` carries the totals; ``detailed`` adds the per-step arrays. Both are null for n > 1.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from speclens.engine import RequestAcceptance, SamplingParams
from speclens.engine.request import stop_problem

StatsLevel = Literal["none", "summary", "detailed"]
Role = Literal["system", "user", "assistant", "developer", "tool"]


def _no_bool(value: Any) -> Any:
    """JSON ``true`` is not a number (Python's bool is an int, so pydantic would take it)."""
    if isinstance(value, bool):
        raise PydanticCustomError(
            "number_type", "expected a number, got {value}", {"value": str(value).lower()}
        )
    return value


Int = Annotated[int, BeforeValidator(_no_bool)]
Float = Annotated[float, BeforeValidator(_no_bool)]


def _bad_text(value: Any, path: str) -> str | None:
    """The first string (or key) in ``value`` that UTF-8 cannot encode, as ``path: why``."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"{path or 'body'}: not valid UTF-8 text ({exc.reason} at {exc.start})"
    elif isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            problem = _bad_text(key, path) or _bad_text(item, where)
            if problem:
                return problem
    elif isinstance(value, list):
        for i, item in enumerate(value):
            problem = _bad_text(item, f"{path}[{i}]")
            if problem:
                return problem
    return None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Request(BaseModel):
    """Fields both endpoints share. Unknown OpenAI fields are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: Int | None = Field(None, ge=1)
    temperature: Float = Field(1.0, ge=0.0, le=2.0)
    top_p: Float = Field(1.0, gt=0.0, le=1.0)
    top_k: Int = Field(-1, ge=-1)
    n: Int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Int] | None = None
    seed: Int | None = None
    ignore_eos: bool = False
    user: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_early(cls, data: Any) -> Any:
        """Refuse ``stop`` or ``stop_token_ids`` over its bound (before walking their items), and
        a string no tokenizer can encode (a lone surrogate, which JSON can spell as
        ``\\ud800``) anywhere in the body, before any handler sees it. ``field`` in the error's
        context names the field for the error body's ``param``."""
        if isinstance(data, dict):
            bound = stop_problem(data.get("stop"), data.get("stop_token_ids"))
            if bound is not None:
                raise PydanticCustomError(
                    "too_long", "{problem}", {"problem": bound[1], "field": bound[0]}
                )
        problem = _bad_text(data, "")
        if problem:
            raise PydanticCustomError("invalid_text", "{problem}", {"problem": problem})
        return data

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_tokens=self.max_tokens or default_max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            stop=[s for s in stop if s],
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            n=self.n,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


class CompletionRequest(_Request):
    prompt: str | list[Int] | list[str] | list[list[Int]]
    echo: bool = False
    logprobs: Int | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        if isinstance(value, list) and value and isinstance(value[0], str | list):
            if len(value) != 1:
                raise ValueError("send one prompt per request (got a batch of prompts)")
            return value[0]
        return value


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Role
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int | None = Field(None, ge=1)

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        params = super().sampling_params(default_max_tokens)
        if self.max_tokens is None and self.max_completion_tokens is not None:
            params.max_tokens = self.max_completion_tokens
        return params


def choice_stats(acceptance: RequestAcceptance, level: StatsLevel) -> dict[str, Any] | None:
    """The per-choice ``speculative_decoding_stats`` object (histogram keyed by strings).

    ``num_decode_steps`` (every decode step, drafted or not) extends vLLM's fields so a client can
    tell draft coverage; the root shape carries it too.
    """
    if level == "none" or acceptance.num_spec_tokens is None:
        return None
    out: dict[str, Any] = {
        "mean_acceptance_length": acceptance.mean_acceptance_length,
        "draft_acceptance_rate": acceptance.draft_acceptance_rate,
        "acceptance_histogram": {str(j): n for j, n in acceptance.histogram.counts.items()},
        "num_accepted_draft_tokens": acceptance.num_accepted_tokens,
        "num_draft_tokens": acceptance.num_draft_tokens,
        "num_spec_steps": acceptance.num_spec_steps,
        "num_spec_tokens": acceptance.num_spec_tokens,
        "num_decode_steps": acceptance.num_decode_steps,
    }
    if level == "detailed":
        out["per_step_accepted"] = list(acceptance.per_step_accepted)
        out["per_step_drafted"] = list(acceptance.per_step_drafted)
    return out


def root_metrics(acceptance: RequestAcceptance, level: StatsLevel) -> dict[str, Any] | None:
    """vLLM's response-root ``metrics`` object with ``speculative_decoding`` (dense histogram)."""
    if level == "none" or acceptance.num_spec_tokens is None:
        return None
    k = acceptance.num_spec_tokens
    spec: dict[str, Any] = {
        "num_spec_tokens": k,
        "num_spec_steps": acceptance.num_spec_steps,
        "num_draft_tokens": acceptance.num_draft_tokens,
        "num_accepted_draft_tokens": acceptance.num_accepted_tokens,
        "mean_acceptance_length": acceptance.mean_acceptance_length,
        "draft_acceptance_rate": acceptance.draft_acceptance_rate,
        "acceptance_histogram": acceptance.histogram.dense(k),
        "num_decode_steps": acceptance.num_decode_steps,
    }
    if level == "detailed":
        spec["per_step_accepted"] = list(acceptance.per_step_accepted)
        spec["per_step_drafted"] = list(acceptance.per_step_drafted)
    return {"speculative_decoding": spec}


class ApiError(Exception):
    """A request refused with an OpenAI-style error body (``status``, the field ``param``)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def error_type(status: int) -> str:
    """OpenAI's error ``type`` for a status: every 4xx is the client's request, except the
    API key (401) and permission (403); a 5xx is the server's."""
    if 400 <= status < 500:
        return {401: "authentication_error", 403: "permission_error"}.get(
            status, "invalid_request_error"
        )
    return "service_unavailable" if status == 503 else "server_error"


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error object."""
    return {
        "error": {
            "message": message,
            "type": error_type(status),
            "param": param,
            "code": status,
        }
    }
