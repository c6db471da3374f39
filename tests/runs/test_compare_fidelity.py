"""speclens compare's fidelity block: B's per-request error against A (an observed run and its
simulated replay, the same index for the same request), matched by index and never by position;
the errors' median, P90, mean and bias by hand; the throughput error from the figures compare's
deltas use; none for a sweep; the console lines, --json and the report's numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from comparekit import timed_row, write_rows, write_run, write_sweep
from reportkit import field_mismatches, scan
from speclens.runs import compare as cmp
from speclens.runs.compare_inputs import labels_for, read_inputs

#: The labels these tests read (default labels are the directory names).
AB = ("--label", "A", "--label", "B")

#: Signed errors (B - A) / A, request by request (indices 0..4); None: A has no value there.
E2E = [0.10, -0.20, 0.05, 0.40, -0.02]
TTFT = [None, -0.50, 0.10, 0.30, -0.20]  # A's TTFT of request 0 is 0: nothing to divide by
TPOT = [0.0, 0.25, None, -0.10, 0.55]  # A reports no TPOT for request 2
ITL = [0.20, -0.05, 0.15, -0.40, None]  # request 4 has no inter-token gaps

#: What the block must say, worked by hand from the errors above (P90: linear between the
#: order statistics, at rank 0.9 * (n - 1)).
EXPECTED = {
    # |e| sorted 0.02 0.05 0.10 0.20 0.40; P90 at rank 3.6; e sorted -0.2 -0.02 0.05 0.1 0.4
    "e2e": {"median_ape": 0.10, "p90_ape": 0.32, "mape": 0.154, "bias": 0.05, "requests": 5},
    # |e| sorted 0.1 0.2 0.3 0.5; P90 at rank 2.7; e sorted -0.5 -0.2 0.1 0.3
    "ttft": {"median_ape": 0.25, "p90_ape": 0.44, "mape": 0.275, "bias": -0.05, "requests": 4},
    # |e| sorted 0 0.1 0.25 0.55; e sorted -0.1 0 0.25 0.55
    "tpot": {"median_ape": 0.175, "p90_ape": 0.46, "mape": 0.225, "bias": 0.125, "requests": 4},
    # |e| sorted 0.05 0.15 0.2 0.4; e sorted -0.4 -0.05 0.15 0.2
    "itl": {"median_ape": 0.175, "p90_ape": 0.34, "mape": 0.2, "bias": 0.05, "requests": 4},
}
#: 5 requests x 64 tokens over 10 s (A) and 12.5 s (B): 32 and 25.6 tok/s.
THROUGHPUT_ERROR = -0.2

CONSOLE = [
    "  fidelity of B against A, request by request: 5 matched by index, 0 left out",
    "    E2E: median error 10.0%, P90 32.0%, MAPE 15.4%, bias +5.0% (5 requests)",
    "    TTFT: median error 25.0%, P90 44.0%, MAPE 27.5%, bias -5.0% (4 requests)",
    "    TPOT: median error 17.5%, P90 46.0%, MAPE 22.5%, bias +12.5% (4 requests)",
    "    ITL: median error 17.5%, P90 34.0%, MAPE 20.0%, bias +5.0% (4 requests)",
    "    throughput: -20.0%",
]


def _observed(i: int) -> dict[str, Any]:
    """Request i as observed: ITL in two chunks of different sizes, so an unweighted mean of
    the gaps (2 g) is not the request's mean gap (2.5 g)."""
    g = 0.004 * (i + 1)
    tpot = None if i == 2 else 0.01 * (i + 1)
    return timed_row(i, latency_s=2.0 + i, ttft_s=0.1 * i, tpot_s=tpot,
                     itl_runs_s=[] if i == 4 else [[g, 10], [3 * g, 30]])  # fmt: skip


def _replayed(i: int) -> dict[str, Any]:
    """Request i as simulated: each figure off by its signed error (a value where A has none)."""
    a = _observed(i)

    def off(value: float | None, error: float | None) -> float:
        return 0.1 if value is None or error is None else value * (1 + error)

    itl = [[off(2.5 * a["itl_runs_s"][0][0], ITL[i]), 40]] if ITL[i] is not None else [[0.01, 40]]
    return timed_row(i, latency_s=off(a["latency_s"], E2E[i]), ttft_s=off(a["ttft_s"], TTFT[i]),
                     tpot_s=off(a["tpot_s"], TPOT[i]), itl_runs_s=itl)  # fmt: skip


