"""``speclens import`` against what round 5 found: a SIGTERM or SIGHUP part way (finished
configurations and a hidden stage were left behind, and the next import refused the directory),
numbers too long to convert (a traceback), a value nested deep enough to break the summary's
writer, a small input that made a summary.json over the run reader's bound, an AL no reader
takes, and a field that compare then refused. Each is refused in one line naming the file and
the field (exit 1), or interrupted in one line (exit 130), and nothing is left written."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import launch
from publishedkit import point, refused, vllm_result, write_points, write_vllm
from speclens.runs import published, published_read, rundir
from speclens.runs.record import MAX_COUNT
from speclens.runs.rundir import InputError

PY = sys.executable


def raw_points(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def with_number(obj: dict, key: str, literal: str) -> str:
    """``obj`` as JSON with ``key``'s value replaced by the bare ``literal``."""
    marker = "__number__"
    text = json.dumps(obj | {key: marker})
    return text.replace(f'"{marker}"', literal)


# ---------------------------------------------------------------- 1. SIGTERM and SIGHUP
def many_configurations(path: Path, n: int) -> Path:
    """``n`` configurations of one point each (input lengths 1000, 1001, ...): a few seconds of
    writing, long enough to be signalled part way."""
    return write_points(path, [point(isl=1000 + i) for i in range(n)])


def finished(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) if out.is_dir() else []  # fmt: skip


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_part_way_leaves_nothing_and_the_import_can_run_again(run_cli, tmp_path, sig):
    """A real ``python -m speclens import`` process, signalled once two configurations are
    written: it exits 130 in one line, removes them and its hidden stage, and the same import
    into the same directory then succeeds."""
    source = many_configurations(tmp_path / "bench.json", 200)
    out = tmp_path / "out"
    command = [PY, "-m", "speclens", "import", "inferencex", str(source), "--output-dir", str(out)]
    with (tmp_path / "stdout").open("wb") as so, (tmp_path / "stderr").open("wb") as se:
        # its signals at their defaults, as a shell starts a command
        proc = subprocess.Popen(command, stdout=so, stderr=se, preexec_fn=launch.default_signals)
    try:
        deadline = time.monotonic() + 120
        while len(finished(out)) < 2:
            assert proc.poll() is None, (tmp_path / "stderr").read_text()[-2000:]
            assert time.monotonic() < deadline, "no configuration was written in 120 s"
            time.sleep(0.05)
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = (tmp_path / "stderr").read_text()
    assert code == 130, err[-2000:]
    assert err.splitlines() == [
        f"import inferencex: interrupted ({signal.Signals(sig).name}): nothing written"
    ]
    assert not out.exists(), sorted(p.name for p in out.iterdir())  # no sweep, no .partial
    first = published_read.configuration_name(point(isl=1000))
    code, stdout, stderr = run_cli("import", "inferencex", source, "--output-dir", out,
                                   "--where", "isl=1000", "--where", "isl=1001")  # fmt: skip
    assert code == 0, stderr
    assert stdout.splitlines()[0] == f"{first}: 1 point (concurrency 4)"
    assert len(finished(out)) == 2


