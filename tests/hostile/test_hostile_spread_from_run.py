"""``speclens profiles from-run`` on runs that cannot give a measured profile, or not a spread:
each refused in one line naming the file and the field, with measure's exit codes, nothing
written; a category of too few requests gets its profile without a spread, and is named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from speclens.acceptance import AcceptanceProfileSet, load
from spreadkit import counts_only, natural_requests, record, spec, write_run


def _from_run(run_cli: Any, run_dir: Path, *args: str) -> tuple[int, str, str, Path]:
    out = run_dir.parent / "out" / "set.yaml"
    code, stdout, stderr = run_cli("profiles", "from-run", run_dir, "-o", out, *args)
    return code, stdout, stderr, out


def _refused(result: tuple[int, str, str, Path], code: int, line: str) -> None:
    got, stdout, stderr, out = result
    assert got == code, stdout + stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), stderr
    assert not out.exists() and not out.parent.exists()


def test_a_forced_run_is_refused(run_cli: Any, tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", natural_requests({"c": 24}), forced=3.78)
    _refused(_from_run(run_cli, run), 2,
             f"{run / 'summary.json'}: server.acceptance.forced: the server forced AL 3.78: a "
             "measured profile needs natural acceptance")  # fmt: skip


def test_a_run_judged_against_an_expected_al_is_refused_unless_its_server_says_natural(
    run_cli: Any, tmp_path: Path
) -> None:
    """A server that does not say whether it forced (vLLM's /version), and a run bench judged
    against an expected AL: a verdict is a forced run's. A server that says it served natural
    acceptance is believed (bench --expect-profile judges a natural run too)."""
    verdict = {"passed": True, "expected_acceptance_length": 3.0}
    run = write_run(tmp_path / "run", natural_requests({"c": 24}), verdict=verdict,
                    server={"version": "0.9"})  # fmt: skip
    _refused(_from_run(run_cli, run), 2, f"{run / 'summary.json'}: verdict: bench judged")
    run = write_run(tmp_path / "natural", natural_requests({"c": 24}), verdict=verdict)
    code, stdout, stderr, _ = _from_run(run_cli, run)
    assert code == 0, stdout + stderr


def test_an_aggregate_only_run_is_refused(run_cli: Any, tmp_path: Path) -> None:
    run = tmp_path / "published"
    run.mkdir()
    summary = {"aggregate_only": True, "settings": {"model": "dummy"},
               "figures": {"latency_ms": {}, "acceptance": {"acceptance_length": 2.5}}}  # fmt: skip
    (run / "summary.json").write_bytes(orjson.dumps(summary))
    _refused(_from_run(run_cli, run), 2, f"{run / 'summary.json'}: aggregate_only: ")


def test_a_run_without_per_request_stats_is_refused(run_cli: Any, tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [record(i, "c", None) for i in range(24)])
    _refused(_from_run(run_cli, run), 2,
             f"{run / 'records.jsonl'}: spec_decode_acceptance: no completed request carried "
             "per-request speculative-decoding stats")  # fmt: skip


def test_a_counts_only_run_is_refused(run_cli: Any, tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [record(i, "c", counts_only(40, 20)) for i in range(24)])
    _refused(_from_run(run_cli, run), 2,
             f"{run / 'records.jsonl'}: spec_decode_acceptance.num_spec_steps: every request "
             "carried counts only (llama.cpp)")  # fmt: skip


def test_a_run_over_its_failure_limit_is_refused(run_cli: Any, tmp_path: Path) -> None:
    failures = {"sent": 30, "failed": 6, "max_rate": 0.05, "exceeded": True}
    run = write_run(tmp_path / "run", natural_requests({"c": 24}), failures=failures)
    _refused(_from_run(run_cli, run), 3,
             f"{run / 'summary.json'}: failures.exceeded: 6 of 30 requests failed (max 5%)")  # fmt: skip


def test_requests_of_several_k_are_refused(run_cli: Any, tmp_path: Path) -> None:
    records = natural_requests({"c": 12}, k=3) + natural_requests({"c": 12}, k=5, seed=9)
    for i, r in enumerate(records):
        r.index = i
    run = write_run(tmp_path / "run", records)
    _refused(_from_run(run_cli, run), 2,
             f"{run / 'records.jsonl'}: spec_decode_acceptance.num_spec_tokens: the requests "
             "report K 3, 5")  # fmt: skip


def test_a_server_that_states_no_hardware_needs_the_option(run_cli: Any, tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", natural_requests({"c": 24}), hardware=None)
    _refused(_from_run(run_cli, run), 2, f"{run / 'summary.json'}: server.hardware: not stated")
    code, stdout, stderr, out = _from_run(run_cli, run, "--hardware", "h100")
    assert code == 0, stdout + stderr
    (profile,) = load(AcceptanceProfileSet, out).profiles
    assert profile.provenance is not None and profile.provenance.hardware == "h100"


def test_a_histogram_that_contradicts_its_steps_is_refused_by_the_row_reader(
    run_cli: Any, tmp_path: Path
) -> None:
    run = write_run(tmp_path / "run", natural_requests({"c": 24}))
    lines = (run / "records.jsonl").read_bytes().splitlines()
    row = orjson.loads(lines[3])
    row["spec_decode_acceptance"]["acceptance_histogram"] = {"0": 1}
    lines[3] = orjson.dumps(row)
    (run / "records.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    _refused(_from_run(run_cli, run), 1,
             f"{run / 'records.jsonl'}: line 4: spec_decode_acceptance: not a valid acceptance "
             "record")  # fmt: skip


def test_five_requests_give_a_profile_without_a_spread_and_say_so(
    run_cli: Any, tmp_path: Path
) -> None:
    run = write_run(tmp_path / "run", natural_requests({"c": 5}))
    code, stdout, stderr, out = _from_run(run_cli, run)
    assert code == 0, stdout + stderr
    (profile,) = load(AcceptanceProfileSet, out).profiles
    assert profile.spread is None
    assert "profiles from-run: c: no spread: 5 requests, fewer than the 20 a spread needs" in stderr
    assert "(1 measured profiles, 0 with a spread)" in stdout


def test_a_request_claiming_steps_without_a_histogram(run_cli: Any, tmp_path: Path) -> None:
    """Its AL is known from its counts, so it counts in the spread; its own variance is not,
    so the summary's within-request variance is unknown, and says why."""
    records = natural_requests({"c": 24})
    records.append(record(24, "c", spec(None, 3, steps=50, accepted=140)))
    run = write_run(tmp_path / "run", records)
    block = orjson.loads((run / "summary.json").read_bytes())["figures"]["acceptance"][
        "per_request"
    ]
    assert block["without_histogram"] == 1 and block["variance"]["within"] is None
    code, stdout, stderr, out = _from_run(run_cli, run)
    assert code == 0, stdout + stderr
    (profile,) = load(AcceptanceProfileSet, out).profiles
    assert profile.spread is not None and profile.spread.requests == 25
    assert profile.spread.quantiles == {n: round(q, 4) for n, q in block["quantiles"].items()}


def test_an_invalid_category_name_is_a_usage_error(run_cli: Any, tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", natural_requests({"c": 24}))
    _refused(_from_run(run_cli, run, "--category", "Spec Bench"), 2,
             "command line: --category: expected lower-case letters")  # fmt: skip