def _pair(tmp_path: Path, b_order: list[int] | None = None) -> tuple[Path, Path]:
    """A (observed) in index order; B (replayed) listed in ``b_order`` (reversed by default)."""
    order = b_order if b_order is not None else [4, 3, 2, 1, 0]
    a = write_rows(tmp_path / "a", [_observed(i) for i in range(5)], duration_s=10.0)
    b = write_rows(tmp_path / "b", [_replayed(i) for i in order], duration_s=12.5)
    return a, b


def _fidelity(*paths: Path) -> Any:
    inputs = read_inputs(list(paths), labels_for(len(paths), []), [1] * len(paths))
    return cmp.compare(inputs, metric="output")["pairs"][0]["fidelity"]


def test_errors_request_by_request_by_hand(tmp_path: Path) -> None:
    fidelity = _fidelity(*_pair(tmp_path))
    assert fidelity["matched"] == 5 and fidelity["unmatched"] == 0
    assert list(fidelity["figures"]) == ["e2e", "ttft", "tpot", "itl"]
    for name, expected in EXPECTED.items():
        assert fidelity["figures"][name] == pytest.approx(expected, rel=1e-9, abs=1e-12), name


def test_throughput_error_is_the_deltas_figure_not_the_summarys(tmp_path: Path) -> None:
    """Both summaries claim 999 tok/s: the error comes from the runs' requests and durations,
    the same figure the matched-concurrency delta shows."""
    a, b = _pair(tmp_path)
    inputs = read_inputs([a, b], ["A", "B"], [1, 1])
    pair = cmp.compare(inputs, metric="output")["pairs"][0]
    assert pair["fidelity"]["throughput_error"] == pytest.approx(THROUGHPUT_ERROR, rel=1e-12)
    delta = next(r for r in pair["deltas"]["matched_concurrency"]
                 if r["figure"] == "output_tokens_per_s")  # fmt: skip
    assert pair["fidelity"]["throughput_error"] == pytest.approx(delta["ratio"] - 1, rel=1e-12)


def test_requests_are_matched_by_index_whatever_the_file_order(tmp_path: Path) -> None:
    shuffled = _fidelity(*_pair(tmp_path / "x", [2, 0, 4, 1, 3]))
    in_order = _fidelity(*_pair(tmp_path / "y", [0, 1, 2, 3, 4]))
    assert (shuffled["matched"], shuffled["unmatched"]) == (in_order["matched"], 0)
    for name, expected in EXPECTED.items():
        assert shuffled["figures"][name] == pytest.approx(in_order["figures"][name], rel=1e-12)
        assert shuffled["figures"][name] == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_unmatched_requests_are_counted_and_left_out(tmp_path: Path) -> None:
    """A has 0..5; B lacks 5, failed 4 and has 6 A never sent: 0..3 match, 4, 5 and 6 are left
    out, and the figures are those of requests 0..3 alone."""
    a = write_rows(tmp_path / "a", [_observed(i) for i in (0, 1, 2, 3, 4)]
                   + [_observed(3) | {"index": 5}], duration_s=10.0)  # fmt: skip
    b_rows = [_replayed(i) for i in (3, 1, 0, 2)]
    b_rows += [timed_row(4, latency_s=None, ttft_s=None, tpot_s=None, itl_runs_s=[], success=False),
               _replayed(0) | {"index": 6}]  # fmt: skip
    b = write_rows(tmp_path / "b", b_rows, duration_s=10.0)
    fidelity = _fidelity(a, b)
    assert (fidelity["matched"], fidelity["unmatched"]) == (4, 3)
    e2e = fidelity["figures"]["e2e"]  # |e| 0.02 excluded: 0.05 0.1 0.2 0.4
    assert e2e == pytest.approx(
        {"median_ape": 0.15, "p90_ape": 0.34, "mape": 0.1875, "bias": 0.075, "requests": 4},
        rel=1e-9,
    )


