"""report.html from hostile inputs: a server's strings never become markup or a fetch, files that
are not what their writer writes are one clear error naming the file and the field, odd values
neither crash a plot nor show a number the file does not hold, and reading is bounded."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from reportkit import external_references, field_mismatches, scan
from speclens.runs import html, html_run
from speclens.runs.html import ReportError
from speclens.runs.html_compare import write_compare_report
from speclens.runs.html_run import write_run_report
from speclens.runs.html_sweep import write_sweep_report

EVIL = '<script>alert(1)</script><img src="http://198.51.100.1/x.png"><a href="https://e.test">'


def _summary(**acceptance: Any) -> dict[str, Any]:
    return {
        "settings": {"model": EVIL, "url": "http://127.0.0.1:1", "concurrency": 2},
        "server": {"engine": EVIL, "acceptance": {"forced": True, "per_position_rates": [1, 0.5]}},
        "figures": {
            "requests": {"completed": 3, "failed": 1, "warmup": 0},
            "duration_s": 1.5, "interrupted": True,
            "throughput": {"requests_per_s": 2.0, "output_tokens_per_s": 80.0},
            "latency_ms": {"ttft": {"mean": "fast", "p50": None, "p90": True}, "tpot": None},
            "acceptance": {"token_weighted_al": 2.5, "verify_steps": 40, "adapters": [EVIL],
                           "histogram": {"1": 20, "0": 20, "x": 3, "99999999": 5, "2": "many"},
                           **acceptance},
        },
        "warnings": [EVIL],
        "failures": {"first_errors": [{"count": 1, "error": EVIL}], "exceeded": True,
                     "failed": 1, "sent": 4, "max_rate": 0.0},
    }  # fmt: skip


def _write(directory: Path, name: str, data: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return path


def _check_page(directory: Path, source: str) -> str:
    page = (directory / "report.html").read_text(encoding="utf-8")
    assert external_references(page) == []
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    data = orjson.loads((directory / source).read_bytes())
    assert field_mismatches(scan(page).fields, data) == []
    return page


def test_server_strings_are_text_never_markup(tmp_path: Path) -> None:
    _write(tmp_path, "summary.json", _summary())
    write_run_report(tmp_path)
    page = _check_page(tmp_path, "summary.json")
    assert page.count('class="banner fail"') == 1  # the failure veto
    assert "interrupted" in page


def test_odd_categories_and_values_are_labels_and_dashes(tmp_path: Path) -> None:
    """A mathtext-looking category, keys that are not words, rates out of range, a huge K."""
    categories = {name: {"al": 2.5, "verify_steps": 10} for name in
                  ("$x$", "a.b", "[0]", 'q"', EVIL, "$\\frac{")}  # fmt: skip
    categories["bad"] = {"al": "x", "verify_steps": 1}
    _write(tmp_path, "summary.json", _summary(
        al_by_category=categories, per_position_rates=[1.0, "x", 1e308],
        num_spec_tokens=10**30,
    ))  # fmt: skip
    write_run_report(tmp_path)
    page = _check_page(tmp_path, "summary.json")
    assert "not drawn (" not in page  # no plot failed
    paths = {p for p, _ in scan(page).fields}
    assert 'figures.acceptance.al_by_category["a.b"].al' in paths
    assert 'figures.acceptance.al_by_category["$x$"].al' in paths


def test_records_with_garbage_lines_and_absurd_values(tmp_path: Path) -> None:
    _write(tmp_path, "summary.json", _summary())
    good = {"success": True, "warmup": False, "ttft_s": 0.01, "tpot_s": 0.002, "latency_s": 0.1,
            "spec_decode_acceptance": {"mean_acceptance_length": 2.0, "num_spec_steps": 4,
                                       "num_accepted_draft_tokens": 4}}  # fmt: skip
    absurd = {**good, "ttft_s": 1e308, "tpot_s": "x", "latency_s": -1e308,
              "spec_decode_acceptance": {"mean_acceptance_length": 1e308, "num_spec_steps": 2**70,
                                         "num_accepted_draft_tokens": -5}}  # fmt: skip
    lines = [orjson.dumps(good), b"{not json", json.dumps(absurd).encode(), b"[1, 2]", b'"str"',
             orjson.dumps({**good, "raw": [{"raw": 1}], "note": ',"raw":'})] * 3  # fmt: skip
    (tmp_path / "records.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    write_run_report(tmp_path)
    page = _check_page(tmp_path, "summary.json")
    assert "3 unreadable lines skipped" in page
    assert "not drawn (" not in page  # no plot failed


def test_records_are_read_up_to_a_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(html_run, "MAX_RECORD_LINES", 5)
    _write(tmp_path, "summary.json", _summary())
    row = orjson.dumps({"success": True, "ttft_s": 0.01, "tpot_s": 0.002, "latency_s": 0.1})
    (tmp_path / "records.jsonl").write_bytes((row + b"\n") * 50)
    samples = html_run.samples_from_file(tmp_path / "records.jsonl")
    assert len(samples.ttft) == 5 and "first 5 lines" in str(samples.note)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "summary.json: not found"),
        (b"{nope", "summary.json: not JSON"),
        (b"[1, 2]", "summary.json: expected a JSON object, got list"),
        (b'{"settings": {}}', "summary.json: field figures: expected an object, got nothing"),
        (b'{"figures": [1]}', "summary.json: field figures: expected an object, got list"),
    ],
)
def test_a_summary_that_is_not_a_summary_is_one_clear_error(
    tmp_path: Path, content: bytes | None, message: str
) -> None:
    if content is not None:
        _write(tmp_path, "summary.json", content)
    with pytest.raises(ReportError, match=re.escape(message)):
        write_run_report(tmp_path)
    assert not (tmp_path / "report.html").exists()


def test_a_summary_larger_than_the_bound_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(html, "MAX_JSON_BYTES", 1000)
    _write(tmp_path, "summary.json", {"figures": {}, "pad": "x" * 2000})
    with pytest.raises(ReportError, match=re.escape("summary.json: larger than")):
        write_run_report(tmp_path)


def test_a_planted_link_is_never_written_through(tmp_path: Path) -> None:
    _write(tmp_path, "summary.json", _summary())
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    os.symlink(target, tmp_path / "report.html")
    with pytest.raises(OSError, match="symbolic link"):
        write_run_report(tmp_path)
    assert target.read_text() == "keep"


def test_sweep_and_compare_files_of_another_kind_are_refused(tmp_path: Path) -> None:
    _write(tmp_path / "s", "sweep.json", {"schema": "speclens.compare/1", "points": []})
    with pytest.raises(
        ReportError, match=re.escape("sweep.json: field schema: expected 'speclens.sweep/1'")
    ):
        write_sweep_report(tmp_path / "s")
    _write(tmp_path / "s2", "sweep.json", {"schema": "speclens.sweep/1", "points": {}})
    with pytest.raises(ReportError, match="field points: expected a list, got dict"):
        write_sweep_report(tmp_path / "s2")
    with pytest.raises(ReportError, match=re.escape("compare.json: field schema")):
        write_compare_report(tmp_path / "c", {"schema": "x", "pairs": []})


def test_a_hostile_sweep_links_nowhere_outside_it(tmp_path: Path) -> None:
    """Point dirs that climb out, are absolute or carry markup are shown, never linked."""
    points = [
        {"id": EVIL, "dir": d, "status": "ok", "settings": {"concurrency": 1}}
        for d in ("../../etc", "/etc", "http://e.test/x", EVIL, "points/ok")
    ]
    (tmp_path / "points" / "ok").mkdir(parents=True)
    (tmp_path / "points" / "ok" / "report.html").write_text("x")
    stats = [{"engine": EVIL, "settings": {"concurrency": 1}, "rounds_ok": "two", "figures": {
        "output_tokens_per_s": {"mean": 1e308, "low": None, "high": "x"},
        "tokens_per_s_per_user": {"mean": 5.0, "low": 4.0, "high": 6.0},
    }}]  # fmt: skip
    _write(tmp_path, "sweep.json", {"schema": "speclens.sweep/1", "kind": EVIL, "points": points,
                                    "stats": stats, "axes": {EVIL: [1, "x"]}})  # fmt: skip
    write_sweep_report(tmp_path)
    page = _check_page(tmp_path, "sweep.json")
    hrefs = [a.get("href") for tag, a in scan(page).tags if tag == "a"]
    assert hrefs == ["points/ok/report.html"]


def test_a_not_comparable_pair_never_reads_as_a_speed_up(tmp_path: Path) -> None:
    data = {
        "schema": "speclens.compare/1",
        "inputs": [{"label": EVIL, "path": "/nonexistent", "gpus": 0}, {"label": "B", "path": 7}],
        "pairs": [{"a": EVIL, "b": "B", "comparable": False, "label": "not comparable: K 2 vs 4",
                   "checks": [{"name": "k", "ok": False, "detail": EVIL}],
                   "deltas": {"matched_concurrency": [{"concurrency": 1,
                              "figure": "output_tokens_per_s", "ratio": 2.0, "ratio_low": None,
                              "ratio_high": 2.5, "a": {"mean": 1.0}, "b": "x"}],
                              "matched_interactivity": [{"tokens_per_s_per_user": 40.0,
                              "sentence": "at 40 tok/s/user, B delivers +100% tok/s/GPU"}]}}],
    }  # fmt: skip
    write_compare_report(tmp_path, data)
    _write(tmp_path, "compare.json", data)
    page = _check_page(tmp_path, "compare.json")
    assert "not comparable: at 40 tok/s/user, B delivers +100%" in page
    assert "(not comparable: K 2 vs 4: not a speed-up)" in page
    assert 'class="banner pass"' not in page