def test_a_sweep_written_before_the_interrupt_is_removed(tmp_path, monkeypatch):
    """Ctrl-C (as the handler raises it) right after a sweep was renamed into place, before the
    writer noted it as written: that sweep is removed too."""
    out = tmp_path / "out"
    summaries = [published_read.inferencex_summary(p) for p in published_read.read_inferencex(
        write_points(tmp_path / "b.json", [point()]))]  # fmt: skip
    real = published.write_sweep
    calls = []

    def then_interrupted(target, points, *rest):
        real(target, points, *rest)
        calls.append(target)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(published, "write_sweep", then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        published.write_sweeps(out, {"a": summaries, "b": summaries, "c": summaries})
    assert not out.exists()


@pytest.mark.parametrize("after", [1, 3], ids=["part-way", "after-the-last"])
def test_a_signal_whose_interrupt_was_lost_still_leaves_nothing(tmp_path, after):
    """A signal arrived, but its KeyboardInterrupt was raised inside a finalizer, where Python
    prints and drops it: the writer asks after each sweep, and still removes everything."""
    out = tmp_path / "out"
    summaries = [published_read.inferencex_summary(p) for p in published_read.read_inferencex(
        write_points(tmp_path / "b.json", [point()]))]  # fmt: skip
    written = []

    def stopped():
        written.append(1)
        return len(written) >= after

    with pytest.raises(KeyboardInterrupt):
        published.write_sweeps(out, {"a": summaries, "b": summaries, "c": summaries}, stopped)
    assert not out.exists()


@pytest.mark.parametrize("during", ["stage", "sweep"])
def test_a_second_interrupt_does_not_cut_the_clean_up_short(tmp_path, monkeypatch, during):
    """A write fails part way, and a Ctrl-C arrives as the clean-up removes the failed sweep's
    hidden stage, or a sweep already written: the clean-up still removes everything, then the
    Ctrl-C is delivered."""
    out = tmp_path / "out"
    (summary,) = [published_read.inferencex_summary(p) for p in published_read.read_inferencex(
        write_points(tmp_path / "b.json", [point()]))]  # fmt: skip
    real, interrupted = published._remove, []

    def interrupting(path):
        if not interrupted and path.name.startswith(".") == (during == "stage"):
            interrupted.append(path)
            signal.raise_signal(signal.SIGINT)
        real(path)

    monkeypatch.setattr(published, "_remove", interrupting)
    with pytest.raises(KeyboardInterrupt):  # concurrency 4 twice: the third sweep fails
        published.write_sweeps(out, {"a": [summary], "b": [summary], "c": [summary] * 2})
    assert interrupted and not out.exists()


# ------------------------------------------------------------------- 2. numbers too long
@pytest.mark.parametrize(
    ("key", "literal", "expected"),
    [
        ("conc", "9" * 5000, "[0].conc: expected an integer >= 1, got an integer of 5,000 digits"),
        ("conc", str(2**63), f"[0].conc: expected an integer >= 1, got {2**63}"),
        ("isl", "1" + "0" * 399, "[0].isl: expected an integer >= 1, got 1000000000"),
        ("extra", "-" + "7" * 4400, "[0].extra: expected a number of at most 400 digits, got an integer of 4,400 digits"),
    ],
    ids=["conc-5000-digits", "conc-past-the-count-bound", "isl-400-digits", "extra-key-4400-digits"],
)  # fmt: skip
def test_an_integer_too_long_for_any_field(run_cli, tmp_path, key, literal, expected):
    source = raw_points(tmp_path / "bench.json", "[" + with_number(point(), key, literal) + "]")
    line = refused(run_cli, ["import", "inferencex", source], tmp_path / "out")
    assert line.startswith(f"{source}: {expected}")


def test_a_401_digit_median_tpot(run_cli, tmp_path):
    metrics = json.loads(json.dumps(point()["metrics"]))
    text = json.dumps(point() | {"metrics": "__m__"}).replace('"__m__"', with_number(metrics, "median_tpot", "9" * 401))  # fmt: skip
    source = raw_points(tmp_path / "bench.json", f"[{text}]")
    line = refused(run_cli, ["import", "inferencex", source], tmp_path / "out")
    assert line == f"{source}: [0].metrics.median_tpot: expected seconds > 0, got an integer of 401 digits"  # fmt: skip


@pytest.mark.parametrize(
    ("key", "literal", "expected"),
    [
        ("duration", "9" * 401, "duration: expected seconds > 0, got an integer of 401 digits"),
        ("duration", "9" * 350, "duration: expected seconds > 0, got 9999"),
        ("completed", "9" * 5000, "completed: expected an integer >= 1 (requests that finished), got an integer of 5,000 digits"),
    ],
    ids=["duration-401-digits", "duration-past-a-float", "completed-5000-digits"],
)  # fmt: skip
def test_a_vllm_number_too_long(run_cli, tmp_path, key, literal, expected):
    source = raw_points(tmp_path / "result.json", with_number(vllm_result(), key, literal))
    line = refused(run_cli, ["import", "vllm", source], tmp_path / "out")
    assert line.startswith(f"{source}: {expected}")


def test_the_digit_bound_is_past_every_count_and_float():
    assert published_read.MAX_INT_DIGITS == 400
    assert len(str(MAX_COUNT)) < published_read.MAX_INT_DIGITS
    assert len(str(int(sys.float_info.max))) < published_read.MAX_INT_DIGITS


# ---------------------------------------------------------------------- 3. nested depth
def nested(depth: int) -> object:
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


def test_an_extra_key_nested_900_deep(run_cli, tmp_path):
    source = write_points(tmp_path / "bench.json", [point(), point(conc=8, extra=nested(900))])
    line = refused(run_cli, ["import", "inferencex", source], tmp_path / "out")
    assert line == (f"{source}: [1].extra[0][0][0][0][0][0][0]...(depth 33): nested deeper than "
                    f"{published_read.MAX_DEPTH} levels: expected at most {published_read.MAX_DEPTH}")  # fmt: skip


def test_a_vllm_key_nested_900_deep(run_cli, tmp_path):
    source = write_vllm(tmp_path / "result.json", vllm_result(extra={"a": nested(900)}))
    line = refused(run_cli, ["import", "vllm", source], tmp_path / "out")
    assert line.startswith(f"{source}: extra.a[0][0][0][0][0][0]...(depth 33): nested deeper than 32")  # fmt: skip


def test_nesting_up_to_the_bound_is_read(run_cli, tmp_path):
    """A point is depth 1: an extra key may hold MAX_DEPTH - 1 levels of lists."""
    depth = published_read.MAX_DEPTH - 1
    ok = write_points(tmp_path / "ok.json", [point(extra=nested(depth))])
    code, _, stderr = run_cli("import", "inferencex", ok, "--output-dir", tmp_path / "out")
    assert code == 0, stderr
    deep = write_points(tmp_path / "deep.json", [point(extra=nested(depth + 1))])
    line = refused(run_cli, ["import", "inferencex", deep], tmp_path / "out2")
    assert "nested deeper than 32 levels" in line
    assert published_read.MAX_DEPTH == 32


# ------------------------------------------------------------- 4. the summary's own size
def test_a_small_input_cannot_make_a_summary_past_the_readers_bound(run_cli, tmp_path):
    """2.6 MB of a point's unknown key, 30 lists deep (within MAX_DEPTH): copied whole into
    provenance.published and indented, it made a summary.json over 64 MiB. The summary keeps the
    published keys and the metrics it is built from, nothing else."""
    big = point(extra=nested(29))
    inner = big["extra"]
    while isinstance(inner[0], list):
        inner = inner[0]
    inner.extend([0] * 1_300_000)
    source = raw_points(tmp_path / "bench.json", json.dumps([big], separators=(",", ":")))
    assert 2.5e6 < source.stat().st_size < 2.8e6
    out = tmp_path / "out"
    code, _, stderr = run_cli("import", "inferencex", source, "--output-dir", out)
    assert code == 0, stderr
    (summary_path,) = out.glob("*/points/c4/summary.json")
    assert summary_path.stat().st_size < 64 * 2**10
    record = json.loads(summary_path.read_text())["provenance"]["published"]
    assert "extra" not in record
    assert {k: record[k] for k in ("hardware", "model", "conc", "isl", "run_url")} == {
        k: big[k] for k in ("hardware", "model", "conc", "isl", "run_url")}  # fmt: skip
    assert record["metrics"]["median_tpot"] == big["metrics"]["median_tpot"]
    assert set(record["metrics"]) <= set(published_read.PUBLISHED_METRICS)


def test_the_writer_refuses_a_summary_over_the_readers_bound(tmp_path, monkeypatch):
    (summary,) = [published_read.inferencex_summary(p) for p in published_read.read_inferencex(
        write_points(tmp_path / "b.json", [point()]))]  # fmt: skip
    monkeypatch.setattr(published, "MAX_FILE_BYTES", 1000)
    with pytest.raises(InputError) as caught:
        published.write_point(tmp_path / "run", summary)
    (line,) = caught.value.lines
    assert (
        line.startswith(f"{tmp_path / 'run'}: summary.json: ") and "expected at most 1,000" in line
    )
    assert caught.value.code == 1 and not (tmp_path / "run").exists()
    with pytest.raises(InputError, match="expected at most 1,000"):
        published.write_sweeps(tmp_path / "sweeps", {"a": [summary]})
    assert not (tmp_path / "sweeps").exists()


# ------------------------------------------------------------------- 5. AL and its rates
AL = "spec_decode_acceptance_length"
RATES = "spec_decode_per_position_acceptance_rates"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({AL: 50.0, RATES: [0.6, 0.3, 0.1]}, f"{AL}: expected null or an AL in [1, 4] (K = 3, the per-position rates' count), got 50.0"),
        ({AL: 50.0, RATES: [0.5, 0.7, 0.9]}, f"{RATES}: expected rates that never rise with the position (rises at position 2 (0.7 > 0.5)), got [0.5, 0.7, 0.9]"),
        ({AL: 2.0, RATES: [0.2, 0.1, 0.0]}, f"{RATES}: expected rates summing to {AL} - 1 (they sum to 0.3, but acceptance length 2 needs 1"),
        ({AL: 66.0}, f"{AL}: expected null or an AL in [1, 65] (K at most 64), got 66.0"),
        ({AL: 0.5, RATES: [0.1]}, f"{AL}: expected null or an AL in [1, 2] (K = 1, the per-position rates' count), got 0.5"),
    ],
    ids=["al-50-at-k-3", "rising-rates", "rates-not-summing-to-al", "al-past-any-k", "al-below-1"],
)  # fmt: skip
def test_an_al_no_reader_takes(run_cli, tmp_path, change, expected):
    source = write_vllm(tmp_path / "result.json", vllm_result(**change))
    line = refused(run_cli, ["import", "vllm", source], tmp_path / "out")
    assert line.startswith(f"{source}: {expected}")