def test_an_index_completed_twice_is_ambiguous_and_left_out(tmp_path: Path) -> None:
    a = write_rows(tmp_path / "a", [_observed(i) for i in range(5)], duration_s=10.0)
    b_rows = [_replayed(i) for i in range(5)] + [_replayed(1) | {"latency_s": 50.0}]
    b = write_rows(tmp_path / "b", b_rows, duration_s=10.0)
    fidelity = _fidelity(a, b)
    assert (fidelity["matched"], fidelity["unmatched"]) == (4, 1)
    assert fidelity["figures"]["e2e"]["requests"] == 4


def test_a_figure_no_request_reports_has_no_numbers(tmp_path: Path) -> None:
    a = write_rows(tmp_path / "a", [_observed(i) | {"tpot_s": None} for i in range(5)],
                   duration_s=10.0)  # fmt: skip
    b = write_rows(tmp_path / "b", [_replayed(i) for i in range(5)], duration_s=10.0)
    tpot = _fidelity(a, b)["figures"]["tpot"]
    assert tpot == {"median_ape": None, "p90_ape": None, "mape": None, "bias": None, "requests": 0}


def test_no_fidelity_for_a_sweep_or_fewer_than_two_matched_requests(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", seed=1)
    sweep = write_sweep(tmp_path / "sweep", [(4, 0, {"seed": 1})])
    assert _fidelity(run, sweep) is None
    assert _fidelity(sweep, run) is None
    one_a = write_rows(tmp_path / "a", [_observed(0), _observed(1)], duration_s=10.0)
    one_b = write_rows(tmp_path / "b", [_replayed(1), _replayed(2)], duration_s=10.0)
    assert _fidelity(one_a, one_b) is None
    two_b = write_rows(tmp_path / "c", [_replayed(1), _replayed(0)], duration_s=10.0)
    assert _fidelity(one_a, two_b)["matched"] == 2


def test_two_measured_runs_of_the_same_requests_get_one_too(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", seed=1)
    b = write_run(tmp_path / "b", seed=2, speed=2.0)
    fidelity = _fidelity(a, b)
    assert fidelity["matched"] == 24 and fidelity["unmatched"] == 0
    assert fidelity["figures"]["ttft"]["median_ape"] == 0.0  # comparekit's TTFT is constant
    assert fidelity["figures"]["tpot"]["bias"] < -0.4  # B steps twice as fast


def test_cli_console_prints_the_block_after_the_deltas(run_cli, tmp_path: Path) -> None:
    code, out, err = run_cli("compare", *_pair(tmp_path), *AB)
    assert code == 0, out + err
    lines = out.splitlines()
    start = lines.index(CONSOLE[0])
    assert lines[start : start + len(CONSOLE)] == CONSOLE
    assert start > max(i for i, line in enumerate(lines) if "concurrency 4:" in line)


def test_cli_console_tags_the_block_of_a_pair_not_comparable(run_cli, tmp_path: Path) -> None:
    a, _ = _pair(tmp_path)
    b = write_rows(tmp_path / "b2", [_replayed(i) for i in (0, 1, 2, 3)], duration_s=12.5)
    code, out, _ = run_cli("compare", a, b, *AB)
    assert code == 1
    block = [line for line in out.splitlines() if "NOT COMPARABLE: " in line]
    assert "  NOT COMPARABLE: fidelity of B against A, request by request: 4 matched by index, "\
        "1 left out" in block  # fmt: skip
    assert any(line.startswith("    NOT COMPARABLE: E2E: median error ") for line in block)
    assert any(line.startswith("    NOT COMPARABLE: throughput: ") for line in block)


def test_cli_console_says_when_no_request_reports_a_figure(run_cli, tmp_path: Path) -> None:
    a = write_rows(tmp_path / "a", [_observed(i) | {"tpot_s": None} for i in range(5)],
                   duration_s=10.0)  # fmt: skip
    b = write_rows(tmp_path / "b", [_replayed(i) for i in range(5)], duration_s=10.0)
    _, out, _ = run_cli("compare", a, b)
    assert "    TPOT: no matched request reports it" in out.splitlines()


def test_cli_json_and_report(run_cli, tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    code, out, err = run_cli("compare", a, b, *AB, "--json", "--output-dir", tmp_path / "out")
    assert code == 0, err
    fidelity = orjson.loads(out)["pairs"][0]["fidelity"]
    assert (fidelity["matched"], fidelity["unmatched"]) == (5, 0)
    assert fidelity["figures"]["tpot"] == pytest.approx(EXPECTED["tpot"], rel=1e-9)
    assert fidelity["throughput_error"] == pytest.approx(THROUGHPUT_ERROR, rel=1e-12)
    data = orjson.loads((tmp_path / "out" / "compare.json").read_bytes())
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    fields = scan(page).fields
    assert field_mismatches(fields, data) == []
    shown = {path for path, _ in fields}
    for name in EXPECTED:
        for key in ("median_ape", "p90_ape", "mape", "bias", "requests"):
            assert f"pairs[0].fidelity.figures.{name}.{key}" in shown
    assert {"pairs[0].fidelity.matched", "pairs[0].fidelity.unmatched",
            "pairs[0].fidelity.throughput_error"} <= shown  # fmt: skip
    assert "Fidelity of B against A, request by request" in page


def test_cli_json_fidelity_is_null_for_a_sweep(run_cli, tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", seed=1)
    sweep = write_sweep(tmp_path / "sweep", [(4, 0, {"seed": 1})])
    code, out, err = run_cli("compare", run, sweep, "--json", "--output-dir", tmp_path / "out")
    assert code == 0, err
    assert orjson.loads(out)["pairs"][0]["fidelity"] is None
    assert "fidelity of" not in run_cli("compare", run, sweep)[1]
    assert "Fidelity of" not in (tmp_path / "out" / "report.html").read_text(encoding="utf-8")


# the bootstrap of the TPOT figure itself divides by the same near-0 times
@pytest.mark.filterwarnings("ignore:overflow encountered in divide:RuntimeWarning")
def test_odd_times_are_left_out_or_null_never_a_traceback(run_cli, tmp_path: Path) -> None:
    """tpot_s is not checked on read: a word or a time past a year is no value, an observed
    time so near 0 that the error is past any float is as good as 0; errors whose mean no float
    holds are null, shown as unknown."""
    a_rows = [_observed(i) for i in range(5)]
    a_rows[0]["tpot_s"], a_rows[1]["tpot_s"], a_rows[3]["tpot_s"] = "fast", 1e300, 5e-324
    a_rows[4]["tpot_s"] = a_rows[2]["tpot_s"] = 1e-301
    b_rows = [_replayed(i) | {"tpot_s": 1e7} for i in range(5)]
    a = write_rows(tmp_path / "a", a_rows, duration_s=10.0)
    b = write_rows(tmp_path / "b", b_rows, duration_s=12.5)
    code, out, err = run_cli("compare", a, b)
    assert code == 0 and "Traceback" not in out + err, out + err
    tpot = _fidelity(a, b)["figures"]["tpot"]
    assert tpot["requests"] == 2  # two errors of 1e308 each: their sum is past any float
    assert tpot == {"median_ape": None, "p90_ape": 1e308, "mape": None, "bias": None,
                    "requests": 2}  # fmt: skip
    assert "    TPOT: median error unknown, P90 unknown, MAPE unknown, bias unknown (2 requests)" \
        in out.splitlines()  # fmt: skip


def test_the_report_reads_an_odd_fidelity_object_without_trusting_it(tmp_path: Path) -> None:
    """A compare.json edited by hand: markup in labels and figure names is escaped, a value that
    is not a number is shown as "-", and every number shown is the file's."""
    from speclens.runs.html_compare import write_compare_report

    evil = '<script>alert(1)</script>"'
    data = {
        "schema": "speclens.compare/1", "inputs": [{"label": evil}, {"label": "B"}],
        "pairs": [{"a": evil, "b": "B", "comparable": True, "checks": [], "deltas": {},
                   "fidelity": {"matched": "7", "unmatched": 1, "throughput_error": None,
                                "figures": {evil: {"median_ape": "x", "bias": 0.25},
                                            "e2e": [1, 2]}}}],
    }  # fmt: skip
    page = write_compare_report(tmp_path, data).read_text(encoding="utf-8")
    assert "<script" not in page
    assert "Fidelity of B against &lt;script&gt;" in page
    fields = scan(page).fields
    assert {path for path, _ in fields} >= {"pairs[0].fidelity.unmatched",
                                            f"pairs[0].fidelity.figures[{orjson.dumps(evil).decode()}].bias"}  # fmt: skip
    assert field_mismatches(fields, data) == []
