"""Issue 19, item 17 (and item 20's merge mutations): ``bench merge`` believes nothing it reads.

Each case writes the shards of a 6-request run by hand (what ``bench --shard i/2`` writes), spoils
one thing, and expects exit 1 with the file, the field and what was expected; before the fix
each was a traceback or an exit 0 with figures that cannot be right.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from speclens.bench.client import RequestRecord
from speclens.runs.record import SpecDecodeAcceptanceRecord
from speclens.runs.report import record_row

pytestmark = pytest.mark.timeout(60)

Rows = list[dict[str, Any]]
Summary = dict[str, Any]
REQUESTS = 6


def _spec() -> dict[str, Any]:
    return SpecDecodeAcceptanceRecord(
        engine="vllm", mean_acceptance_length=3.0, draft_acceptance_rate=10 / 15,
        acceptance_histogram={2: 5}, num_accepted_draft_tokens=10, num_draft_tokens=15,
        num_spec_steps=5, num_spec_tokens=3, completion_tokens=10,
    ).model_dump()  # fmt: skip


def _rows(i: int, n: int, end: float) -> Rows:
    """Shard i/n's rows; its last request ends at ``end`` seconds."""
    rows = []
    indices = range(i, REQUESTS, n)
    for position, j in enumerate(indices):
        record = RequestRecord(
            index=j, category="c", start=0.1 * j, end=end - 0.1 * (len(indices) - 1 - position),
            ttft=0.05, prompt_tokens=5, completion_tokens=10, status=200, spec=_spec(),
            spec_status="ok", spec_adapter="vllm-per-choice-stats",
        )  # fmt: skip
        rows.append(record_row(record))
    return rows


def _summary(i: int, n: int, rows: Rows) -> Summary:
    ends = [row["start_s"] + row["latency_s"] for row in rows]
    return {
        "settings": {"model": "m", "num_requests": REQUESTS, "warmup": 0, "duration": None,
                     "max_failure_rate": 0.0, "shard": [i, n], "part": [i, n]},
        "server": None,
        "figures": {"duration_s": max(ends, default=0.0), "interrupted": False,
                    "requests": {"sent": len(rows)}},
        "load": {"started": 1.7e9, "sending_s": 0.5, "in_flight_at_stop": 0},
        "server_check": {"available": False},
    }  # fmt: skip


