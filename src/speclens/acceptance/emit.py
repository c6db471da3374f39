"""What forces a resolved acceptance in another engine: one copy-pasteable line per engine.

Each emitter follows the engine's current source (cited in its docstring) and refuses what the
engine cannot express rather than printing something close. vLLM takes per-position rates; ATOM,
SGLang and TensorRT-LLM take one number and force the minimum-variance schedule of its AL, so a
stated schedule that differs from it is refused there. No engine forces draft coverage (the
drafter decides which steps draft): a stated coverage below 1 becomes a note.

``serving`` writes the flags that serve K with a method (no forcing), for ``speclens sim
--context --emit``: the same method rules, so the two commands cannot disagree. Every value a
line carries is quoted for the shell (``shlex.quote``): a line is pasted into one.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from speclens.acceptance.errors import ResolutionRefused
from speclens.acceptance.quantity import minimum_variance_rates
from speclens.acceptance.resolver import Resolution

#: Engines ``--emit`` knows, in the order the help lists them.
ENGINES = ("vllm", "atom", "sglang", "trtllm")

#: ATOM's ``--method`` choices (``atom/model_engine/arg_utils.py``).
ATOM_METHODS = ("mtp", "eagle3", "dspark")

#: SGLang's ``--speculative-algorithm`` name for each method (``python/sglang/srt/speculative/
#: spec_info.py``, ``SpeculativeAlgorithm``; ``python/sglang/srt/server_args.py``,
#: ``_handle_speculative_decoding``, which reads ``NEXTN`` as ``EAGLE``): an MTP head runs as
#: EAGLE, as InferenceX's DeepSeek MTP scripts start it; a separate draft model as STANDALONE.
SGLANG_ALGORITHMS = {"mtp": "EAGLE", "eagle": "EAGLE", "eagle3": "EAGLE3", "dspark": "DSPARK",
                     "draft_model": "STANDALONE", "ngram": "NGRAM"}  # fmt: skip

#: vLLM 0.32 methods that find their draft without a ``model`` key (``vllm/config/
#: speculative.py``, ``SpeculativeConfig.__post_init__``); any other needs one.
VLLM_SELF_DRAFTING = ("ngram", "ngram_gpu", "suffix", "mtp", "dspark", "extract_hidden_states")

#: How close a stated schedule must be to the minimum-variance one to count as it.
_SAME = 1e-9


class EmitRefused(ResolutionRefused):
    """The engine cannot force this resolution; the message names the engine and why."""


@dataclass(frozen=True)
class Emission:
    """``line`` forces the acceptance; ``notes`` say what else the engine needs to match it."""

    engine: str
    line: str
    notes: tuple[str, ...] = field(default=())


def _number(value: float) -> str:
    """The shortest text that reads back as ``value`` (``3.51``, not ``3.5100000000000002``)."""
    return repr(float(value))


def check_method(engine: str, method: str) -> None:
    """Refuse a method ``engine`` has no flag for (ATOM's ``--method`` choices, SGLang's
    ``--speculative-algorithm`` names)."""
    if engine == "atom" and method not in ATOM_METHODS:
        raise EmitRefused(f"atom: --method takes {', '.join(ATOM_METHODS)}; got {method!r}")
    if engine == "sglang" and method not in SGLANG_ALGORITHMS:
        raise EmitRefused(f"sglang: --speculative-algorithm has a name for "
                          f"{', '.join(SGLANG_ALGORITHMS)}; got {method!r}")  # fmt: skip


def _method_notes(engine: str, method: str) -> tuple[str, ...]:
    """What else ``engine`` needs to serve ``method`` (a draft model the line cannot name)."""
    if engine == "vllm" and method not in VLLM_SELF_DRAFTING:
        return (f'vllm: method {method} also needs the draft\'s "model" key in this JSON',)
    if engine == "atom" and method == "eagle3":
        return ("atom: --method eagle3 also needs --draft-model",)
    if engine == "sglang" and method in ("eagle", "eagle3", "dspark", "draft_model"):
        return (f"sglang: --speculative-algorithm {SGLANG_ALGORITHMS[method]} also needs "
                "--speculative-draft-model-path",)  # fmt: skip
    return ()


def _sglang(method: str, k: int) -> str:
    """SGLang's flags for a chain of K drafts with ``method`` (``check_method`` first)."""
    algorithm = SGLANG_ALGORITHMS[method]
    if method == "dspark":  # _handle_dspark: num_steps 1, topk 1, draft tokens block size + 1
        return (f"--speculative-algorithm DSPARK --speculative-dspark-block-size {k} "
                f"--speculative-num-draft-tokens {k + 1}")  # fmt: skip
    if method == "ngram":  # NGRAM: topk is the BFS breadth; draft tokens count the root
        return (f"--speculative-algorithm NGRAM --speculative-ngram-max-bfs-breadth 1 "
                f"--speculative-num-draft-tokens {k + 1}")  # fmt: skip
    return (f"--speculative-algorithm {algorithm} --speculative-num-steps {k} "
            f"--speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}")  # fmt: skip


