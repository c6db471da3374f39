"""Recorded-style wire payloads for the spec-decode adapters, written by hand.

Each function returns a fresh ``responses`` list (what the client hands ``detect``): one body when
not streaming, every parsed SSE data chunk in order when streaming (``[DONE]`` is not JSON and is
never in the list). Every payload describes the same request unless it says otherwise:

    K = 3, five verify steps accepting [3, 1, 0, 2, 3] of [3, 3, 3, 3, 3] drafts
    -> 9 accepted of 15 drafted, histogram {0: 1, 1: 1, 2: 1, 3: 2}, AL 2.8, rate 0.6,
       15 completion tokens (1 from prefill + 14 from the verify steps).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

Responses = list[dict[str, Any]]

K = 3
PER_STEP_ACCEPTED = [3, 1, 0, 2, 3]
PER_STEP_DRAFTED = [3, 3, 3, 3, 3]
HISTOGRAM = {0: 1, 1: 1, 2: 1, 3: 2}
ACCEPTED, DRAFTED, STEPS = 9, 15, 5
AL, RATE = 2.8, 0.6
COMPLETION_TOKENS = 15
USAGE = {"prompt_tokens": 24, "completion_tokens": 15, "total_tokens": 39}
DETAILED = {"per_step_accepted": (3, 1, 0, 2, 3), "per_step_drafted": (3, 3, 3, 3, 3)}

# --- the payload objects themselves ----------------------------------------------------------------

VLLM_STATS_SUMMARY = {
    "mean_acceptance_length": 2.8,
    "draft_acceptance_rate": 0.6,
    "acceptance_histogram": {"0": 1, "1": 1, "2": 1, "3": 2},
    "num_accepted_draft_tokens": 9,
    "num_draft_tokens": 15,
    "num_spec_steps": 5,
    "num_spec_tokens": 3,
}
VLLM_STATS_DETAILED = {
    **VLLM_STATS_SUMMARY,
    "per_step_accepted": [3, 1, 0, 2, 3],
    "per_step_drafted": [3, 3, 3, 3, 3],
}
# What speclens' own server puts at the root (protocol.root_metrics), detailed level.
ROOT_METRICS_DETAILED = {
    "speculative_decoding": {
        "num_spec_tokens": 3,
        "num_spec_steps": 5,
        "num_draft_tokens": 15,
        "num_accepted_draft_tokens": 9,
        "mean_acceptance_length": 2.8,
        "draft_acceptance_rate": 0.6,
        "acceptance_histogram": [1, 1, 1, 2],
        "per_step_accepted": [3, 1, 0, 2, 3],
        "per_step_drafted": [3, 3, 3, 3, 3],
    }
}
# vLLM's merged shape as vLLM spells it: its counter names, K implied by the dense length.
VLLM_ROOT_METRICS_SUMMARY = {
    "speculative_decoding": {
        "num_drafts": 5,
        "num_draft_tokens": 15,
        "num_accepted_tokens": 9,
        "mean_acceptance_length": 2.8,
        "draft_acceptance_rate": 0.6,
        "acceptance_histogram": [1, 1, 1, 2],
    }
}
TRTLLM_SPEC = {
    "acceptance_rate": 0.6,
    "total_accepted_draft_tokens": 9,
    "total_draft_tokens": 15,
    "num_spec_steps": 5,
    "acceptance_histogram": [1, 1, 1, 2],
    "num_spec_tokens": 3,
}
# SGLang's spec_accept_length is completion_tokens / verify steps = 15 / 5 = 3.0, not 2.8.
SGLANG_META_OLD = {
    "id": "5f2c8a0e1b7d4c3a9e6f0d2b1a8c7e4f",
    "finish_reason": {"type": "length", "length": 15},
    "prompt_tokens": 24,
    "completion_tokens": 15,
    "cached_tokens": 0,
    "spec_verify_ct": 5,
    "spec_accept_rate": 0.6,
    "spec_accept_length": 3.0,
    "spec_accept_token_num": 9,
    "spec_draft_token_num": 15,
    "spec_accept_histogram": [1, 1, 1, 2],
    "e2e_latency": 0.412,
}
SGLANG_META_NEW = {
    "id": "9d1e4b7a2c6f4e08b3a5d7c9e1f20a4b",
    "finish_reason": {"type": "length", "length": 15},
    "prompt_tokens": 24,
    "completion_tokens": 15,
    "cached_tokens": 0,
    "spec_verify_ct": 5,
    "spec_num_correct_drafts": 9,
    "spec_accepted_drafts": 9,
    "spec_num_proposed_drafts": 15,
    "spec_proposed_drafts": 15,
    "spec_correct_drafts_histogram": [1, 1, 1, 2],
    "spec_accept_histogram": [1, 1, 1, 2],
    "spec_accept_rate": 0.6,
    "spec_accept_length": 3.0,
    "e2e_latency": 0.398,
}


def _c(value: Any) -> Any:
    return copy.deepcopy(value)


# --- vLLM per-choice speculative_decoding_stats ---------------------------------------------------


def vllm_chat_summary() -> Responses:
    return [
        {
            "id": "chatcmpl-8b2e5f1c9a7d4e3b",
            "object": "chat.completion",
            "created": 1764450000,
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "The capital of France is Paris."},
                    "logprobs": None,
                    "finish_reason": "length",
                    "stop_reason": None,
                    "speculative_decoding_stats": _c(VLLM_STATS_SUMMARY),
                }
            ],
            "usage": _c(USAGE),
            "prompt_logprobs": None,
        }
    ]


def vllm_completions_detailed() -> Responses:
    return [
        {
            "id": "cmpl-3f9a1d2c7b6e4a58",
            "object": "text_completion",
            "created": 1764450001,
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "choices": [
                {
                    "index": 0,
                    "text": " Paris, which is also its largest city.",
                    "logprobs": None,
                    "finish_reason": "length",
                    "stop_reason": None,
                    "prompt_logprobs": None,
                    "speculative_decoding_stats": _c(VLLM_STATS_DETAILED),
                }
            ],
            "usage": _c(USAGE),
        }
    ]


def vllm_chat_stream_summary() -> Responses:
    """include_usage: usage is null on every chunk but the trailing usage-only chunk."""
    base = {
        "id": "chatcmpl-1a2b3c4d5e6f7a8b",
        "object": "chat.completion.chunk",
        "created": 1764450002,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
    }
    delta = [
        {"role": "assistant", "content": ""},
        {"content": "The capital"},
        {"content": " of France is"},
        {"content": " Paris."},
    ]
    chunks: Responses = [
        {
            **base,
            "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": None}],
            "usage": None,
        }
        for d in delta
    ]
    chunks.append(
        {
            **base,
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": ""},
                    "logprobs": None,
                    "finish_reason": "length",
                    "stop_reason": None,
                    "speculative_decoding_stats": _c(VLLM_STATS_SUMMARY),
                }
            ],
            "usage": None,
        }
    )
    chunks.append({**base, "choices": [], "usage": _c(USAGE)})
    return chunks


def vllm_completions_stream_detailed() -> Responses:
    """continuous_usage_stats: every chunk carries cumulative usage; the last one counts."""
    base = {
        "id": "cmpl-7e6d5c4b3a291807",
        "object": "text_completion",
        "created": 1764450003,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
    }
    pieces = [(" Paris", 1), (", which is also", 5), (" its largest", 9), (" city.", 15)]
    chunks: Responses = []
    for i, (text, tokens) in enumerate(pieces):
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None}
        last = i == len(pieces) - 1
        choice["finish_reason"] = "length" if last else None
        if last:
            choice["speculative_decoding_stats"] = _c(VLLM_STATS_DETAILED)
        usage = {"prompt_tokens": 24, "completion_tokens": tokens, "total_tokens": 24 + tokens}
        chunks.append({**base, "choices": [choice], "usage": usage})
    return chunks


# --- speclens' own server: both shapes in one response ---------------------------------------------


def speclens_both_chat() -> Responses:
    return [
        {
            "id": "chatcmpl-0d9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a",
            "object": "chat.completion",
            "created": 1764450004,
            "model": "speclens-tiny",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "\u00e9\u00e8 k7!"},
                    "logprobs": None,
                    "finish_reason": "length",
                    "speculative_decoding_stats": _c(VLLM_STATS_DETAILED),
                }
            ],
            "usage": _c(USAGE),
            "metrics": _c(ROOT_METRICS_DETAILED),
        }
    ]


def speclens_both_completions_stream() -> Responses:
    """include_usage: per-choice stats on the finishing chunk, root metrics on the usage chunk."""
    base = {
        "id": "cmpl-5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d",
        "object": "text_completion",
        "created": 1764450005,
        "model": "speclens-tiny",
    }
    return [
        {**base, "choices": [{"index": 0, "text": "ab", "logprobs": None, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "text": "cde", "logprobs": None, "finish_reason": None}]},
        {
            **base,
            "choices": [
                {
                    "index": 0,
                    "text": "fg",
                    "logprobs": None,
                    "finish_reason": "length",
                    "speculative_decoding_stats": _c(VLLM_STATS_DETAILED),
                }
            ],
        },
        {**base, "choices": [], "usage": _c(USAGE), "metrics": _c(ROOT_METRICS_DETAILED)},
    ]


# --- vLLM merged shape only ---------------------------------------------------------------------


def vllm_metrics_chat() -> Responses:
    body = vllm_chat_summary()[0]
    del body["choices"][0]["speculative_decoding_stats"]
    body["metrics"] = _c(VLLM_ROOT_METRICS_SUMMARY)
    return [body]


def vllm_metrics_chat_stream() -> Responses:
    """The merged shape rides the final usage chunk."""
    chunks = vllm_chat_stream_summary()
    del chunks[-2]["choices"][0]["speculative_decoding_stats"]
    chunks[-1]["metrics"] = _c(VLLM_ROOT_METRICS_SUMMARY)
    return chunks


# --- TensorRT-LLM -------------------------------------------------------------------------------


def trtllm_chat() -> Responses:
    return [
        {
            "id": "chatcmpl-4c1f2e9d8b7a6c5e",
            "object": "chat.completion",
            "created": 1764450006,
            "model": "Llama-3.1-8B-Instruct-eagle3",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Paris.", "tool_calls": []},
                    "logprobs": None,
                    "finish_reason": "length",
                    "stop_reason": None,
                    "speculative_decoding": _c(TRTLLM_SPEC),
                }
            ],
            "usage": _c(USAGE),
        }
    ]


def trtllm_completions_stream() -> Responses:
    base = {
        "id": "cmpl-9e8f7a6b5c4d3e2f",
        "object": "text_completion",
        "created": 1764450007,
        "model": "Llama-3.1-8B-Instruct-eagle3",
    }
    return [
        {**base, "choices": [{"index": 0, "text": " Paris", "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "text": ", the", "finish_reason": None}]},
        {
            **base,
            "choices": [
                {
                    "index": 0,
                    "text": " capital.",
                    "finish_reason": "length",
                    "speculative_decoding": _c(TRTLLM_SPEC),
                }
            ],
        },
        {**base, "choices": [], "usage": _c(USAGE)},
    ]


# --- SGLang -------------------------------------------------------------------------------------


def sglang_chat() -> Responses:
    """The OpenAI route with meta_info on the choice (older count spellings)."""
    return [
        {
            "id": "5f2c8a0e1b7d4c3a9e6f0d2b1a8c7e4f",
            "object": "chat.completion",
            "created": 1764450008,
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": "Paris.",
                        "reasoning_content": None,
                    },
                    "logprobs": None,
                    "finish_reason": "length",
                    "matched_stop": None,
                    "meta_info": _c(SGLANG_META_OLD),
                }
            ],
            "usage": _c(USAGE),
        }
    ]


def sglang_native() -> Responses:
    """Native /generate: meta_info at the root, current spellings, no usage at all."""
    return [
        {
            "text": " Paris, which is also its largest city.",
            "output_ids": [12366, 11, 902, 374, 1101, 1202, 7928, 3363, 13],
            "meta_info": _c(SGLANG_META_NEW),
        }
    ]


def sglang_native_stream() -> Responses:
    """Native streaming: meta_info is cumulative, each chunk restates the totals so far."""
    first = _c(SGLANG_META_NEW)
    first.update(
        finish_reason=None,
        completion_tokens=8,
        spec_verify_ct=3,
        spec_num_correct_drafts=4,
        spec_accepted_drafts=4,
        spec_num_proposed_drafts=9,
        spec_proposed_drafts=9,
        spec_correct_drafts_histogram=[1, 1, 0, 1],
        spec_accept_histogram=[1, 1, 0, 1],
    )
    return [
        {"text": " Paris, which", "output_ids": [12366, 11, 902], "meta_info": first},
        {
            "text": " is also its largest city.",
            "output_ids": [13],
            "meta_info": _c(SGLANG_META_NEW),
        },
    ]


# --- the edge cases ------------------------------------------------------------------------------


def vllm_zero_step() -> Responses:
    """Spec decode on, but the request finished before any verify step (max_tokens=1)."""
    body = vllm_chat_summary()[0]
    body["choices"][0]["speculative_decoding_stats"] = {
        "mean_acceptance_length": 1.0,
        "draft_acceptance_rate": 0.0,
        "acceptance_histogram": {},
        "num_accepted_draft_tokens": 0,
        "num_draft_tokens": 0,
        "num_spec_steps": 0,
        "num_spec_tokens": 3,
    }
    body["usage"] = {"prompt_tokens": 24, "completion_tokens": 1, "total_tokens": 25}
    return [body]


def vllm_fully_rejected() -> Responses:
    body = vllm_completions_detailed()[0]
    body["choices"][0]["speculative_decoding_stats"] = {
        "mean_acceptance_length": 1.0,
        "draft_acceptance_rate": 0.0,
        "acceptance_histogram": {"0": 4},
        "num_accepted_draft_tokens": 0,
        "num_draft_tokens": 12,
        "num_spec_steps": 4,
        "num_spec_tokens": 3,
        "per_step_accepted": [0, 0, 0, 0],
        "per_step_drafted": [3, 3, 3, 3],
    }
    body["usage"] = {"prompt_tokens": 24, "completion_tokens": 5, "total_tokens": 29}
    return [body]


def vllm_grammar_adjusted() -> Responses:
    """Structured output invalidated one draft at step 2: 14 counted, not 15 (post-adjustment)."""
    body = vllm_completions_detailed()[0]
    stats = body["choices"][0]["speculative_decoding_stats"]
    stats.update(
        num_draft_tokens=14, draft_acceptance_rate=9 / 14, per_step_drafted=[3, 2, 3, 3, 3]
    )
    return [body]


def speclens_zero_step_both() -> Responses:
    body = vllm_zero_step()[0]
    body["metrics"] = {
        "speculative_decoding": {
            "num_spec_tokens": 3,
            "num_spec_steps": 0,
            "num_draft_tokens": 0,
            "num_accepted_draft_tokens": 0,
            "mean_acceptance_length": 1.0,
            "draft_acceptance_rate": 0.0,
            "acceptance_histogram": [0, 0, 0, 0],
        }
    }
    return [body]


def trtllm_fully_rejected() -> Responses:
    body = trtllm_chat()[0]
    body["choices"][0]["speculative_decoding"] = {
        "acceptance_rate": 0.0,
        "total_accepted_draft_tokens": 0,
        "total_draft_tokens": 12,
        "num_spec_steps": 4,
        "acceptance_histogram": [4, 0, 0, 0],
        "num_spec_tokens": 3,
    }
    return [body]


def sglang_zero_step() -> Responses:
    """Current SGLang sends the step count and an empty histogram when nothing was verified."""
    body = sglang_native()[0]
    body["meta_info"] = {
        "id": "0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f",
        "finish_reason": {"type": "length", "length": 1},
        "prompt_tokens": 24,
        "completion_tokens": 1,
        "spec_verify_ct": 0,
        "spec_correct_drafts_histogram": [],
    }
    return [body]


def vllm_no_usage() -> Responses:
    body = vllm_chat_summary()[0]
    del body["usage"]
    return [body]


def vllm_stream_no_usage() -> Responses:
    """A stream without include_usage: no chunk carries usage."""
    chunks = vllm_chat_stream_summary()[:-1]
    for chunk in chunks:
        del chunk["usage"]
    return chunks


def vllm_chat_n2() -> Responses:
    """n = 2: each choice carries its own per-sequence stats; the record must be suppressed."""
    body = vllm_chat_summary()[0]
    second = _c(body["choices"][0])
    second["index"] = 1
    second["speculative_decoding_stats"] = {
        "mean_acceptance_length": 2.0,
        "draft_acceptance_rate": 1 / 3,
        "acceptance_histogram": {"0": 2, "1": 1, "3": 1},
        "num_accepted_draft_tokens": 4,
        "num_draft_tokens": 12,
        "num_spec_steps": 4,
        "num_spec_tokens": 3,
    }
    body["choices"].append(second)
    body["usage"] = {"prompt_tokens": 24, "completion_tokens": 24, "total_tokens": 48}
    return [body]


def vllm_stream_n2() -> Responses:
    """n = 2 streamed: each chunk carries one choice, told apart only by its index."""
    chunks = vllm_chat_stream_summary()
    out: Responses = []
    for chunk in chunks[:-1]:
        for index in (0, 1):
            twin = _c(chunk)
            for choice in twin["choices"]:
                choice["index"] = index
            out.append(twin)
    out.append(chunks[-1])
    return out


def trtllm_n2() -> Responses:
    body = trtllm_chat()[0]
    second = _c(body["choices"][0])
    second["index"] = 1
    body["choices"].append(second)
    return [body]


def sglang_chat_n2() -> Responses:
    body = sglang_chat()[0]
    second = _c(body["choices"][0])
    second["index"] = 1
    body["choices"].append(second)
    return [body]


def speclens_n2() -> Responses:
    """Our server with n = 2: no per-choice stats, and the root metrics are null."""
    body = vllm_chat_n2()[0]
    for choice in body["choices"]:
        del choice["speculative_decoding_stats"]
    body["metrics"] = None
    return [body]


def spec_decode_off() -> Responses:
    body = vllm_chat_summary()[0]
    del body["choices"][0]["speculative_decoding_stats"]
    return [body]


def spec_decode_null() -> Responses:
    """Stats enabled on a server whose speculation is off: the fields are null."""
    body = vllm_chat_summary()[0]
    body["choices"][0]["speculative_decoding_stats"] = None
    body["metrics"] = None
    return [body]


#: name -> (payload, adapter that reads it, engine, fields expected on the record)
VALID: dict[str, tuple[Callable[[], Responses], str, str, dict[str, Any]]] = {
    "vllm-chat-summary": (vllm_chat_summary, "vllm-per-choice-stats", "vllm", {}),
    "vllm-completions-detailed": (
        vllm_completions_detailed,
        "vllm-per-choice-stats",
        "vllm",
        DETAILED,
    ),
    "vllm-chat-stream-summary": (vllm_chat_stream_summary, "vllm-per-choice-stats", "vllm", {}),
    "vllm-completions-stream-detailed": (
        vllm_completions_stream_detailed,
        "vllm-per-choice-stats",
        "vllm",
        DETAILED,
    ),
    "speclens-both-chat": (
        speclens_both_chat,
        "vllm-per-choice-stats",
        "vllm",
        DETAILED,
    ),
    "speclens-both-completions-stream": (
        speclens_both_completions_stream,
        "vllm-per-choice-stats",
        "vllm",
        DETAILED,
    ),
    "vllm-metrics-chat": (vllm_metrics_chat, "vllm-root-metrics", "vllm", {}),
    "vllm-metrics-chat-stream": (vllm_metrics_chat_stream, "vllm-root-metrics", "vllm", {}),
    "trtllm-chat": (trtllm_chat, "trtllm-per-choice", "trtllm", {}),
    "trtllm-completions-stream": (trtllm_completions_stream, "trtllm-per-choice", "trtllm", {}),
    "sglang-chat": (sglang_chat, "sglang-meta-info", "sglang", {"num_spec_tokens": None}),
    "sglang-native": (
        sglang_native,
        "sglang-meta-info",
        "sglang",
        {"num_spec_tokens": None, "completion_tokens": None},
    ),
    "sglang-native-stream": (
        sglang_native_stream,
        "sglang-meta-info",
        "sglang",
        {"num_spec_tokens": None, "completion_tokens": None},
    ),
    "vllm-grammar-adjusted": (
        vllm_grammar_adjusted,
        "vllm-per-choice-stats",
        "vllm",
        {
            "per_step_accepted": (3, 1, 0, 2, 3),
            "per_step_drafted": (3, 2, 3, 3, 3),
            "num_draft_tokens": 14,
            "draft_acceptance_rate": 9 / 14,
        },
    ),
    "vllm-no-usage": (vllm_no_usage, "vllm-per-choice-stats", "vllm", {"completion_tokens": None}),
    "vllm-stream-no-usage": (
        vllm_stream_no_usage,
        "vllm-per-choice-stats",
        "vllm",
        {"completion_tokens": None},
    ),
}

#: What every VALID payload reports unless its entry overrides it.
EXPECTED_DEFAULTS: dict[str, Any] = {
    "mean_acceptance_length": AL,
    "draft_acceptance_rate": RATE,
    "acceptance_histogram": HISTOGRAM,
    "num_accepted_draft_tokens": ACCEPTED,
    "num_draft_tokens": DRAFTED,
    "num_spec_steps": STEPS,
    "num_spec_tokens": K,
    "completion_tokens": COMPLETION_TOKENS,
    "per_step_accepted": None,
    "per_step_drafted": None,
    "num_decode_steps": None,
}