def _write(directory: Path, summary: Summary, rows: Rows) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "summary.json").write_bytes(orjson.dumps(summary))
    # json, not orjson: a spoiled row may hold what orjson refuses to write (10**30)
    (directory / "records.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return directory


Spoil = Callable[[Summary, Rows], None]


def _shards(
    tmp: Path, spoil: Spoil | None = None, ends: tuple[float, ...] = (2.0, 1.5)
) -> list[Path]:
    """Both shards of the run; ``spoil`` edits shard 1's summary and rows before they are
    written."""
    out = []
    for i, end in enumerate(ends):
        rows = _rows(i, len(ends), end)
        summary = _summary(i, len(ends), rows)
        if spoil is not None and i == 1:
            spoil(summary, rows)
        out.append(_write(tmp / f"s{i}", summary, rows))
    return out


def _merge(run_cli: Any, tmp: Path, shards: list[Path]) -> tuple[int, str]:
    code, out, err = run_cli("bench", "merge", *shards, "--output-dir", tmp / "merged")
    return code, err + out


def test_clean_shards_merge(tmp_path: Path, run_cli: Any) -> None:
    code, out = _merge(run_cli, tmp_path, _shards(tmp_path))
    assert code == 0, out
    summary = json.loads((tmp_path / "merged" / "summary.json").read_text())
    assert summary["figures"]["requests"]["completed"] == REQUESTS
    assert summary["figures"]["acceptance"]["requests_with_stats"] == REQUESTS


def _set(section: str, key: str, value: Any) -> Spoil:
    def spoil(summary: Summary, rows: Rows) -> None:
        summary[section][key] = value

    return spoil


def _set_top(key: str, value: Any) -> Spoil:
    def spoil(summary: Summary, rows: Rows) -> None:
        summary[key] = value

    return spoil


def _set_row(key: str, value: Any) -> Spoil:
    def spoil(summary: Summary, rows: Rows) -> None:
        rows[1][key] = value

    return spoil


def _spec_field(key: str, value: Any) -> Spoil:
    def spoil(summary: Summary, rows: Rows) -> None:
        rows[1]["spec_decode_acceptance"][key] = value

    return spoil


def _empty(summary: Summary, rows: Rows) -> None:
    """The issue's "3 completed of a 6-request run": shard 1's records gone, its count kept."""
    rows.clear()


def _emptied_and_recounted(summary: Summary, rows: Rows) -> None:
    rows.clear()
    summary["figures"]["requests"]["sent"] = 0


def _foreign_index(summary: Summary, rows: Rows) -> None:
    rows[1]["index"] = 101


def _index_past_the_run(summary: Summary, rows: Rows) -> None:
    rows[1]["index"] = 103  # 1 modulo 2, but the run has 6 requests


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (_set("settings", "shard", "ab"), "s1/summary.json: settings.shard: expected null or [I, N] with 0 <= I < N, got 'ab'"),
        (_set("settings", "shard", [1, 2, 3]), "s1/summary.json: settings.shard: expected null or [I, N] with 0 <= I < N, got [1, 2, 3]"),
        (_set("load", "started", "yesterday"), "s1/summary.json: load.started: expected a wall-clock time (seconds), got 'yesterday'"),
        (_set_top("figures", "x"), "s1/summary.json: figures: expected an object, got 'x'"),
        (_set("figures", "duration_s", -1.0), "s1/summary.json: figures.duration_s: expected seconds >= 0, got -1.0"),
        (_set("settings", "num_requests", "6"), "s1/summary.json: settings.num_requests: expected an integer >= 0, got '6'"),
        (_empty, "s1/records.jsonl: holds 0 measured requests; its summary.json's figures.requests.sent says 3"),
        (_emptied_and_recounted, "s1/records.jsonl: holds 0 of the 3 requests shard 1/2 of this run sends (and it was not interrupted): missing indices [1, 3, 5]"),
        (_foreign_index, "s1/records.jsonl: index 101: expected an index of shard 1/2 (1 modulo 2 below 6)"),
        (_index_past_the_run, "s1/records.jsonl: index 103: expected an index of shard 1/2 (1 modulo 2 below 6)"),
        (_spec_field("acceptance_histogram", {"4": 5}), "s1/records.jsonl: line 2: spec_decode_acceptance: not a valid acceptance record: "),
        (_set_row("latency_s", -5), "s1/records.jsonl: line 2: latency_s: expected null or seconds in [0, 3.1536e+07], got -5"),
        (_set_row("completion_tokens", 10**30), "s1/records.jsonl: line 2: completion_tokens: expected null or an integer in [0, 2**63 - 1], got 1e+30"),
        (_set_row("start_s", "soon"), "s1/records.jsonl: line 2: start_s: expected seconds within 3.1536e+07, got 'soon'"),
        (_set_row("itl_runs_s", [[0.1, -2]]), "s1/records.jsonl: line 2: itl_runs_s[0]: expected [gap seconds, tokens], got [0.1, -2]"),
        (_set_row("spec_decode_choices", {"x": {}}), "s1/records.jsonl: line 2: spec_decode_choices['x']: expected a choice index as the key"),
    ],
    ids=["shard-ab", "shard-3", "started", "figures", "duration", "num-requests", "emptied",
         "emptied-recounted", "foreign-index", "index-100", "histogram", "latency", "tokens",
         "start", "itl", "choices"],
)  # fmt: skip
def test_a_spoiled_shard_is_refused_naming_file_field_and_expectation(
    tmp_path: Path, run_cli: Any, spoil: Spoil, message: str
) -> None:
    code, out = _merge(run_cli, tmp_path, _shards(tmp_path, spoil))
    assert code == 1, out
    assert message in " ".join(out.split()), out
    assert "Traceback" not in out
    assert not (tmp_path / "merged" / "summary.json").exists()