def vllm_config(config: dict[str, object]) -> str:
    """vLLM's ``--speculative-config`` with ``config`` as JSON, quoted for the shell."""
    return "--speculative-config " + shlex.quote(json.dumps(config))


def serving(engine: str, method: str, k: int) -> Emission:
    """The flags that serve K ``k`` with ``method`` in ``engine`` (K 0: no speculative flags);
    raises ``EmitRefused`` for a method the engine cannot take, ``ValueError`` for an unknown
    engine.

    - vLLM (``vllm/config/speculative.py``, ``SpeculativeConfig``): ``--speculative-config``
      JSON with ``method`` and ``num_speculative_tokens``.
    - SGLang (``python/sglang/srt/server_args.py``): ``--speculative-algorithm`` (the
      method's name, ``SGLANG_ALGORITHMS``), ``--speculative-num-steps`` K,
      ``--speculative-eagle-topk 1`` (a chain) and ``--speculative-num-draft-tokens`` K + 1;
      DSpark takes K as ``--speculative-dspark-block-size`` (``_handle_dspark`` sets one step
      and top-k 1 itself), n-gram as ``--speculative-num-draft-tokens`` K + 1 with a BFS
      breadth of 1 (its top-k).
    - TensorRT-LLM (``tensorrt_llm/llmapi/llm_args.py``, ``DecodingBaseConfig``): the
      ``speculative_config`` YAML's ``max_draft_len`` (its ``decoding_type`` names the method).
    - ATOM (``atom/model_engine/arg_utils.py``): ``--method`` and ``--num-speculative-tokens``.
    """
    if engine not in EMITTERS:
        raise ValueError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
    check_method(engine, method)
    if k == 0:
        return Emission(engine, "(no speculative flags: serve without speculation)")
    notes = _method_notes(engine, method)
    if engine == "vllm":
        line = vllm_config({"method": method, "num_speculative_tokens": k})
    elif engine == "sglang":
        line = _sglang(method, k)
    elif engine == "trtllm":
        line = f"speculative_config: {{max_draft_len: {k}}}"
    else:
        line = f"--method {shlex.quote(method)} --num-speculative-tokens {k}"
    return Emission(engine, line, notes)


def _check_rates(engine: str, rates: Sequence[float], k: int) -> None:
    """vLLM's ``_resolve_synthetic_acceptance_rates`` checks, shared by every emitter."""
    if k < 1:
        raise EmitRefused(f"{engine}: num_speculative_tokens must be at least 1, got {k}")
    if len(rates) != k:
        raise EmitRefused(f"{engine}: {len(rates)} per-position rates for K {k}")
    if not all(math.isfinite(r) and 0.0 <= r <= 1.0 for r in rates):
        raise EmitRefused(f"{engine}: per-position rates must be in [0, 1], got {list(rates)}")
    if any(rates[i] > rates[i - 1] for i in range(1, k)):
        raise EmitRefused(f"{engine}: per-position rates must be non-increasing, got {rates}")


def _one_number(engine: str, res: Resolution, knob: str) -> None:
    """Engines that take one AL force its minimum-variance schedule and nothing else."""
    k, al = res.num_spec_tokens, res.acceptance_length
    if not 1.0 <= al <= k + 1:
        raise EmitRefused(f"{engine}: acceptance length {al:g} is outside [1, {k + 1}] at K {k}")
    forced = minimum_variance_rates(al, k)
    if any(abs(a - b) > _SAME for a, b in zip(res.per_position_rates, forced, strict=True)):
        raise EmitRefused(
            f"{engine}: {knob} forces only the minimum-variance schedule {forced} of AL {al:g}; "
            f"the resolution states {res.per_position_rates} (use --emit vllm for per-position "
            "rates)"
        )


def _coverage_note(res: Resolution) -> tuple[str, ...]:
    if res.draft_coverage_stated and res.draft_coverage < 1.0:
        return (
            f"draft coverage {res.draft_coverage:g} is not forced: AL counts verify steps only, "
            "and the drafter decides which decode steps draft",
        )
    return ()


