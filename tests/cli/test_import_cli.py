"""``speclens import inferencex`` and ``speclens import vllm`` end to end: on small published
files built here, and on InferenceX's published files where ``../shared/data/inferencex/`` is
present."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from publishedkit import (
    INFERENCEX_DIR,
    metrics,
    point,
    vllm_result,
    write_points,
    write_vllm,
)


@pytest.fixture
def published_files(tmp_path: Path) -> list[Path]:
    """A latest file and a history file sharing one point (the history copy without means)."""
    history = [point(conc=4, metrics=metrics(full=False)), point(conc=16, date="2026-05-19"),
               point(conc=4, spec_method="mtp", date="2026-05-21")]  # fmt: skip
    del history[0]["image"]
    latest = [point(conc=4), point(conc=8), point(conc=64),
              point(conc=16, spec_method="mtp", date="2026-05-21")]  # fmt: skip
    return [write_points(tmp_path / "latest.json", latest),
            write_points(tmp_path / "history.json", history)]  # fmt: skip


def test_import_writes_one_sweep_per_configuration(run_cli, published_files, tmp_path):
    out = tmp_path / "out"
    code, stdout, stderr = run_cli("import", "inferencex", *published_files, "--output-dir", out)
    assert code == 0, stderr
    assert stdout.splitlines() == [
        "dsr1-mi355x-sglang-fp8-1024x1024-tp8-mtp-2026-05-21: 2 points (concurrency 4, 16)",
        "dsr1-mi355x-sglang-fp8-1024x1024-tp8-nomtp-2026-05-19: 1 point (concurrency 16)",
        "dsr1-mi355x-sglang-fp8-1024x1024-tp8-nomtp-2026-05-27: 3 points (concurrency 4, 8, 64)",
        f"imported 3 configurations, 6 points (of 7 read, 1 duplicate merged) into {out}",
    ]
    sweep = out / "dsr1-mi355x-sglang-fp8-1024x1024-tp8-nomtp-2026-05-27"
    doc = json.loads((sweep / "sweep.json").read_text())
    assert [p["id"] for p in doc["points"]] == ["c4", "c8", "c64"]
    summary = json.loads((sweep / "points" / "c4" / "summary.json").read_text())
    assert summary["aggregate_only"] is True and summary["settings"]["model"] == "deepseek-r1"
    assert summary["figures"]["latency_ms"]["tpot"]["mean"] == pytest.approx(10.5)  # merged copy
    assert not (sweep / "points" / "c4" / "records.jsonl").exists()
    mtp = json.loads((out / "dsr1-mi355x-sglang-fp8-1024x1024-tp8-mtp-2026-05-21" / "points" / "c4"
                      / "summary.json").read_text())  # fmt: skip
    assert (mtp["settings"]["method"], mtp["settings"]["num_spec_tokens"]) == ("mtp", 3)


def test_where_keeps_the_matching_points(run_cli, published_files, tmp_path):
    out = tmp_path / "out"
    code, stdout, _ = run_cli("import", "inferencex", *published_files, "--output-dir", out,
                              "--where", "spec_method=none", "--where", "date=2026-05-27",
                              "--where", "conc=4", "--where", "conc=64")  # fmt: skip
    assert code == 0
    assert stdout.splitlines()[0] == "dsr1-mi355x-sglang-fp8-1024x1024-tp8-nomtp-2026-05-27: 2 points (concurrency 4, 64)"  # fmt: skip
    assert [p.name for p in out.iterdir()] == [
        "dsr1-mi355x-sglang-fp8-1024x1024-tp8-nomtp-2026-05-27"
    ]


def test_a_filter_that_matches_nothing_writes_nothing(run_cli, published_files, tmp_path):
    out = tmp_path / "out"
    code, stdout, stderr = run_cli("import", "inferencex", *published_files, "--output-dir", out,
                                   "--where", "hardware=h100")  # fmt: skip
    assert code == 1 and stdout == ""
    assert stderr.splitlines() == ["command line: --where hardware=h100: no point matches (6 published points read from 2 file(s))"]  # fmt: skip
    assert not out.exists()


def test_an_unknown_where_key_is_a_usage_error(run_cli, published_files, tmp_path):
    out = tmp_path / "out"
    code, _, stderr = run_cli("import", "inferencex", *published_files, "--output-dir", out,
                              "--where", "chip=mi355x")  # fmt: skip
    assert code == 2 and len(stderr.splitlines()) == 1
    assert "unknown key 'chip': expected one of hardware, framework, model" in stderr
    assert not out.exists()


def test_an_existing_configuration_directory_is_refused(run_cli, published_files, tmp_path):
    out = tmp_path / "out"
    existing = out / "dsr1-mi355x-sglang-fp8-1024x1024-tp8-nomtp-2026-05-19"
    existing.mkdir(parents=True)
    code, _, stderr = run_cli("import", "inferencex", *published_files, "--output-dir", out)
    assert code == 2
    assert stderr.splitlines() == [f"{existing}: the configuration directory exists: expected a new directory (choose another --output-dir)"]  # fmt: skip
    assert [p.name for p in out.iterdir()] == [existing.name]


def test_import_vllm_writes_one_run(run_cli, tmp_path):
    source = write_vllm(tmp_path / "result.json", vllm_result())
    out = tmp_path / "run"
    code, stdout, stderr = run_cli("import", "vllm", source, "--output-dir", out, "--gpus", "2",
                                   "--hardware", "h100")  # fmt: skip
    assert code == 0, stderr
    assert stdout.strip() == f"imported smollm2 (concurrency 2) into {out}"
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["gpus"] == 2 and summary["settings"]["hardware"] == "h100"
    assert summary["figures"]["throughput"]["output_tokens_per_s_per_gpu"] == 16.0
    assert summary["provenance"] == {"source": "vllm", "run_url": None, "file": str(source),
                                     "index": None, "label": None, "tokenizer_id": "/models/smollm2"}  # fmt: skip
    code, _, stderr = run_cli("import", "vllm", source, "--output-dir", out)
    assert (
        code == 2 and stderr.strip() == f"{out}: exists and is not empty: expected a new directory"
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--gpus", "0"], "command line: --gpus: expected an integer in [1, 4096], got 0"),
        (["--hardware", "a/b"], "command line: --hardware: expected a chip name"),
    ],
)
def test_import_vllm_usage_errors(run_cli, tmp_path, flags, message):
    source = write_vllm(tmp_path / "result.json", vllm_result())
    code, _, stderr = run_cli("import", "vllm", source, "--output-dir", tmp_path / "run", *flags)
    assert code == 2 and stderr.startswith(message)
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------- InferenceX's published files
needs_data = pytest.mark.skipif(
    not (INFERENCEX_DIR / "benchmarks.json").is_file(),
    reason="InferenceX's published data (../shared/data/inferencex/) is not present",
)


@needs_data
def test_the_published_mi355x_sglang_fp8_configurations(run_cli, tmp_path):
    out = tmp_path / "out"
    filters = ["hardware=mi355x", "framework=sglang", "precision=fp8", "isl=1024", "osl=1024",
               "decode_tp=8"]  # fmt: skip
    code, stdout, stderr = run_cli(
        "import", "inferencex", INFERENCEX_DIR / "benchmarks.json",
        INFERENCEX_DIR / "benchmarks-history.json", "--output-dir", out,
        *(arg for f in filters for arg in ("--where", f)),
    )  # fmt: skip
    assert code == 0, stderr
    lines = stdout.splitlines()
    assert "dsr1-mi355x-sglang-fp8-1024x1024-tp8-nomtp-2026-05-27: 4 points (concurrency 4, 8, 16, 64)" in lines  # fmt: skip
    assert "dsr1-mi355x-sglang-fp8-1024x1024-tp8-mtp-2026-05-21: 4 points (concurrency 4, 16, 32, 64)" in lines  # fmt: skip
    mtp = out / "dsr1-mi355x-sglang-fp8-1024x1024-tp8-mtp-2026-05-21"
    doc = json.loads((mtp / "sweep.json").read_text())
    assert [p["settings"]["concurrency"] for p in doc["points"]] == [4, 16, 32, 64]
    summary = json.loads((mtp / "points" / "c4" / "summary.json").read_text())
    assert summary["settings"]["num_spec_tokens"] == 3 and summary["settings"]["gpus"] == 8
    assert summary["provenance"]["run_url"].startswith("https://github.com/SemiAnalysisAI/InferenceX/actions/runs/")  # fmt: skip
    # per GPU x GPUs is the deployment, and it is about concurrency x interactivity (closed loop)
    t, per_user = summary["figures"]["throughput"], summary["figures"]["interactivity"]["p50"]
    assert t["output_tokens_per_s"] == pytest.approx(8 * t["output_tokens_per_s_per_gpu"])
    assert t["output_tokens_per_s"] == pytest.approx(4 * per_user, rel=0.35)