def test_a_histogram_that_contradicts_its_counts_names_both(tmp_path: Path, run_cli: Any) -> None:
    """The issue's case: ``{"4": 5}`` (20 accepted drafts in 5 steps) beside
    ``num_accepted_draft_tokens: 10``, refused by the record's own validator."""
    code, out = _merge(
        run_cli, tmp_path, _shards(tmp_path, _spec_field("acceptance_histogram", {"4": 5}))
    )
    assert code == 1 and "acceptance_histogram counts 20 accepted drafts, not 10" in out, out


def test_an_interrupted_shard_may_hold_fewer_requests(tmp_path: Path, run_cli: Any) -> None:
    """A stopped shard sent fewer requests: merged (exit 130, interrupted), not refused."""

    def stopped(summary: Summary, rows: Rows) -> None:
        del rows[2:]
        summary["figures"].update(interrupted=True, requests={"sent": 2})

    code, out = _merge(run_cli, tmp_path, _shards(tmp_path, stopped))
    assert code == 130, out


def test_output_dir_that_is_an_input_is_refused_and_left_alone(
    tmp_path: Path, run_cli: Any
) -> None:
    shards = _shards(tmp_path)
    before = (shards[1] / "records.jsonl").read_bytes()
    code, out, err = run_cli("bench", "merge", *shards, "--output-dir", tmp_path / "s1" / ".")
    assert code == 2, err + out
    assert "command line: --output-dir: expected a directory that is not one of the shards" in err
    assert (shards[1] / "records.jsonl").read_bytes() == before


def test_a_repeated_index_in_one_shard_is_refused(tmp_path: Path, run_cli: Any) -> None:
    """Kills the mutation: ``merge``'s duplicate-index refusal removed. In a ``--duration`` run
    the request count is not fixed, so only that check sees index 3 written twice in shard 1
    (every index is still one shard 1 owns)."""

    def repeated(summary: Summary, rows: Rows) -> None:
        rows.append(dict(rows[1]))
        summary["figures"]["requests"]["sent"] = len(rows)

    def timed(summary: Summary, rows: Rows) -> None:
        summary["settings"].update(num_requests=None, duration=5.0)

    def spoil(summary: Summary, rows: Rows) -> None:
        timed(summary, rows)
        repeated(summary, rows)

    shards = _shards(tmp_path, spoil)
    for shard in shards[:1]:  # the other shard is of the same duration run
        summary = json.loads((shard / "summary.json").read_text())
        timed(summary, [])
        (shard / "summary.json").write_text(json.dumps(summary))
    code, out = _merge(run_cli, tmp_path, shards)
    assert code == 1, out
    assert f"{shards[1]}/records.jsonl: index 3: also in {shards[1]}" in " ".join(out.split())
    code, out = _merge(run_cli, tmp_path, _shards(tmp_path / "fixed", repeated))
    assert code == 1 and "holds more than the 3 records shard 1/2 of this run can" in out, out


def test_the_merged_duration_is_the_longest_shard(tmp_path: Path, run_cli: Any) -> None:
    """Kills the mutation: ``merge`` summing the shards' durations instead of taking the
    maximum. The shards run at once, each timed from its own start, so the run lasts as long as
    its longest shard (2.0 s and 1.5 s: 2.0 s), the same meaning as for ``--workers``."""
    code, out = _merge(run_cli, tmp_path, _shards(tmp_path))
    assert code == 0, out
    summary = json.loads((tmp_path / "merged" / "summary.json").read_text())
    assert summary["figures"]["duration_s"] == pytest.approx(2.0)
    assert summary["figures"]["throughput"]["requests_per_s"] == pytest.approx(REQUESTS / 2.0)
    assert [s["duration_s"] for s in summary["shards"]] == pytest.approx([2.0, 1.5])
