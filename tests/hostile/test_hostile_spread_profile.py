"""A profile's spread (the per-request AL's quantiles) that falls, leaves [1, K + 1], disagrees
with the profile's AL beyond its tolerance, rests on fewer than 20 requests, comes at another K,
or misnames a level is refused in one line naming the file and the field; files without a spread
stay valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from speclens.acceptance import AcceptanceProfileSet, AcceptanceSpread, ValidationError, load

GOOD = {"p0": 1.5, "p5": 1.9, "p10": 2.1, "p25": 2.5, "p50": 3.0, "p75": 3.4, "p90": 3.8,
        "p95": 4.1, "p100": 4.6}  # fmt: skip  # implied mean 2.9725


def _set(tmp_path: Path, spread: str, al: float = 2.97) -> Path:
    path = tmp_path / "measured.yaml"
    path.write_text(
        "kind: AcceptanceProfileSet\nname: measured\nprofiles:\n"
        "  - {model: m, speculative_method: ngram, num_spec_tokens: 4, thinking: 'off',\n"
        f"     category: all, acceptance_length: {al}, method: assumed, rationale: test,\n"
        f"     spread: {spread}}}\n"
    )
    return path


def _quantiles(**changes: float) -> str:
    values = {**GOOD, **changes}
    return "{" + ", ".join(f"{k}: {v}" for k, v in values.items()) + "}"


@pytest.mark.parametrize(
    ("spread", "al", "field", "words"),
    [
        (f"{{num_spec_tokens: 4, requests: 40, quantiles: {_quantiles(p50=2.4)}}}", 2.97,
         "spread.quantiles", "fall from p25 2.5 to p50 2.4"),
        (f"{{num_spec_tokens: 4, requests: 40, quantiles: {_quantiles(p100=5.5)}}}", 2.97,
         "spread.quantiles", "p100 5.5 outside [1, K + 1] = [1, 5]"),
        (f"{{num_spec_tokens: 4, requests: 40, quantiles: {_quantiles(p0=0.5)}}}", 2.97,
         "spread.quantiles", "p0 0.5 outside"),
        (f"{{num_spec_tokens: 4, requests: 40, quantiles: {_quantiles()}}}", 2.6,
         "spread.quantiles", "beyond the tolerance 0.05"),
        (f"{{num_spec_tokens: 4, requests: 40, tolerance: 0.5, quantiles: {_quantiles()}}}", 2.4,
         "spread.quantiles", "beyond the tolerance 0.5"),
        (f"{{num_spec_tokens: 4, requests: 19, quantiles: {_quantiles()}}}", 2.97,
         "spread.requests", "at least 20"),
        (f"{{num_spec_tokens: 3, requests: 40, quantiles: {_quantiles(p95=4.0, p100=4.0)}}}",
         2.97, "spread.num_spec_tokens", "stated at K 4"),
        ("{num_spec_tokens: 4, requests: 40, quantiles: {p0: 1.5, p50: 3.0, p99: 4.0}}", 2.97,
         "spread.quantiles", "unknown level 'p99'; missing p5"),
        (f"{{num_spec_tokens: 4, requests: 40, tolerance: 2, quantiles: {_quantiles()}}}", 2.97,
         "spread.tolerance", "expected a number in (0, 0.5]"),
        (f"{{num_spec_tokens: 4, requests: 40, quantiles: {_quantiles(p50='.nan')}}}", 2.97,
         "spread.quantiles", "p50 a number (nan)"),
    ],
)  # fmt: skip
def test_a_bad_spread_is_refused_in_one_line_naming_the_file_and_field(
    tmp_path: Path, spread: str, al: float, field: str, words: str
) -> None:
    path = _set(tmp_path, spread, al)
    with pytest.raises(ValidationError) as caught:
        load(AcceptanceProfileSet, path)
    lines = str(caught.value).splitlines()
    hits = [line for line in lines if f"profiles[0].{field}:" in line and words in line]
    assert hits, lines
    assert all(line.startswith(str(path)) for line in lines)


def test_a_mapping_of_a_million_levels_is_refused_by_its_size(tmp_path: Path) -> None:
    path = tmp_path / "spread.yaml"
    body = ", ".join(f"q{i}: 2" for i in range(5000))
    path.write_text(f"num_spec_tokens: 4\nrequests: 40\nquantiles: {{{body}}}\n")
    with pytest.raises(ValidationError) as caught:
        load(AcceptanceSpread, path)
    assert "quantiles: has 5,000 entries" in str(caught.value)


def test_a_good_spread_and_a_set_without_one_both_load(tmp_path: Path) -> None:
    loaded = load(AcceptanceProfileSet, _set(tmp_path, f"{{num_spec_tokens: 4, requests: 40, "
                                                       f"quantiles: {_quantiles()}}}"))  # fmt: skip
    assert loaded.profiles[0].spread is not None
    assert loaded.profiles[0].spread.values[4] == 3.0
    plain = tmp_path / "plain.yaml"
    plain.write_text(_set(tmp_path, "null").read_text())
    assert load(AcceptanceProfileSet, plain).profiles[0].spread is None