def test_a_consistent_al_and_rates_are_taken(run_cli, tmp_path):
    source = write_vllm(tmp_path / "result.json", vllm_result(**{AL: 1.9, RATES: [0.6, 0.3, 0.0]}))
    code, _, stderr = run_cli("import", "vllm", source, "--output-dir", tmp_path / "out")
    assert code == 0, stderr
    figures = json.loads((tmp_path / "out" / "summary.json").read_text())["figures"]
    assert figures["acceptance"]["acceptance_length"] == 1.9
    assert figures["acceptance"]["num_spec_tokens"] == 3


# ------------------------------------------------------------------ 6. what readers take
@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"method": "m" * 1000}, "method: expected null or the speculative method's name (text of at most 256 characters), got 'mmmm"),
        ({"method": ""}, "method: expected null or the speculative method's name"),
        ({"method": 3}, "method: expected null or the speculative method's name"),
        ({"burstiness": -1.0}, "burstiness: expected null or a number > 0, got -1.0"),
        ({"spec_decode_acceptance_rate": 250.0}, "spec_decode_acceptance_rate: expected null or a percentage in [0, 100], got 250.0"),
    ],
    ids=["method-1000-characters", "method-empty", "method-a-number", "negative-burstiness", "rate-over-100-percent"],
)  # fmt: skip
def test_a_vllm_field_readers_refuse(run_cli, tmp_path, change, expected):
    source = write_vllm(tmp_path / "result.json", vllm_result(**change))
    line = refused(run_cli, ["import", "vllm", source], tmp_path / "out")
    assert line.startswith(f"{source}: {expected}")