def emit_vllm(res: Resolution, method: str) -> Emission:
    """vLLM (``vllm/config/speculative.py``, ``SpeculativeConfig``): ``rejection_sample_method:
    "synthetic"`` with ``synthetic_acceptance_rates``, the per-position *unconditional* rates, of
    length ``num_speculative_tokens``, each in [0, 1], non-increasing. The rates are emitted
    rather than ``synthetic_acceptance_length`` so a stated schedule survives as stated."""
    rates = [float(r) for r in res.per_position_rates]
    _check_rates("vllm", rates, res.num_spec_tokens)
    config = {
        "method": method,
        "num_speculative_tokens": res.num_spec_tokens,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_rates": rates,
    }
    line = vllm_config(config)
    return Emission("vllm", line, _method_notes("vllm", method) + _coverage_note(res))


def emit_atom(res: Resolution, method: str) -> Emission:
    """ATOM (``atom/model_engine/arg_utils.py``: ``--method`` in mtp/eagle3/dspark,
    ``--num-speculative-tokens``, ``--spec-decode-acceptance-length`` a float in [1, K + 1],
    the target's own token counted; ``atom/config.py`` resolves it with
    ``acceptance_length_to_rates`` of ``atom/model_ops/rejection_sampler.py``, the
    minimum-variance schedule)."""
    check_method("atom", method)
    _one_number("atom", res, "--spec-decode-acceptance-length")
    line = (
        f"--method {shlex.quote(method)} --num-speculative-tokens {res.num_spec_tokens} "
        f"--spec-decode-acceptance-length {_number(res.acceptance_length)}"
    )
    return Emission("atom", line, _method_notes("atom", method) + _coverage_note(res))


def emit_sglang(res: Resolution, method: str) -> Emission:
    """SGLang (``python/sglang/srt/environ.py``: ``SGLANG_SIMULATE_ACC_LEN`` a float, off when
    < 0; ``python/sglang/srt/speculative/spec_utils.py``, ``_sample_simulated_acc_len``: the
    length counts the bonus token, is clamped to [1, speculative_num_steps + 1], and
    ``SGLANG_SIMULATE_ACC_METHOD=match-expected`` draws floor or ceil with the fraction as
    weight, which is the minimum-variance schedule; the older default ``multinomial`` draws a
    rounded normal and misses the mean, so the method is spelled out)."""
    check_method("sglang", method)
    _one_number("sglang", res, "SGLANG_SIMULATE_ACC_LEN")
    line = (
        f"SGLANG_SIMULATE_ACC_LEN={_number(res.acceptance_length)} "
        "SGLANG_SIMULATE_ACC_METHOD=match-expected"
    )
    notes = [
        f"sglang: serve with {_sglang(method, res.num_spec_tokens)} (the length is clamped to "
        "[1, K + 1])",
        *_method_notes("sglang", method),
    ]
    if method == "dspark" and res.acceptance_length != 1.0:
        notes.append("sglang: DSpark refuses a simulated length above 1 without a verify-all "
                     "schedule (SGLANG_RAGGED_VERIFY_MODE=static)")  # fmt: skip
    return Emission("sglang", line, (*notes, *_coverage_note(res)))


def emit_trtllm(res: Resolution, method: str) -> Emission:
    """TensorRT-LLM (``tensorrt_llm/_torch/speculative/interface.py``:
    ``TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS`` counts accepted *draft* tokens, AL − 1;
    0, the default, means not forced; the one-model path reads a float, integer part accepted
    every step and the fraction as the chance of one more, the minimum-variance schedule; the
    two-model path reads an integer and ignores a fraction, using 0)."""
    _one_number("trtllm", res, "TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS")
    drafts = Decimal(_number(res.acceptance_length)) - 1
    if drafts == 0:
        raise EmitRefused(
            "trtllm: AL 1 is TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS=0, which TensorRT-LLM "
            "reads as not forced"
        )
    whole = drafts == drafts.to_integral_value()
    value = str(int(drafts)) if whole else format(drafts.normalize(), "f")
    notes = [f"trtllm: with max_draft_len {res.num_spec_tokens} in speculative_config"]
    if not whole:
        notes.append("trtllm: a fractional value is read by the one-model path only; the "
                     "two-model path reads integers and falls back to 0")  # fmt: skip
    line = f"TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS={value}"
    return Emission("trtllm", line, (*notes, *_coverage_note(res)))


EMITTERS: dict[str, Callable[[Resolution, str], Emission]] = {
    "vllm": emit_vllm,
    "atom": emit_atom,
    "sglang": emit_sglang,
    "trtllm": emit_trtllm,
}


def emit(res: Resolution, engine: str, method: str) -> Emission:
    """The line that forces ``res`` in ``engine`` for speculative ``method``; raises
    ``EmitRefused`` when that engine cannot express it, ``ValueError`` for an unknown engine."""
    if engine not in EMITTERS:
        raise ValueError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
    return EMITTERS[engine](res, method)
