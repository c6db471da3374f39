"""How ``speclens measure`` names an engine and finds K when ``/version`` does not say.

vLLM's ``/version`` is ``{"version": ...}`` alone (``vllm/entrypoints/openai/api_server.py``); its
per-position acceptance counter exists for positions 0..K-1 from start-up
(``vllm/v1/spec_decode/metrics.py``, ``SpecDecodingProm``). The peer tier runs the command
against a real vLLM (``tests/peers/test_measure_vllm.py``).
"""

from __future__ import annotations

import pytest
import typer

from speclens.cli.measure import _agreed, _engine, _k_from_counters


def vllm_counters(positions: list[int]) -> dict[str, object]:
    return {
        "drafts": 0.0,
        "draft_tokens": 0.0,
        "accepted_tokens": 0.0,
        "accepted_per_position": dict.fromkeys(positions, 0.0),
        "source": "metrics:vllm",
    }


def test_k_is_the_number_of_positions_when_they_are_0_to_k_minus_1() -> None:
    assert _k_from_counters(vllm_counters([0, 1, 2, 3])) == 4
    assert _k_from_counters(vllm_counters([3, 0, 2, 1])) == 4
    assert _k_from_counters(vllm_counters([0, 2])) is None  # a gap proves nothing
    assert _k_from_counters(vllm_counters([])) is None
    assert _k_from_counters(None) is None


def test_the_engine_is_named_by_version_then_by_its_counters() -> None:
    assert _engine({"engine": "speclens", "version": "1"}, vllm_counters([0])) == "speclens"
    assert _engine({"version": "0.32.0"}, vllm_counters([0])) == "vllm"
    assert _engine({"version": "0.32.0"}, None) == "unknown engine"
    assert _engine({}, {"source": "metrics:llama.cpp"}) == "llama.cpp"
    assert (
        _engine({}, {"source": "debug/mtp_stats"}) == "atom"
    )  # speclens serve says so on /version


def test_a_flag_that_contradicts_the_server_is_a_usage_error() -> None:
    assert _agreed("--method", None, "ngram") == "ngram"
    assert _agreed("--method", "ngram", None) == "ngram"
    assert _agreed("--method", "ngram", "ngram") == "ngram"
    with pytest.raises(typer.Exit) as info:
        _agreed("--num-spec-tokens", 3, 4)
    assert info.value.exit_code == 2


def test_no_per_request_stats_names_the_engines_own_switch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """measure refuses a run without per-request stats with the switch of the engine it saw."""
    from speclens.cli.measure import _check_acceptance

    empty = {"requests_with_stats": 0, "counts_only_requests": 0, "verify_steps": 0}
    with pytest.raises(typer.Exit):
        _check_acceptance(empty, "vllm")
    err = capsys.readouterr().err
    assert "--enable-per-request-metrics" in err and "--per-request-spec-decode-stats" not in err
    with pytest.raises(typer.Exit):
        _check_acceptance(empty, "speclens")
    err = capsys.readouterr().err
    assert "--per-request-spec-decode-stats summary" in err and "vLLM" not in err