def test_a_summary_field_readers_refuse_is_never_written(run_cli, tmp_path):
    """Each published count is within the bound, but a disaggregated point's GPUs (prefill plus
    decode) are past what any run reader takes: refused before anything is written, by the
    readers' own check (``rundir.aggregate_problems``)."""
    half = 2**62
    bad = point(conc=8, disagg=True, num_prefill_gpu=half, num_decode_gpu=half)
    source = write_points(tmp_path / "bench.json", [point(), bad])
    line = refused(run_cli, ["import", "inferencex", source], tmp_path / "out")
    assert line == (f"{source}: [1]: settings.gpus: expected null or an integer > 0, got "
                    f"{2 * half} (in the summary made from it)")  # fmt: skip


def test_every_imported_summary_is_read_back_by_the_run_reader(run_cli, tmp_path):
    inferencex = write_points(tmp_path / "bench.json", [point(), point(conc=8, spec_method="mtp"),
                                                        point(conc=16, model="gptoss120b")])  # fmt: skip
    vllm = write_vllm(tmp_path / "result.json", vllm_result(
        method="ngram", **{AL: 1.9, RATES: [0.6, 0.3, 0.0]}))  # fmt: skip
    assert run_cli("import", "inferencex", inferencex, "--output-dir", tmp_path / "ix")[0] == 0
    assert run_cli("import", "vllm", vllm, "--output-dir", tmp_path / "v")[0] == 0
    runs = [p.parent for p in tmp_path.glob("ix/*/points/*/summary.json")] + [tmp_path / "v"]
    assert len(runs) == 4
    for run in runs:
        read = rundir.read_run(run, rundir.fields([]), lambda s: dict(s))
        assert read.aggregate_only and read.summary["settings"]["model"]
