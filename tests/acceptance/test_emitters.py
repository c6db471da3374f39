"""``speclens.acceptance.emit``: each engine's line read back the way that engine reads it.

The readers below replicate the upstream parsing each emitter cites: vLLM's JSON keys and its
``_resolve_synthetic_acceptance_rates`` checks (``vllm/config/speculative.py``; the real vLLM
reads it in the peer tier), ATOM's argparse options (``atom/model_engine/arg_utils.py``),
SGLang's ``EnvFloat`` and ``_sample_simulated_acc_len`` match-expected draw
(``python/sglang/srt/environ.py``, ``python/sglang/srt/speculative/spec_utils.py``), and
TensorRT-LLM's float and int readers of ``TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS``
(``tensorrt_llm/_torch/speculative/interface.py``). Each read-back must give the resolution's
numbers exactly, or the accepted-count distribution the resolution's schedule implies.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speclens.acceptance import Resolution, accepted_count_distribution, minimum_variance_rates
from speclens.acceptance.emit import ENGINES, Emission, EmitRefused, emit

FAST = settings(max_examples=150, deadline=None)


def resolution(
    al: float, k: int, rates: list[float] | None = None, coverage: float | None = None
) -> Resolution:
    return Resolution(
        acceptance_length=al,
        per_position_rates=rates if rates is not None else minimum_variance_rates(al, k),
        num_spec_tokens=k,
        layer="cli",
        rates_derived=rates is None,
        draft_coverage=coverage if coverage is not None else 1.0,
        draft_coverage_stated=coverage is not None,
    )


# ----------------------------------------------------------------------------- the readers


def read_vllm(line: str) -> dict[str, object]:
    flag, value = shlex.split(line)
    assert flag == "--speculative-config"
    config = json.loads(value)
    assert isinstance(config, dict)
    return config


def read_atom(line: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--method", type=str, default=None, choices=["mtp", "eagle3", "dspark"])
    parser.add_argument("--num-speculative-tokens", type=int, default=1)
    parser.add_argument("--spec-decode-acceptance-length", type=float, default=None)
    return parser.parse_args(shlex.split(line))


def read_env(line: str) -> dict[str, str]:
    pairs = [word.partition("=") for word in shlex.split(line)]
    assert all(sep == "=" for _, sep, _ in pairs), line
    return {name: value for name, _, value in pairs}


def sglang_distribution(acc_len: float, max_len: int) -> dict[int, float]:
    """Accepted drafts per step under SGLang's match-expected draw (length minus the bonus)."""
    acc_len = max(1.0, min(max_len, acc_len))
    lower = int(acc_len // 1)
    upper = lower + 1 if lower < max_len else lower
    if lower == upper:
        return {lower - 1: 1.0}
    weight = acc_len - lower
    return {j: p for j, p in ((lower - 1, 1.0 - weight), (upper - 1, weight)) if p > 0}


def trtllm_distribution(value: float) -> dict[int, float]:
    """Integer part accepted every step, one more with the fraction as probability."""
    whole = math.floor(value)
    frac = value - whole
    return {j: p for j, p in ((whole, 1.0 - frac), (whole + 1, frac)) if p > 0}


def close(a: dict[int, float], b: dict[int, float]) -> bool:
    return set(a) == set(b) and all(abs(a[j] - b[j]) < 1e-9 for j in a)


# ----------------------------------------------------------------------------- vLLM


def test_vllm_carries_the_rates_method_and_k_exactly() -> None:
    res = resolution(3.51, 5)
    out = emit(res, "vllm", "dspark")
    assert out == Emission("vllm", out.line, ())
    assert read_vllm(out.line) == {
        "method": "dspark",
        "num_speculative_tokens": 5,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_rates": [1.0, 1.0, 0.51, 0.0, 0.0],
    }


def test_vllm_keeps_a_stated_schedule_as_stated() -> None:
    rates = [0.912345678901, 0.6, 0.35, 0.1]
    res = resolution(1 + sum(rates), 4, rates)
    config = read_vllm(emit(res, "vllm", "ngram").line)
    assert config["synthetic_acceptance_rates"] == rates  # every digit, no re-derivation


def test_vllm_notes_the_draft_model_key_for_methods_that_need_one() -> None:
    assert emit(resolution(2.0, 3), "vllm", "ngram").notes == ()
    (note,) = emit(resolution(2.0, 3), "vllm", "eagle3").notes
    assert '"model"' in note and "eagle3" in note


@pytest.mark.parametrize(
    ("rates", "what"),
    [
        ([1.0, 0.5], "2 per-position rates for K 3"),
        ([0.5, 0.6, 0.1], "non-increasing"),
        ([1.2, 0.5, 0.1], "in [0, 1]"),
        ([math.nan, 0.5, 0.1], "in [0, 1]"),
    ],
)
def test_vllm_refuses_what_its_validator_refuses(rates: list[float], what: str) -> None:
    with pytest.raises(EmitRefused, match=r"^vllm: ") as exc:
        emit(resolution(2.0, 3, rates), "vllm", "ngram")
    assert what in str(exc.value)


# ----------------------------------------------------------------------------- ATOM


def test_atom_parses_with_its_own_options() -> None:
    args = read_atom(emit(resolution(3.78, 7), "atom", "dspark").line)
    assert (args.method, args.num_speculative_tokens) == ("dspark", 7)
    assert args.spec_decode_acceptance_length == 3.78


def test_atom_refuses_a_method_it_does_not_offer() -> None:
    with pytest.raises(EmitRefused, match=r"^atom: --method takes mtp, eagle3, dspark"):
        emit(resolution(2.0, 3), "atom", "ngram")


def test_atom_notes_the_draft_model_for_eagle3() -> None:
    assert emit(resolution(2.0, 3), "atom", "mtp").notes == ()
    assert "--draft-model" in emit(resolution(2.0, 3), "atom", "eagle3").notes[0]


# ----------------------------------------------------------------------------- SGLang


def test_sglang_sets_the_length_and_the_method_that_matches_it() -> None:
    out = emit(resolution(3.51, 5), "sglang", "eagle")
    env = read_env(out.line)
    assert env == {
        "SGLANG_SIMULATE_ACC_LEN": "3.51",
        "SGLANG_SIMULATE_ACC_METHOD": "match-expected",
    }
    assert "--speculative-num-steps 5" in out.notes[0]
    assert not any("SGLANG_RAGGED_VERIFY_MODE" in n for n in out.notes)
    assert any(
        "SGLANG_RAGGED_VERIFY_MODE" in n
        for n in emit(resolution(3.51, 5), "sglang", "dspark").notes
    )


def test_sglang_serves_with_the_same_flags_the_k_schedule_writes() -> None:
    """``profiles resolve --emit sglang`` names the flags that turn speculation on, the very
    line ``serving`` writes for ``sim --context --emit sglang``; a method SGLang has no
    ``--speculative-algorithm`` for is refused by both."""
    from speclens.acceptance.emit import serving

    for method, k in (("mtp", 3), ("eagle3", 5), ("dspark", 5), ("ngram", 4)):
        line = serving("sglang", method, k).line
        assert line.startswith("--speculative-algorithm ")
        assert f"sglang: serve with {line} " in emit(resolution(2.0, k), "sglang", method).notes[0]
    for call in (lambda: emit(resolution(2.0, 3), "sglang", "medusa"),
                 lambda: serving("sglang", "medusa", 3)):  # fmt: skip
        with pytest.raises(EmitRefused, match="sglang: --speculative-algorithm has a name for"):
            call()


# ----------------------------------------------------------------------------- TensorRT-LLM


@pytest.mark.parametrize(("al", "value"), [(3.51, "2.51"), (3.0, "2"), (1.25, "0.25"), (8.0, "7")])
def test_trtllm_takes_al_minus_one(al: float, value: str) -> None:
    out = emit(resolution(al, 7), "trtllm", "eagle3")
    assert read_env(out.line) == {"TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS": value}
    fractional = any("two-model" in n for n in out.notes)
    assert fractional == ("." in value)
    if not fractional:
        assert int(value) == al - 1  # the two-model path's int() reads it too


def test_trtllm_refuses_al_one_which_it_reads_as_off() -> None:
    with pytest.raises(EmitRefused, match=r"^trtllm: AL 1 .* not forced"):
        emit(resolution(1.0, 3), "trtllm", "mtp")


# ----------------------------------------------------------------------------- shared rules


@pytest.mark.parametrize("engine", ["atom", "sglang", "trtllm"])
def test_one_number_engines_refuse_a_stated_schedule_they_cannot_force(engine: str) -> None:
    rates = [0.9, 0.6, 0.35, 0.1]
    with pytest.raises(EmitRefused, match=rf"^{engine}: .*minimum-variance") as exc:
        emit(resolution(1 + sum(rates), 4, rates), engine, "mtp")
    assert "--emit vllm" in str(exc.value)


@pytest.mark.parametrize("engine", ["atom", "sglang", "trtllm"])
def test_one_number_engines_take_a_stated_schedule_that_is_minimum_variance(engine: str) -> None:
    emit(resolution(2.5, 3, [1.0, 0.5, 0.0]), engine, "mtp")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_stated_coverage_is_a_note_never_forced(engine: str) -> None:
    plain = emit(resolution(2.5, 3), engine, "mtp")
    covered = emit(resolution(2.5, 3, coverage=0.4), engine, "mtp")
    assert covered.line == plain.line
    assert [n for n in covered.notes if n not in plain.notes] == [
        "draft coverage 0.4 is not forced: AL counts verify steps only, and the drafter "
        "decides which decode steps draft"
    ]


def test_an_unknown_engine_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        emit(resolution(2.0, 3), "tgi", "mtp")


@st.composite
def k_and_length(draw: st.DrawFn) -> tuple[int, float]:
    k = draw(st.integers(min_value=1, max_value=12))
    hundredths = draw(st.integers(min_value=100, max_value=100 * (k + 1)))
    return k, hundredths / 100  # an AL as a profile states it


@FAST
@given(k_and_length())
def test_every_engine_forces_the_resolution_it_was_given(case: tuple[int, float]) -> None:
    """Read back each line as its engine does: the AL, or the schedule vLLM gets, comes back
    exactly, and the accepted-count distribution each engine draws is the resolution's."""
    k, al = case
    res = resolution(al, k)
    want = accepted_count_distribution(res.per_position_rates)

    config = read_vllm(emit(res, "vllm", "mtp").line)
    assert config["synthetic_acceptance_rates"] == res.per_position_rates
    assert config["num_speculative_tokens"] == k

    args = read_atom(emit(res, "atom", "mtp").line)
    assert args.spec_decode_acceptance_length == al and args.num_speculative_tokens == k

    env = read_env(emit(res, "sglang", "mtp").line)
    assert float(env["SGLANG_SIMULATE_ACC_LEN"]) == al
    assert close(sglang_distribution(float(env["SGLANG_SIMULATE_ACC_LEN"]), k + 1), want)

    if al == 1.0:
        with pytest.raises(EmitRefused):
            emit(res, "trtllm", "mtp")
        return
    value = read_env(emit(res, "trtllm", "mtp").line)["TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS"]
    assert abs(float(value) + 1 - al) < 1e-12
    assert close(trtllm_distribution(float(value)), want)
